"""Words for conv padding modes and for two-tensor formulas (an operand with its own steps), and
the extras2 bench row parsing."""
from __future__ import annotations

import pytest
import torch

from bench.tasks import EXTRAS2_TASKS
from mtmc.request.parse import parse_request


def spec_of(text: str):
    r = parse_request(text)
    assert r.spec is not None, r.message
    return r.spec


@pytest.mark.parametrize("text, mode, padding", [
    ("conv2d 3x3 reflect padding 1 on 16x64x112x112 fp16", "reflect", [[1, 1], [1, 1]]),
    ("replicate-padded 3x3 conv, padding 1, on 4x8x32x32", "replicate", [[1, 1], [1, 1]]),
    ("conv1d kernel 5 padding 2 padding_mode='circular' on 8x32x4096 bf16", "circular", [[2, 2]]),
    ("reflection padding 2 conv1d kernel 5 on 8x32x4096", "reflect", [[2, 2]]),
])
def test_padding_modes_in_words(text, mode, padding):
    spec = spec_of(text)
    assert spec.params["padding_mode"] == mode and spec.params["padding"] == padding


@pytest.mark.parametrize("text, why", [
    ("conv2d 3x3 reflect padding 5 on 1x8x4x4", "needs a larger input dim H"),
    ("transposed conv2d 3x3 circular padding 1 on 1x8x4x4", "zeros only"),
    ("conv2d 3x3 padding_mode='mirrored' padding 1 on 1x8x8x8", "nknown padding mode"),
    ("conv2d 3x3 reflect padding 1, circular padding, on 1x8x8x8", "two padding modes"),
    # axes named in words that do not fit the tensor
    ("mean over the spatial dims of a 64x1024 tensor", "has no spatial dims"),
    ("sum over the last four dims of a 8x16x32 tensor", "it has only 3"),
    ("softmax over the first two dims of a 8x16x32x32 tensor", "Softmax over dims [0, 1] of a 4-d tensor is not supported"),
    ("max over the middle dim of a 8x16x32x64 tensor", "ambiguous"),
    ("sum over the middle dim of a 128x4096 tensor", "ambiguous"),
])
def test_refusals_say_why(text, why):
    r = parse_request(text)
    assert r.spec is None and why in r.message


@pytest.mark.parametrize("text, chain", [
    ("relu(x) + relu(y) on two 4096x4096 fp16 tensors", [{"op": "relu"}, {"op": "add", "pre": [{"op": "relu"}]}]),
    ("x * sigmoid(y) on 8192x8192 bf16", [{"op": "mul", "pre": [{"op": "sigmoid"}]}]),
    ("x - tanh(y) on 64x64", [{"op": "sub", "pre": [{"op": "tanh"}]}]),
    # calls on a tensor in the order they apply: the word phases took "sqrt", "log", "elu" as
    # words, in the order written, and gave sqrt -> relu, log -> exp -> shift, elu(1) -> scale
    ("sqrt(relu(x)) on 64x64", [{"op": "relu"}, {"op": "sqrt"}]),
    ("log(1 + exp(x)) on 64x64", [{"op": "exp"}, {"op": "shift", "value": 1.0}, {"op": "log"}]),
    ("F.elu(x, alpha=0.5) on 64x64", [{"op": "elu", "value": 0.5}]),
    ("F.softplus(x, beta=2) on 64x64", [{"op": "softplus", "value": 2.0, "threshold": 20.0}]),
    ("hardtanh(x, -2, 2) on 64x64", [{"op": "clamp_min", "value": -2.0}, {"op": "clamp_max", "value": 2.0}]),
    # activations written out are found by their values (x * tanh(softplus(x)) was tanh -> softplus)
    ("x * torch.tanh(F.softplus(x)) on 64x64", [{"op": "mish"}]),
    ("0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0)))) on 64x64",
     [{"op": "gelu_tanh"}]),
    ("x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))) on 64x64", [{"op": "gelu"}]),
    ("x / (1 + abs(x)) on 64x64", [{"op": "softsign"}]),
])
def test_formulas_are_one_chain_in_the_order_they_apply(text, chain):
    assert spec_of(text).params["chain"] == chain


def test_bench_row_parses():
    assert all(parse_request(t).spec is not None for t in EXTRAS2_TASKS)


@pytest.mark.parametrize("text, dims, inner", [
    # "the middle dim" was ignored and the max ran over the last dim, silently
    ("max over the middle dim of a 128x4096x4095 float32 tensor", {"M": 128 * 4095, "N": 4096}, 4095),
    ("sum over the second dim of a 16x256x64 tensor", {"M": 16 * 64, "N": 256}, 64),
    ("softmax over the middle dim of a 8x16x32 tensor", {"M": 256, "N": 16}, 32),
    ("mean along the third dimension of a 4x8x16x2 tensor", {"M": 64, "N": 16}, 2),
    # each read nothing and reduced the last dim, silently
    ("mean over the spatial dims of a 16x32x64x64 tensor", {"M": 512, "N": 4096}, None),
    ("mean over height and width of a 16x32x64x64 tensor", {"M": 512, "N": 4096}, None),
    ("max over the H and W dims of a 8x4x6x5x3 tensor", {"M": 32, "N": 90}, None),
    ("sum over the batch dimension of a 64x1024 tensor", {"M": 1024, "N": 64}, 1024),
    # refused as "several dims", though a run of dims is one reduction
    ("sum over the last two dims of a 16x32x64x64 tensor", {"M": 512, "N": 4096}, None),
    ("sum over the first two dims of a 8x16x32 tensor", {"M": 32, "N": 128}, 32),
])
def test_axes_named_in_words(text, dims, inner):
    spec = parse_request(text).spec
    assert spec is not None and spec.dims == dims and spec.params.get("inner") == inner



@pytest.mark.parametrize("text, op, dims", [
    # each was refused ("I could not tell what 1024 means here")
    ("causal self attention with 12 heads of dim 64, sequence 1024, batch 8, fp16", "sdpa",
     {"B": 8, "H": 12, "L": 1024, "S": 1024, "E": 64, "EV": 64}),
    ("causal attention, batch 8, 12 heads, seq 1024, head dim 64, fp16", "sdpa",
     {"B": 8, "H": 12, "L": 1024, "S": 1024, "E": 64, "EV": 64}),
    ("transposed conv 2d, 64 to 32 channels, kernel 4, stride 2, padding 1, on 8x64x32x32", "conv_transpose2d",
     {"N": 8, "C_in": 64, "C_out": 32, "H": 32, "W": 32, "OH": 64, "OW": 64}),
    ("cross entropy loss of 4096 logits over 1000 classes", "cross_entropy", {"M": 4096, "N": 1000}),
    ("cross entropy with 1000 classes and batch of 4096 samples", "cross_entropy", {"M": 4096, "N": 1000}),
    ("matrix-vector product of a 4096x2048 matrix and a 2048 vector", "matmul", {"M": 4096, "N": 1, "K": 2048}),
    ("a 4096 vector times a 4096x2048 matrix", "matmul", {"M": 1, "N": 2048, "K": 4096}),
    ("batched matmul of 128 pairs of 512x64 and 64x512 matrices in bf16", "bmm", {"B": 128, "M": 512, "N": 512, "K": 64}),
    ("grouped conv2d with 4 groups, 64 to 128 channels, 3x3, on 8x64x32x32", "conv2d",
     {"N": 8, "C_in": 64, "C_out": 128, "H": 32, "W": 32, "OH": 30, "OW": 30}),
    ("hardtanh between -0.5 and 0.5 of a 16x64 tensor", "chain", {"M": 16, "N": 64}),
    # and these still read as before
    ("triplet margin loss with margin 0.5 on 32768x8192 embeddings", "triplet_margin", {"M": 32768, "N": 8192}),
])
def test_sizes_said_in_other_words(text, op, dims):
    spec = parse_request(text).spec
    assert spec is not None and spec.op == op and spec.dims == dims


def test_quick_gelu_formula_is_a_scaled_silu_with_the_same_values():
    """x * sigmoid(1.702 * x) was refused ("uses the input twice"): it is silu(1.702 x) / 1.702."""
    import torch

    from mtmc.kernels import pointwise
    chain = spec_of("x * torch.sigmoid(1.702 * x) on 4096x512 fp16").params["chain"]
    assert [s["op"] for s in chain] == ["scale", "silu", "scale"]
    x = torch.linspace(-8, 8, 1001, dtype=torch.float64)
    y = x
    for step in chain:
        table = pointwise.SCALAR if step["op"] in pointwise.SCALAR else pointwise.UNARY
        y = eval(table[step["op"]][1].format(x="y", v=step.get("value")), {"torch": torch, "y": y})
    torch.testing.assert_close(y, x * torch.sigmoid(1.702 * x))


@pytest.mark.parametrize("text,expected", [
    # where(...) was read in pieces ("what 0 means"); now one select step with the same values
    ("where(x > 0, x, 0.1 * x) on 64x64", lambda x: torch.where(x > 0, x, 0.1 * x)),
    ("torch.where(x.abs() > 3, 0, x) on 64x64", lambda x: torch.where(x.abs() > 3, 0.0, x)),
    ("where(0 < x, x * 2, 0) on 64x64", lambda x: torch.where(x > 0, x * 2, 0.0)),
])
def test_where_of_a_comparison_with_a_number_is_one_select_step(text, expected):
    from mtmc.kernels.catalog import family_of
    from mtmc.kernels.task import check
    from mtmc.tools.hardware import PROFILES
    spec = spec_of(text)
    (step,) = spec.params["chain"]
    assert step["op"] == "select"
    fam = family_of(spec)
    ns = {"torch": torch}
    exec(fam.reference_source(spec), ns)   # noqa: S102 - our own generated reference
    x = torch.randn(64, 64) * 4
    torch.testing.assert_close(ns["reference"](x), expected(x))
    result = check(spec, fam.render(spec, fam.default_config(spec, PROFILES["h200"])), spec.dims, device="cpu")
    assert result.ok, result.reason


def test_a_bare_comparison_is_refused_with_the_where_form():
    result = parse_request("x > 0 on 64x64")
    assert not result.ok and "where(" in result.message


@pytest.mark.parametrize("text,dims", [
    # a reduction call without a dim reduced the last dim; PyTorch reduces every element
    ("torch.sum(x) on 4096x4096", {"M": 1, "N": 4096 * 4096}),
    ("x.mean() for x 16x1024x64", {"M": 1, "N": 16 * 1024 * 64}),
    ("torch.sum(x, 1) on 64x32", {"M": 64, "N": 32}),
    ("mean(x) over the last dim of 64x32", {"M": 64, "N": 32}),
    # a method on a call's result was not a formula: the words gave a row max with an abs prologue
    ("x.abs().max() on 64x32", {"M": 1, "N": 64 * 32}),
    ("y = x.relu().sum(-1) on 64x32", {"M": 64, "N": 32}),
])
def test_a_reduction_call_without_a_dim_reduces_every_element(text, dims):
    assert spec_of(text).dims == dims


def test_chained_methods_are_one_formula_and_an_unread_scan_says_how_to_ask():
    # ".log()" after ".sum(-1)" was taken as a word before the formula phase: refused ("what -1 means")
    spec = spec_of("x.exp().sum(-1).log() for x 1024x4096")
    assert (spec.op, spec.params["prologue"], spec.params["epilogue"]) == ("sum", [{"op": "exp"}], [{"op": "log"}])
    result = parse_request("x.flip(-1).cumsum(-1) on 64x64")   # scans are served: not "not in the catalog"
    assert not result.ok and "not in the catalog" not in result.message and "cumsum along" in result.message


@pytest.mark.parametrize("text,eps", [
    # an RMSNorm written out was refused ("uses the input twice", or rsqrt "not in the vocabulary")
    ("torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * x on 64x96", 1e-6),
    ("x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + 1e-5) on 64x96", 1e-5),
    ("x * torch.rsqrt((x*x).mean(-1, keepdim=True) + 1e-6) for x of 64x96", 1e-6),
])
def test_a_written_out_rmsnorm_is_the_norm_without_weight(text, eps):
    from mtmc.kernels.catalog import family_of
    from mtmc.kernels.task import check
    from mtmc.tools.hardware import PROFILES
    spec = spec_of(text)
    assert (spec.op, spec.params) == ("rmsnorm", {"eps": eps, "affine": False})
    fam = family_of(spec)
    ns = {"torch": torch}
    exec(fam.reference_source(spec), ns)   # noqa: S102 - our own generated reference
    x = torch.randn(64, 96)
    torch.testing.assert_close(ns["reference"](x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    result = check(spec, fam.render(spec, fam.default_config(spec, PROFILES["h200"])), spec.dims, device="cpu")
    assert result.ok, result.reason
    # over another dim, or without keepdim, it is no row RMSNorm: refused, not misread
    assert not parse_request("x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6) on 64x64").ok


@pytest.mark.parametrize("text,op,expected", [
    # each was refused (the norm word was read as "which norm?", or "uses the input twice")
    ("x / x.norm(p=2, dim=-1, keepdim=True) on 64x96", "l2norm", lambda x: x / x.norm(p=2, dim=-1, keepdim=True)),
    ("x / torch.sqrt((x ** 2).sum(dim=-1, keepdim=True)) on 64x96", "l2norm",
     lambda x: x / torch.sqrt((x ** 2).sum(dim=-1, keepdim=True))),
    ("x / x.abs().sum(-1, keepdim=True) on 64x96", "l1norm", lambda x: x / x.abs().sum(-1, keepdim=True)),
    ("x / torch.norm(x, p='fro') on 64x96", "frobenius", lambda x: x / torch.norm(x, p="fro")),
])
def test_a_tensor_divided_by_its_vector_norm_is_the_norm_kernel(text, op, expected):
    from mtmc.kernels.catalog import family_of
    from mtmc.kernels.task import check
    from mtmc.tools.hardware import PROFILES
    spec = spec_of(text)
    assert spec.op == op
    fam = family_of(spec)
    ns = {"torch": torch}
    exec(fam.reference_source(spec), ns)   # noqa: S102 - our own generated reference
    x = torch.randn(64, 96)
    torch.testing.assert_close(ns["reference"](x), expected(x))
    result = check(spec, fam.render(spec, fam.default_config(spec, PROFILES["h200"])), spec.dims, device="cpu")
    assert result.ok, result.reason


@pytest.mark.parametrize("text,chain", [
    # x * (x > 0) was read as x (the comparison evaluated as a power): now relu
    ("x * (x > 0) on 64x64", [{"op": "relu"}]),
    # -x ** 2 was (-x) ** 2: Python's -(x ** 2)
    ("torch.exp(-x ** 2) on 64x64", [{"op": "square"}, {"op": "neg"}, {"op": "exp"}]),
    ("-x * 3 on 64x64", [{"op": "neg"}, {"op": "scale", "value": 3.0}]),
])
def test_comparisons_and_unary_minus_read_as_python_does(text, chain):
    assert spec_of(text).params["chain"] == chain


@pytest.mark.parametrize("text,chain", [
    # torch.maximum(x, zeros_like(x)) was a max *reduction* over rows: a wrong kernel
    ("torch.maximum(x, torch.zeros_like(x)) on 64x64", [{"op": "clamp_min", "value": 0.0}]),
    ("torch.max(x, torch.tensor(0.0)) on 64x64", [{"op": "clamp_min", "value": 0.0}]),
    # (x + 3).clamp(0, 6): "(0, 6)" was taken for a shape ("size 0 is out of range")
    ("(x + 3).clamp(0, 6) / 6 on 64x64", [{"op": "shift", "value": 3.0}, {"op": "clamp_min", "value": 0.0},
                                          {"op": "clamp_max", "value": 6.0}, {"op": "scale", "value": 1 / 6}]),
])
def test_constants_written_as_tensors_and_methods_on_parentheses(text, chain):
    assert spec_of(text).params["chain"] == chain


@pytest.mark.parametrize("text,expected", [
    # var / std calls were refused as "not in the pointwise vocabulary"
    ("x.var(-1) on 64x96", lambda x: x.var(-1)),
    ("torch.var(x, dim=-1, unbiased=False) on 64x96", lambda x: x.var(-1, unbiased=False)),
    ("x.std(dim=-1) on 64x96", lambda x: x.std(dim=-1)),
    ("x.std() on 64x96", lambda x: x.std().reshape(1)),
])
def test_var_and_std_calls_are_the_variance_reduction(text, expected):
    from mtmc.kernels.catalog import family_of
    spec = spec_of(text)
    ns = {"torch": torch}
    exec(family_of(spec).reference_source(spec), ns)   # noqa: S102 - our own generated reference
    x = torch.randn(64, 96, dtype=torch.float64)
    rows = x.reshape(spec.dims["M"], spec.dims["N"])
    torch.testing.assert_close(ns["reference"](rows).reshape(-1), expected(x).reshape(-1))


@pytest.mark.parametrize("text,dims", [
    # a tuple of dims was taken for a shape ("several shapes (1x2, ...)")
    ("x.mean(dim=(1, 2)) on 8x16x32", {"M": 8, "N": 512}),
    ("x.sum(dim=[2, 3]) on 4x8x16x16", {"M": 32, "N": 256}),
    ("torch.amax(x, dim=(-2, -1)) on 4x8x16x16", {"M": 32, "N": 256}),
])
def test_a_tuple_of_dims_in_a_reduction_call(text, dims):
    assert spec_of(text).dims == dims
    assert "several dims" in parse_request("softmax(x, dim=(1, 2)) on 4x8x16").message   # was an IndexError
