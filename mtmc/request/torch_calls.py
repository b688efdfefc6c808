"""Phase 0 of reading a request: PyTorch calls written as code, rewritten into the words the op
phases read.

"nn.Conv2d(3, 64, kernel_size=3, padding=1) on 8x3x224x224" -> "conv2d with 3 in and 64 out
channels, kernel 3, padding 1, with bias on 8x3x224x224"; "F.max_pool2d(x, 2)", "nn.GroupNorm(32,
256)", "torch.cumsum(x, dim=1)", "x.cumprod(-1)", "F.cross_entropy(logits, y)",
"F.scaled_dot_product_attention(q, k, v, is_causal=True)" likewise.  Each call is read against
its PyTorch signature (positional arguments in PyTorch's order, keywords by name), so what the
user wrote means what PyTorch means by it.  A call with an argument the words cannot say (a
normalized_shape of several dims, a tensor mask) is left as written, and the later phases say
what they make of it.  Calls the formula phase reads itself (softmax, layer_norm, relu, linear
...) are not touched.  Works on the lowercased request; plain `re`, no other phase imported.
"""
from __future__ import annotations

import re

_PREFIX = r"(?<![\w.])(?:torch\.nn\.functional\.|nn\.functional\.|torch\.nn\.|torch\.|nn\.|f\.)?"
_METHOD = r"(?<![\w.])(?P<recv>[a-z_][a-z0-9_]*)\."   # x.cumsum(-1)

# name -> PyTorch's positional parameters (module constructors; for functionals, after the input)
_CONV = ["in", "out", "kernel_size", "stride", "padding", "dilation", "groups", "bias", "padding_mode"]
_CONV_T = ["in", "out", "kernel_size", "stride", "padding", "output_padding", "groups", "bias", "dilation"]
_MAXPOOL = ["kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode"]
_MAXPOOL_F = ["kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"]
_AVGPOOL = ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"]
# losses take their settings by keyword only here (their positional order mixes deprecated ones)
_LOSS_KEYWORDS = ["reduction", "margin", "delta", "beta", "label_smoothing", "log_target", "p", "ignore_index",
                  "weight", "size_average", "reduce", "swap", "eps", "dim"]
_KEYWORDS_ONLY = [None, *_LOSS_KEYWORDS]   # None first: no positional argument binds
_MODULES = {
    **{f"conv{r}d": ("conv", _CONV) for r in (1, 2, 3)},
    **{f"convtranspose{r}d": ("conv_t", _CONV_T) for r in (1, 2, 3)},
    **{f"maxpool{r}d": ("max_pool", _MAXPOOL) for r in (1, 2, 3)},
    **{f"avgpool{r}d": ("avg_pool", _AVGPOOL) for r in (1, 2, 3)},
    **{f"adaptive{k}pool{r}d": (f"adaptive_{k}_pool", ["output_size", "return_indices"])
       for k in ("avg", "max") for r in (1, 2, 3)},
    "layernorm": ("layer_norm", ["normalized_shape", "eps", "elementwise_affine", "bias"]),
    "rmsnorm": ("rms_norm", ["normalized_shape", "eps", "elementwise_affine"]),
    "groupnorm": ("group_norm", ["num_groups", "num_channels", "eps", "affine"]),
    **{f"batchnorm{r}d": ("batch_norm", ["num_features", "eps", "momentum", "affine", "track_running_stats"])
       for r in (1, 2, 3)},
    **{f"instancenorm{r}d": ("instance_norm", ["num_features", "eps", "momentum", "affine", "track_running_stats"])
       for r in (1, 2, 3)},
    "softmax": ("softmax", ["dim"]), "logsoftmax": ("log_softmax", ["dim"]),
    **{f"{name}loss": (f"{name}_loss", _KEYWORDS_ONLY) for name in (
        "crossentropy", "mse", "l1", "smoothl1", "huber", "kldiv", "tripletmargin", "hingeembedding",
        "cosineembedding")},
}
_LOSS_ARGS = {"cross_entropy": 2, "mse_loss": 2, "l1_loss": 2, "smooth_l1_loss": 2, "huber_loss": 2, "kl_div": 2,
              "triplet_margin_loss": 3, "hinge_embedding_loss": 2, "cosine_embedding_loss": 3,
              "cosine_similarity": 2}
_FUNCTIONS = {   # functional name -> (kind, parameters after the input tensor(s))
    **{f"max_pool{r}d": ("max_pool", _MAXPOOL_F) for r in (1, 2, 3)},
    **{f"avg_pool{r}d": ("avg_pool", _AVGPOOL) for r in (1, 2, 3)},
    **{f"adaptive_{k}_pool{r}d": (f"adaptive_{k}_pool", ["output_size", "return_indices"])
       for k in ("avg", "max") for r in (1, 2, 3)},
    "normalize": ("normalize", ["p", "dim", "eps"]),
    # the functional channel norms: their channels come from the input's shape, the affine from a weight
    "group_norm": ("group_norm_f", ["num_groups", "weight", "bias", "eps"]),
    "batch_norm": ("batch_norm_f", ["running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"]),
    "instance_norm": ("instance_norm_f", ["running_mean", "running_var", "weight", "bias", "use_input_stats",
                                          "momentum", "eps"]),
    "cumsum": ("cumsum", ["dim"]), "cumprod": ("cumprod", ["dim"]),
    "logsumexp": ("logsumexp", ["dim", "keepdim"]),
    "scaled_dot_product_attention": ("sdpa", ["attn_mask", "dropout_p", "is_causal", "scale"]),
    "triplet_margin_loss": ("triplet_margin_loss", ["margin", "p", *_LOSS_KEYWORDS]),
    "hinge_embedding_loss": ("hinge_embedding_loss", ["margin", *_LOSS_KEYWORDS]),
    "cosine_embedding_loss": ("cosine_embedding_loss", ["margin", *_LOSS_KEYWORDS]),
    "cosine_similarity": ("cosine_similarity", ["dim", *_LOSS_KEYWORDS]),
    **{name: (name, _KEYWORDS_ONLY) for name in ("cross_entropy", "kl_div", "mse_loss", "l1_loss", "smooth_l1_loss",
                                                 "huber_loss")},
}
_METHODS = {"cumsum", "cumprod", "logsumexp"}   # x.cumsum(dim)


class _Unsaid(Exception):
    """An argument the words cannot carry: the call stays as written."""


_CALL = re.compile(rf"{_PREFIX}(?P<name>{'|'.join(sorted({*_MODULES, *_FUNCTIONS}, key=len, reverse=True))})\s*\("
                   rf"|{_METHOD}(?P<meth>{'|'.join(_METHODS)})\s*\(")


def rewrite_calls(text: str) -> str:
    """`text` (lowercased) with every PyTorch call this module knows replaced by its words."""
    out, pos = [], 0
    for m in _CALL.finditer(text):
        if m.start() < pos:
            continue
        end = closing(text, m.end())
        if end is None:
            continue
        args = _split_args(text[m.end():end - 1])
        try:
            words = _words(m.group("name"), m.group("meth"), m.group("recv"), args)
        except _Unsaid:
            continue
        if words is None:
            continue
        out += [text[pos:m.start()], words]
        pos = end
    return "".join(out) + text[pos:]


_PARENS_AND_BRACKETS = {"(": 1, ")": -1, "[": 1, "]": -1}


def closing(text: str, start: int, depths: dict = _PARENS_AND_BRACKETS) -> int | None:
    """The index just past the bracket closing the one open before `start` (None if it never
    closes); `depths` says which characters open (+1) and close (-1)."""
    depth, i = 1, start
    while i < len(text) and depth:
        depth += depths.get(text[i], 0)
        i += 1
    return i if depth == 0 else None


def _split_args(inner: str) -> tuple[list[str], dict[str, str]]:
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    pos, kw = [], {}
    for p in (p.strip() for p in parts):
        if not p:
            continue
        k = re.fullmatch(r"([a-z_]\w*)\s*=\s*(.+)", p, re.S)
        if k:
            kw[k.group(1)] = k.group(2).strip()
        else:
            pos.append(p)
    return pos, kw


def _bind(params: list, pos: list[str], kw: dict[str, str]) -> dict[str, str]:
    if params[:1] == [None]:   # keywords only
        if pos:
            raise _Unsaid
        params = params[1:]
    if len(pos) > len(params) or any(k not in params for k in kw):
        raise _Unsaid   # not PyTorch's signature as this module knows it
    return {**dict(zip(params, pos)), **kw}


def _size(v: str) -> str:
    """'3' -> '3', '(3, 5)' / '[3,5]' -> '3x5', "'same'" -> 'same'; anything else is unsaid."""
    v = v.strip()
    if re.fullmatch(r"-?\d+", v):
        return v
    t = re.fullmatch(r"[(\[]\s*(\d+(?:\s*,\s*\d+)*)\s*,?\s*[)\]]", v)
    if t:
        return "x".join(re.split(r"\s*,\s*", t.group(1)))
    s = re.fullmatch(r"['\"](same|valid|zeros|reflect|replicate|circular|mean|sum|none|batchmean)['\"]", v)
    if s:
        return s.group(1)
    raise _Unsaid


def _number(v: str) -> str:
    if re.fullmatch(r"-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?", v.strip()):
        return v.strip()
    raise _Unsaid


def _flag(v: str) -> bool:
    if v.strip() in ("true", "1"):
        return True
    if v.strip() in ("false", "0", "none"):
        return False
    raise _Unsaid


def _is_tensor(v: str) -> bool:
    return bool(re.fullmatch(r"[a-z_]\w*", v.strip())) and v.strip() not in ("true", "false", "none")


def _words(name: str | None, method: str | None, receiver: str | None, args) -> str | None:
    pos, kw = args
    if method:                      # x.cumsum(-1)
        kind, params = _FUNCTIONS[method]
        return _render(kind, None, _bind(params, pos, kw))
    module = name in _MODULES and not (pos and _is_tensor(pos[0]))
    if module:
        kind, params = _MODULES[name]
        return _render(kind, name, _bind(params, pos, kw))
    if name not in _FUNCTIONS:
        return None
    kind, params = _FUNCTIONS[name]
    inputs = 3 if kind == "sdpa" else _LOSS_ARGS.get(name, 1)
    if len(pos) < inputs or not all(_is_tensor(p) for p in pos[:inputs]):
        return None                 # not a call on tensors: left to the other phases
    return _render(kind, name, _bind(params, pos[inputs:], kw))


def _rank(name: str) -> str:
    r = re.search(r"([123])d$", name)
    return f" {r.group(1)}d" if r else ""


def _render(kind: str, name: str | None, a: dict[str, str]) -> str:
    w: list[str] = []

    def opt(key: str, label: str, conv=_size) -> None:
        if key in a and a[key].strip() != "none":
            w.append(f"{label} {conv(a[key])}")

    if kind in ("conv", "conv_t"):
        if "in" not in a or "out" not in a or "kernel_size" not in a:
            raise _Unsaid
        op = ("conv_transpose" if kind == "conv_t" else "conv") + _rank(name).strip()
        w.append(f"{op} with {_size(a['in'])} in and {_size(a['out'])} out channels, kernel {_size(a['kernel_size'])}")
        for key, label in (("stride", "stride"), ("padding", "padding"), ("dilation", "dilation"),
                           ("groups", "groups"), ("output_padding", "output padding")):
            opt(key, label)
        if a.get("padding_mode") and _size(a["padding_mode"]) != "zeros":
            w.append(f"padding_mode={_size(a['padding_mode'])}")
        w.append("with bias" if _flag(a.get("bias", "true")) else "without bias")
    elif kind in ("max_pool", "avg_pool"):
        w.append(f"{kind.replace('_', ' ')}{_rank(name)}")
        if "kernel_size" not in a:
            raise _Unsaid
        opt("kernel_size", "kernel")
        opt("stride", "stride")
        opt("padding", "padding")
        opt("dilation", "dilation")
        if _flag(a.get("ceil_mode", "false")):
            w.append("ceil mode")
        if _flag(a.get("return_indices", "false")):
            w.append("with indices")
        if not _flag(a.get("count_include_pad", "true")):
            w.append("not counting padding")
        opt("divisor_override", "divisor")
    elif kind.startswith("adaptive_"):
        w.append(f"{kind.replace('_', ' ')}{_rank(name)} to {_size(a.get('output_size', '1'))}")
        if _flag(a.get("return_indices", "false")):
            w.append("with indices")
    elif kind in ("layer_norm", "rms_norm"):
        shape = _size(a.get("normalized_shape", ""))
        if "x" in shape:
            raise _Unsaid   # several trailing dims: the words have no way to say it
        w.append(f"{kind.replace('_', ' ')}, width {shape}")
        opt("eps", "eps", _number)
        if not _flag(a.get("elementwise_affine", "true")):
            w.append("without affine")
    elif kind in ("group_norm", "batch_norm", "instance_norm"):
        channels = a.get("num_channels") or a.get("num_features")
        if channels is None:
            raise _Unsaid
        groups = f" with {_size(a['num_groups'])} groups and" if kind == "group_norm" else " with"
        w.append(f"{kind.replace('_', ' ')}{groups} {_size(channels)} channels")
        opt("eps", "eps", _number)
        if kind == "batch_norm":
            opt("momentum", "momentum", _number)
        default_affine = "false" if kind == "instance_norm" else "true"
        affine = _flag(a.get("affine", default_affine))
        if affine != (default_affine == "true"):
            w.append("with affine" if affine else "without affine")
    elif kind.endswith("_norm_f"):
        _functional_norm(kind[:-2], a, w)
    elif kind in ("softmax", "log_softmax", "cumsum", "cumprod", "logsumexp"):
        w.append(kind.replace("_", " ") + (f" over dim {_size(a['dim'])}" if "dim" in a else ""))
    elif kind == "normalize":
        p = _number(a.get("p", "2")).rstrip("0").rstrip(".")
        if p not in ("1", "2"):
            raise _Unsaid
        w.append(f"l{p} normalize over dim {_size(a.get('dim', '1'))}")
        opt("eps", "eps", _number)
    elif kind == "sdpa":
        if a.get("attn_mask", "none").strip() != "none":
            raise _Unsaid   # which mask it is: said in words ("boolean mask", "additive mask")
        w.append("scaled dot product attention")
        if _flag(a.get("is_causal", "false")):
            w.append("causal")
        if float(_number(a.get("dropout_p", "0"))) != 0:
            w.append(f"dropout {_number(a['dropout_p'])}")
        opt("scale", "scale", _number)
    else:   # losses: module or functional
        base = kind.replace("_loss", "").replace("_", " ")
        base = {"crossentropy": "cross entropy", "kldiv": "kl div", "smoothl1": "smooth l1",
                "tripletmargin": "triplet margin", "hingeembedding": "hinge embedding",
                "cosineembedding": "cosine embedding"}.get(base, base)
        w.append(base if base == "cosine similarity" else f"{base} loss")
        if any(a.get(k, "none").strip() != "none" for k in ("weight", "size_average", "reduce")) \
                or _flag(a.get("swap", "false")):
            raise _Unsaid   # class weights, deprecated reductions, swap: not in the words
        opt("reduction", "reduction")
        for key, label in (("margin", "margin"), ("delta", "delta"), ("beta", "beta"), ("p", "p"),
                           ("label_smoothing", "label smoothing"), ("ignore_index", "ignore index")):
            opt(key, label, _number)
        if "dim" in a:
            w.append(f"over dim {_size(a['dim'])}")
        if _flag(a.get("log_target", "false")):
            w.append("log target")
    return ", ".join(w) + " "


def _functional_norm(kind: str, a: dict[str, str], w: list[str]) -> None:
    """F.group_norm(x, 8), F.batch_norm(x, rm, rv, training=True), F.instance_norm(x): PyTorch's
    defaults differ from the modules' (no weight: no affine; batch_norm in eval mode)."""
    given = {k: a.get(k, "none").strip() != "none" for k in ("weight", "bias", "running_mean", "running_var")}
    if given["weight"] != given["bias"]:
        raise _Unsaid   # a weight without a bias (or the reverse): the words say both or neither
    if kind == "group_norm":
        if "num_groups" not in a:
            raise _Unsaid
        w.append(f"group norm with {_size(a['num_groups'])} groups")
    elif kind == "batch_norm":
        training = _flag(a.get("training", "false"))
        if not training and not (given["running_mean"] and given["running_var"]):
            raise _Unsaid   # eval mode needs running statistics
        w.append("batch norm " + ("in training mode" if training else "in eval mode"))
        opt_momentum = a.get("momentum", "none").strip()
        if training and opt_momentum != "none":
            w.append(f"momentum {_number(opt_momentum)}")
    else:
        if given["running_mean"] or given["running_var"] or not _flag(a.get("use_input_stats", "true")):
            raise _Unsaid   # running statistics of an instance norm: not in the catalog's words
        w.append("instance norm")
    if "eps" in a:
        w.append(f"eps {_number(a['eps'])}")
    w.append("with affine" if given["weight"] else "without affine")
