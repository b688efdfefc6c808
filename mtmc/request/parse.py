"""Words -> KernelSpec, deterministically (no LLM).

`parse_request("a fused softmax over the rows of a 4096x8192 fp16 tensor")` returns a
ParseResult: the spec, what was recognised, what had to be assumed (stated defaults for a
missing shape or dtype), and a message.  Nothing is guessed silently: an op outside the catalog,
a contradiction, a number it cannot place or an unsupported axis is a failure whose message
says what was understood and what can be asked for.  It never raises.

How a request is read: the text is lowercased, then phases take what they recognise and blank
it out, so every word and number is used once ("rms norm" is not also a "mean"):
  context phrases and clamps -> dtype -> sizes and shapes (request.phrases) -> formulas
  ("relu(x + y)", request.formulas) -> op words -> reduce axis (request.words).
Afterwards no number and no op verb ("add", "scale") may be left over.  The op words give at
most one core op (softmax, rmsnorm, matmul ...) plus pointwise steps (pointwise.py vocabulary);
their order in the text ("after" reverses it) is the chain order; the family's builder
(request.build) turns that into dims and params.  The reading context and its regex building
blocks are request.reading; the ops each family serves are kernels.ops, defined once.

An LLM parser can be added as a fallback behind the same interface: text in, ParseResult out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mtmc.kernels import pointwise
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import KernelSpec, tf32_applies
from mtmc.request.attention_words import build_attention, read_attention
from mtmc.request.build import _BUILDERS, _check_sizes_used, _decide, _x
from mtmc.request.conv_words import build_conv, read_conv
from mtmc.request.extras_words import extras_builder, read_extras
from mtmc.request.pointred_words import build_reduction, read_pointred, reduces_other_dims
from mtmc.request.formulas import _read_formulas
from mtmc.request.pool_words import build_pool, read_pool
from mtmc.request.norm_words import OPS as NORM_WORD_OPS, build_norm, read_norm
from mtmc.request.phrases import _read_context, _read_dtype, _read_sizes
from mtmc.request.reading import MAX_CHARS, _Ctx, _Fail
from mtmc.request.scanloss_words import build_scanloss, read_scanloss
from mtmc.request.words import refuse_unsupported, _check_clauses, _check_leftovers, _check_tensor_count, _read_axis, _read_words


@dataclass
class ParseResult:
    """spec is None when the request could not be served; message then says why."""

    spec: KernelSpec | None
    understood: dict = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    message: str = ""
    alternative: KernelSpec | None = None   # the other reading (the rules', beside the model's)

    @property
    def ok(self) -> bool:
        return self.spec is not None


# -- the entry points -------------------------------------------------------------------------

def parse_request(text: str) -> ParseResult:
    """A request in words -> ParseResult (spec or a plain-words reason). Never raises."""
    if not isinstance(text, str):
        return ParseResult(None, {}, [], "A kernel request must be text.")
    if len(text) > MAX_CHARS:
        return ParseResult(None, {}, [], f"The request is {len(text)} characters long; I read requests of up "
                           f"to {MAX_CHARS}. To optimize a whole model, upload its module file instead.")
    ctx = _Ctx(text)
    try:
        spec = _parse(ctx)
    except _Fail as exc:
        reason = str(exc)
        no_op = reason.startswith("I found no kernel op")
        return ParseResult(None, ctx.understood, ctx.assumptions, _failure_message(reason, ctx.understood, no_op))
    except Exception as exc:  # a bug must not take the chat down; the message says it is one
        return ParseResult(None, ctx.understood, ctx.assumptions,
                           f"Internal parser error ({type(exc).__name__}: {exc}); please rephrase the request.\n"
                           + _CATALOG_LINE)
    return ParseResult(spec, ctx.understood, ctx.assumptions, _success_message(spec, ctx.assumptions))


def _parse(ctx: _Ctx) -> KernelSpec:
    refuse_unsupported(ctx)   # top-k, FFT, backward passes: before a phase reads a piece of them
    _read_context(ctx)
    _read_dtype(ctx)
    read_conv(ctx)   # a convolution's own words (kernel, stride ...)
    read_pool(ctx)   # a pooling's own words (window, stride ...)
    # before the losses' words: "L1 normalization" is a norm, not an L1 loss
    read_norm(ctx)   # batch / group / instance norms, L1 / L2 / Frobenius normalization
    read_pointred(ctx)   # activations with their parameters, logsumexp / prod, lists of dims
    read_scanloss(ctx)   # a scan's or a loss's own words (reverse, reduction, margin ...)
    read_extras(ctx)   # 'along the channel dim'
    read_attention(ctx)   # attention's own words (causal, heads, head dim ...)
    _read_sizes(ctx)
    _read_formulas(ctx)
    _read_words(ctx)
    _read_axis(ctx)
    _check_leftovers(ctx)
    _check_clauses(ctx)
    family, op = _decide(ctx)
    ctx.understood.update(family=family, op=op)
    build = {"conv": build_conv, "pool": build_pool, "scan": build_scanloss, "loss": build_scanloss,
             "attention": build_attention}.get(family) \
        or (build_norm if family == "norm" and op in NORM_WORD_OPS else _BUILDERS[family])
    if family == "reduction" and reduces_other_dims(ctx):
        build = build_reduction
    build = extras_builder(ctx, family) or build   # softmax over a middle dim, a sum of all elements
    spec = build(ctx, op)
    if "tf32" in ctx.flags:
        _tf32(ctx, spec)
    _check_sizes_used(ctx, family)
    _check_tensor_count(ctx, spec)
    for key in ("chain", "epilogue", "prologue"):
        if spec.params.get(key):
            spec.params[key] = _once(spec.params[key])
        pointwise.validate_chain(spec.params.get(key, []))
    spec.request = ctx.request
    return spec


_CATALOG_LINE = ("I can write: elementwise chains (relu, gelu, silu, sigmoid, tanh, exp, abs, square, scale/shift "
                 "by a number, clamp, leaky relu, and add/sub/mul/max/min with a second tensor, a bias or a "
                 "residual); reductions along the last dim (sum, mean, max, min, argmax, argmin, prod, logsumexp, variance); softmax and "
                 "log_softmax; layernorm and rmsnorm; batch, group and instance norms; L1, L2 and Frobenius "
                 "normalization; matmul, batched matmul and linear layers with a fused "
                 "epilogue; convolutions (1d/2d/3d, transposed, grouped, depthwise) with a fused epilogue; "
                 "max, average and adaptive pooling (1d/2d/3d) with a fused epilogue. "
                 "scans (cumsum, cumprod); losses (mse, huber, kl_div, cross_entropy, triplet, cosine ...); "
                 "attention (scaled dot-product, causal or masked). "
                 "For example: 'softmax over the rows of a 4096x8192 fp16 tensor'.")


# ops whose second application changes nothing: "clamp between 0 and 6 (relu6)" said it twice
_IDEMPOTENT = {"relu", "clamp_min", "clamp_max", "abs", "sign"}


def _once(chain: list[dict]) -> list[dict]:
    """The chain without repeats of idempotent steps: a step right after the same step, or a clamp
    pair right after the same pair ("clamp between 0 and 6 (relu6)" said the clamps twice)."""
    out: list[dict] = []
    for step in chain:
        if step.get("op") in _IDEMPOTENT and out[-1:] == [step]:
            continue
        out.append(step)
        pair = out[-4:]
        if len(pair) == 4 and pair[:2] == pair[2:] and {s.get("op") for s in pair} == {"clamp_min", "clamp_max"}:
            del out[-2:]
    return out


def _tf32(ctx: _Ctx, spec: KernelSpec) -> None:
    """'tf32' said: a float32 matmul or conv may multiply in TF32 (one product per product, its
    error 16x fp32's bound); other kernels have no products to make TF32."""
    if tf32_applies(spec.family, spec.dtype):
        spec.params["allow_tf32"] = True
        ctx.assume("tf32 read as float32 tensors with TF32 products allowed (10-bit mantissa, error "
                   "up to 16x the fp32 bound), as cuDNN's default TF32 convs")
    else:
        ctx.assume("tf32 read as float32: this kernel has no matrix products to run in TF32, so it computes "
                   "in IEEE fp32")


def _describe_understood(understood: dict) -> str:
    parts = []
    if understood.get("ops"):
        parts.append("ops " + "; ".join(understood["ops"]))
    if understood.get("formula"):
        parts.append("formula " + ", ".join(understood["formula"]))
    if understood.get("shapes"):
        parts.append("shapes " + ", ".join(_x(s) for s in understood["shapes"]))
    if understood.get("sizes"):
        parts.append("sizes " + ", ".join(f"{k}={v}" for k, v in understood["sizes"].items()))
    for key in ("dtype", "axis", "eps", "temperature"):
        if key in understood:
            parts.append(f"{key} {understood[key]}")
    if understood.get("unsupported"):
        parts.append("unsupported " + ", ".join(understood["unsupported"]))
    return "; ".join(parts) if parts else "nothing I could use"


def _failure_message(reason: str, understood: dict, full_catalog: bool) -> str:
    reason = reason[0].upper() + reason[1:]
    catalog = supported_summary() if full_catalog else _CATALOG_LINE
    return f"{reason}\nWhat I understood: {_describe_understood(understood)}.\n{catalog}"


def _success_message(spec: KernelSpec, assumptions: list[str]) -> str:
    dims = ", ".join(f"{k}={v}" for k, v in spec.dims.items())
    details = []
    for key in ("prologue", "chain", "epilogue"):
        if spec.params.get(key):
            details.append(f"{key} {pointwise.describe_chain(spec.params[key])}")
    details += [f"{k} {spec.params[k]}" for k in ("scale", "eps", "b_layout", "affine", "bias", "shape", "kernel",
                                                  "stride", "padding", "dilation", "groups", "output_padding", "ceil_mode",
                                                  "count_include_pad", "divisor_override", "indices")
                if k in spec.params]
    text = "; ".join([f"{spec.op} ({spec.family}), {dims}, {spec.dtype}", *details]) + "."
    if assumptions:
        text += " Assumed: " + "; ".join(assumptions) + "."
    return text


EXAMPLES = {
    "elementwise": ["add a bias, then gelu, then scale by 0.5 on a 8192x4096 fp16 tensor",
                    "relu(x + y) for two 4096x4096 tensors", "x * sigmoid(x) on a [8, 1024, 4096] bf16 tensor"],
    "reduction": ["row-wise sum of a 4096x8192 float32 tensor", "argmax of each row, 1024 rows of width 50257",
                  "sum of squares over the last dim of a 4096x4096 tensor"],
    "softmax": ["Write a fused softmax over the rows of a 4096x8192 fp16 tensor",
                "scaled softmax with scale 0.125 over 8192 rows and 1024 columns",
                "log softmax of a (2048, 32000) bf16 tensor"],
    "norm": ["rmsnorm on 8192 rows of width 4096", "layernorm of x plus a residual, 4096x1024 bf16, eps 1e-5",
             "group norm with 8 groups on a 16x64x128x128 fp16 tensor, then relu",
             "batch norm in eval mode on 32x128x56x56 bf16", "l2 normalize the rows of a 4096x8192 tensor"],
    "matmul": ["batched matmul 32x512x512 by 32x512x1024 in bf16 with a relu",
               "matmul 4096x4096 by 4096x1024 fp16 with a bias and gelu",
               "linear layer with 4096 inputs and 11008 outputs on a batch of 8192 tokens",
               "x @ W^T + b with x 8192x4096 and W 11008x4096 in fp16"],
    "conv": ["conv2d 3x3 stride 2 padding 1 on 16x64x56x56 float16 with 128 output channels",
             "depthwise conv 5x5 padding 2 on a 8x96x112x112 bf16 input, then relu",
             "transposed conv1d kernel 4 stride 2 padding 1 on 8x32x1024 with 16 output channels and a bias"],
    "pool": ["max pool 3x3 stride 2 on a 16x64x112x112 fp16 tensor",
             "adaptive avg pool to 7x7 on 32x512x14x14 bf16, then relu",
             "maxpool1d kernel 4 stride 2 dilation 2 on 16x32x4096 with indices"],
    "scan": ["cumsum along the rows of a 128x32768 fp32 tensor", "reverse cumulative sum of a 4096x8192 tensor",
             "masked cumsum of a 32768x32768 float32 tensor"],
    "loss": ["cross entropy loss of 32768x4096 logits", "triplet margin loss with margin 0.5 on 32768x8192 embeddings",
             "huber loss delta 0.5, sum reduction, 8192x8192 fp16"],
    "attention": ["causal flash attention, batch 8, 16 heads, sequence length 2048, head dim 64, fp16",
                  "scaled dot product attention on q, k, v of shape 32x32x512x64 in bf16",
                  "multi-head attention with 12 heads over 4x1024x768 fp16 activations, causal"],
}


def supported_summary() -> str:
    """What can be asked for, in plain words, with examples that parse."""
    lines = ["I can write these kernels (one per request):",
             "- elementwise chains on one tensor: " + ", ".join(pointwise.UNARY)
             + ", " + ", ".join(op for op in pointwise.WRITTEN if op != "threshold")   # threshold: modules only
             + "; with a number: scale, shift, leaky_relu, clamp_min, clamp_max; with a second tensor: "
             + ", ".join(pointwise.BINARY) + "; and bias (a vector over the last dim).",
             "- reductions along the last dim: " + ", ".join(FAMILY_OPS["reduction"])
             + " (ops on the input fuse in: 'sum of squares').",
             "- softmax, log_softmax along the last dim, optionally scaled.",
             "- layernorm, rmsnorm along the last dim, with eps, a residual added before, and pointwise ops "
             "after.",
             "- norms: " + ", ".join(FAMILY_OPS["norm"]) + ": batch norm (training or eval mode, momentum), "
             "group norm (N groups) and instance norm on an N x C x [spatial] input, L1 / L2 normalization of "
             "rows, Frobenius normalization of a whole tensor; pointwise ops after.",
             "- matmul (M, N, K), batched matmul / bmm (B, M, N, K) and linear layers (x @ W^T), with "
             "pointwise ops fused after (bias, relu, scale, residual ...).",
             "- convolutions: " + ", ".join(FAMILY_OPS["conv"]) + " on an N x C x [D x] [H x] W input, with kernel, "
             "stride, padding (a number, per dim, 'same'), dilation, groups (depthwise), output padding, output "
             "channels, and pointwise ops fused after (bias, relu, scale ...).",
             "- pooling: " + ", ".join(FAMILY_OPS["pool"]) + " on an N x C x [D x] [H x] W input, with window, "
             "stride, padding, dilation (max), ceil mode, padding not counted / a divisor (avg), indices (max), "
             "an output size (adaptive; 'global' is 1), and pointwise ops fused after.",
             "- scans along the last dim: " + ", ".join(FAMILY_OPS["scan"]) + " (reverse, exclusive, masked).",
             "- losses: " + ", ".join(FAMILY_OPS["loss"]) + " (total: the mean of a hinge); reduction mean, sum, none "
             "(batchmean for kl_div), with margin, delta, beta, p, ignore index, label smoothing.",
             "- attention (sdpa: scaled dot-product, one flash kernel): q as B x H x L x E or batch, heads, sequence "
             "length and head dim in words; causal, an additive or a boolean mask, a scale; k/v of another length.",
             "Shapes: 4096x8192, (4096, 8192), [32, 128, 4096] (leading dims become rows), '8192 rows of width "
             "4096', M=4096 N=4096 K=1024; 4k means 4096. Dtypes: float32 (default), float16, bfloat16.",
             "Row ops work along the last dim only (over each row).",
             "Examples:"]
    lines += [f"  {family}: " + " | ".join(f"'{e}'" for e in examples) for family, examples in EXAMPLES.items()]
    return "\n".join(lines)
