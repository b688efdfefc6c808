"""Words -> KernelSpec: exact specs for many phrasings, clear failures, and a fuzz that it never raises."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtmc.kernels import pointwise
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import DTYPES
from mtmc.request.parse import EXAMPLES, ParseResult, parse_request, supported_summary

BIAS, RELU, GELU = {"op": "bias"}, {"op": "relu"}, {"op": "gelu"}
RESIDUAL = {"op": "residual"}


def scale(v):
    return {"op": "scale", "value": v}


# (request, family, op, dims, dtype, params)
CASES = [
    # softmax
    ("Write a fused softmax over the rows of a 4096x8192 fp16 tensor",
     "softmax", "softmax", {"M": 4096, "N": 8192}, "float16", {}),
    ("log softmax along the last dim of a (2048, 32000) bf16 tensor",
     "softmax", "log_softmax", {"M": 2048, "N": 32000}, "bfloat16", {}),
    ("scaled softmax with scale 0.125 over 8192 rows and 1024 columns",
     "softmax", "softmax", {"M": 8192, "N": 1024}, "float32", {"scale": 0.125}),
    ("softmax(x / 8) for a [16, 512, 512] half tensor",
     "softmax", "softmax", {"M": 8192, "N": 512}, "float16", {"scale": 0.125}),
    ("softmax with temperature 2 on a 4k x 32k float tensor",
     "softmax", "softmax", {"M": 4096, "N": 32768}, "float32", {"scale": 0.5}),
    ("softmax of a 4096×8192 torch.float16 tensor",
     "softmax", "softmax", {"M": 4096, "N": 8192}, "float16", {}),
    ("N=8192, M=4096 softmax in float16",
     "softmax", "softmax", {"M": 4096, "N": 8192}, "float16", {}),
    ("softmax then scale by 2, 64x64",
     "softmax", "softmax", {"M": 64, "N": 64}, "float32", {"epilogue": [scale(2.0)]}),
    # reductions
    ("row-wise sum of a 4096x8192 float32 matrix",
     "reduction", "sum", {"M": 4096, "N": 8192}, "float32", {}),
    ("mean over the last dimension of a [32, 128, 4096] bf16 tensor",
     "reduction", "mean", {"M": 4096, "N": 4096}, "bfloat16", {}),
    ("argmax of each row, 1024 rows of width 50257, fp16",
     "reduction", "argmax", {"M": 1024, "N": 50257}, "float16", {}),
    ("reduce max along dim=-1 of a 8192 x 1024 tensor",
     "reduction", "max", {"M": 8192, "N": 1024}, "float32", {}),
    ("min of every row in a 2048 by 4096 half precision tensor",
     "reduction", "min", {"M": 2048, "N": 4096}, "float16", {}),
    ("argmin, M=512, N=1000", "reduction", "argmin", {"M": 512, "N": 1000}, "float32", {}),
    ("sum of squares over the last dim of a 4096x4096 tensor",
     "reduction", "sum", {"M": 4096, "N": 4096}, "float32", {"prologue": [{"op": "square"}]}),
    # norms
    ("rmsnorm on 8192 rows of width 4096", "norm", "rmsnorm", {"M": 8192, "N": 4096}, "float32", {}),
    ("layernorm over a 4096x1024 bf16 tensor with eps 1e-5",
     "norm", "layernorm", {"M": 4096, "N": 1024}, "bfloat16", {"eps": 1e-5}),
    ("add residual then layernorm, 2048x768, fp16",
     "norm", "layernorm", {"M": 2048, "N": 768}, "float16", {"prologue": [RESIDUAL]}),
    ("layer norm of x plus a residual on a [8, 512, 1024] tensor in bf16",
     "norm", "layernorm", {"M": 4096, "N": 1024}, "bfloat16", {"prologue": [RESIDUAL]}),
    ("RMSNorm with epsilon 1e-6 followed by silu, hidden size 4096, 16k tokens",
     "norm", "rmsnorm", {"M": 16384, "N": 4096}, "float32", {"eps": 1e-6, "epilogue": [{"op": "silu"}]}),
    ("fused add + rmsnorm for batch 8, seq len 2048, hidden 4096 in bf16",
     "norm", "rmsnorm", {"M": 16384, "N": 4096}, "bfloat16", {"prologue": [RESIDUAL]}),
    ("layernorm then add a residual, 1024x1024",
     "norm", "layernorm", {"M": 1024, "N": 1024}, "float32", {"epilogue": [RESIDUAL]}),
    ("F.layer_norm(x + r, (4096,), eps=1e-5) for 8192x4096 fp16",
     "norm", "layernorm", {"M": 8192, "N": 4096}, "float16", {"eps": 1e-5, "prologue": [RESIDUAL]}),
    ("rmsnorm without affine, hidden=4096, tokens=8192",
     "norm", "rmsnorm", {"M": 8192, "N": 4096}, "float32", {"affine": False}),
    # elementwise chains
    ("add a bias, then gelu, then scale by 0.5 on a 8192x4096 fp16 tensor",
     "elementwise", "chain", {"M": 8192, "N": 4096}, "float16", {"chain": [BIAS, GELU, scale(0.5)]}),
    ("relu(x + y) for two 4096x4096 tensors",
     "elementwise", "chain", {"M": 4096, "N": 4096}, "float32", {"chain": [{"op": "add"}, RELU]}),
    ("x * sigmoid(x) on a 1024x1024 bf16 tensor",
     "elementwise", "chain", {"M": 1024, "N": 1024}, "bfloat16", {"chain": [{"op": "silu"}]}),
    ("gelu with tanh approximation on a [4, 1024, 4096] fp16 tensor",
     "elementwise", "chain", {"M": 4096, "N": 4096}, "float16",
     {"chain": [{"op": "gelu_tanh"}], "shape": [4, 1024, 4096]}),
    ("leaky relu with slope 0.2 on 8192x8192",
     "elementwise", "chain", {"M": 8192, "N": 8192}, "float32", {"chain": [{"op": "leaky_relu", "value": 0.2}]}),
    ("clamp to [0, 6] then square, 1000x1000",
     "elementwise", "chain", {"M": 1000, "N": 1000}, "float32",
     {"chain": [{"op": "clamp_min", "value": 0.0}, {"op": "clamp_max", "value": 6.0}, {"op": "square"}]}),
    ("elementwise maximum of two 2048x2048 float16 tensors",
     "elementwise", "chain", {"M": 2048, "N": 2048}, "float16", {"chain": [{"op": "maximum"}]}),
    ("relu after adding a bias, 4096 x 11008 half",
     "elementwise", "chain", {"M": 4096, "N": 11008}, "float16", {"chain": [BIAS, RELU]}),
    ("exp(x) * 2 - 1 for a 512x512 tensor",
     "elementwise", "chain", {"M": 512, "N": 512}, "float32",
     {"chain": [{"op": "exp"}, scale(2.0), {"op": "shift", "value": -1.0}]}),
    ("multiply two 4096x4096 tensors elementwise then tanh",
     "elementwise", "chain", {"M": 4096, "N": 4096}, "float32", {"chain": [{"op": "mul"}, {"op": "tanh"}]}),
    ("subtract 1 after taking tanh, 10x10",
     "elementwise", "chain", {"M": 10, "N": 10}, "float32", {"chain": [{"op": "tanh"}, {"op": "shift", "value": -1.0}]}),
    ("apply swish to a (1024, 4096) bfloat16 tensor",
     "elementwise", "chain", {"M": 1024, "N": 4096}, "bfloat16", {"chain": [{"op": "silu"}]}),
    # matmul
    ("batched matmul 32x512x512 by 32x512x1024 in bf16 with a relu",
     "matmul", "bmm", {"B": 32, "M": 512, "K": 512, "N": 1024}, "bfloat16", {"epilogue": [RELU]}),
    ("matmul 4096x4096 by 4096x1024 fp16", "matmul", "matmul", {"M": 4096, "K": 4096, "N": 1024}, "float16", {}),
    ("gemm with M=4096 N=4096 K=1024 with a bias and relu",
     "matmul", "matmul", {"M": 4096, "N": 4096, "K": 1024}, "float32", {"epilogue": [BIAS, RELU]}),
    ("a 1024x512 matrix times a 512x256 matrix", "matmul", "matmul", {"M": 1024, "K": 512, "N": 256}, "float32", {}),
    ("linear layer with 4096 inputs and 11008 outputs on a batch of 8192 tokens",
     "matmul", "matmul", {"M": 8192, "K": 4096, "N": 11008}, "float32", {"b_layout": "nk"}),
    ("nn.Linear(4096, 11008) with gelu on 8192 tokens in bf16",
     "matmul", "matmul", {"M": 8192, "K": 4096, "N": 11008}, "bfloat16", {"epilogue": [BIAS, GELU], "b_layout": "nk"}),
    ("x @ W^T + b with x 8192x4096 and W 11008x4096, fp16",
     "matmul", "matmul", {"M": 8192, "K": 4096, "N": 11008}, "float16", {"epilogue": [BIAS], "b_layout": "nk"}),
    ("matmul scaled by 0.5 plus a residual, (2048, 2048) by (2048, 512)",
     "matmul", "matmul", {"M": 2048, "K": 2048, "N": 512}, "float32", {"epilogue": [scale(0.5), RESIDUAL]}),
    ("multiply two 4096x4096 matrices in bf16",
     "matmul", "matmul", {"M": 4096, "N": 4096, "K": 4096}, "bfloat16", {}),
    ("y = gelu(x @ W + b) where x is 2048x1024 and W is 1024x4096, fp16",
     "matmul", "matmul", {"M": 2048, "K": 1024, "N": 4096}, "float16", {"epilogue": [BIAS, GELU]}),
    ("bmm with B=8 M=N=K=256 fp16", "matmul", "bmm", {"B": 8, "M": 256, "N": 256, "K": 256}, "float16", {}),
    ("linear 4096 -> 11008 on a [32, 128, 4096] input with bias and silu",
     "matmul", "matmul", {"M": 4096, "K": 4096, "N": 11008}, "float32",
     {"epilogue": [BIAS, {"op": "silu"}], "b_layout": "nk"}),
]


@pytest.mark.parametrize("text, family, op, dims, dtype, params", CASES, ids=[c[0][:48] for c in CASES])
def test_request_gives_exact_spec(text, family, op, dims, dtype, params):
    result = parse_request(text)
    assert result.ok, result.message
    spec = result.spec
    assert (spec.family, spec.op, spec.dims, spec.dtype, spec.params) == (family, op, dims, dtype, params)
    assert spec.request == text
    assert result.understood["family"] == family


def test_missing_shape_and_dtype_become_stated_defaults():
    result = parse_request("softmax")
    assert result.ok
    assert result.spec.dims == {"M": 4096, "N": 4096} and result.spec.dtype == "float32"
    assert "no shape given: using 4096x4096" in result.assumptions
    assert "no dtype given: using float32" in result.assumptions
    assert "Assumed:" in result.message


def test_stated_sizes_and_dtype_leave_nothing_assumed():
    result = parse_request("Write a fused softmax over the rows of a 4096x8192 fp16 tensor")
    assert result.assumptions == []
    assert result.understood["dtype"] == "float16" and result.understood["shapes"] == [[4096, 8192]]


def test_reduction_without_an_axis_states_the_last_dim():
    # torch.sum(x) sums everything; a row sum must not be assumed silently
    bare = parse_request("sum of a 4096x4096 fp32 tensor")
    assert bare.spec.dims == {"M": 4096, "N": 4096}
    assert any("no axis given" in a for a in bare.assumptions)
    for said in ("row sum of a 4096x4096 fp32 tensor", "sum over the last dim of a 4096x4096 fp32 tensor",
                 "row-wise max of a 64x64 fp32 tensor"):
        assert parse_request(said).assumptions == [], said


def test_layernorm_without_bias_keeps_the_weight_only():
    # the bias used to be kept silently
    assert parse_request("layernorm without bias on a 4096x768 fp16 tensor").spec.params == {"bias": False}
    assert parse_request("layernorm without affine on 64x64").spec.params == {"affine": False}
    assert parse_request("rmsnorm without bias on 64x64").ok


@pytest.mark.parametrize("count", ["10^6 floats", "1e6 elements", "1,000,000 values", "1000000 elements"])
def test_element_counts_written_as_numbers(count):
    result = parse_request(f"y = sigmoid(x) for {count}")
    assert result.ok, result.message
    assert result.spec.params["shape"] == [1000000]


def test_tf32_said_allows_tf32_products_in_matmuls_and_convs_only_and_says_so():
    result = parse_request("matmul 64x64 by 64x64 in tf32")
    assert (result.spec.dtype, result.spec.params.get("allow_tf32")) == ("float32", True)
    assert any("TF32 products allowed" in a for a in result.assumptions)
    assert "allow_tf32" not in parse_request("matmul 64x64 by 64x64 in fp32").spec.params
    relu = parse_request("relu on 64x64 tf32")
    assert "allow_tf32" not in relu.spec.params and any("IEEE fp32" in a for a in relu.assumptions)


def test_two_tensors_with_a_binary_op_still_parse():
    spec = parse_request("gelu(x) * y elementwise on two 64x64 fp32 tensors").spec
    assert spec.params == {"chain": [GELU, {"op": "mul"}]}


def test_k_suffix_is_read_as_1024_and_said_so():
    result = parse_request("layernorm on a 4k x 8k bf16 tensor")
    assert result.spec.dims == {"M": 4096, "N": 8192}
    assert "read '4k' as 4096 (k = 1024)" in result.assumptions


def test_nn_linear_bias_default_is_an_assumption_and_bias_false_drops_it():
    with_bias = parse_request("nn.Linear(1024, 4096) on 512 tokens")
    assert with_bias.spec.params["epilogue"] == [BIAS]
    assert any("bias" in a for a in with_bias.assumptions)
    without = parse_request("nn.Linear(1024, 4096, bias=False) on 512 tokens")
    assert "epilogue" not in without.spec.params


def test_formula_steps_after_the_core_are_an_epilogue_not_a_scale():
    # softmax(x) * 2 scales the probabilities; softmax(x * 2) scales the logits.
    assert parse_request("softmax(x) * 2 on 64x64").spec.params == {"epilogue": [scale(2.0)]}
    assert parse_request("softmax(x * 2) on 64x64").spec.params == {"scale": 2.0}


def test_matmul_linear_weight_shapes_are_read_as_n_by_k():
    result = parse_request("linear layer 4096 -> 11008, x is 8192x4096, weight 11008x4096, with bias, bf16")
    assert result.spec.dims == {"M": 8192, "N": 11008, "K": 4096}
    assert result.spec.params == {"epilogue": [BIAS], "b_layout": "nk"}


# (request, words the message must contain (lowercased))
# served since the pointred words: "sum over dim 0", "sqrt of ...", "logsumexp over the rows", "sum(x) * 2"
# (tests/test_pointred.py)
FAILURES = [
    ("write me a convolution", ["convolution", "i can write", "softmax", "matmul"]),
    ("hello there, how are you", ["no kernel op", "layernorm", "examples"]),
    ("softmax over the columns of a 4096x4096 tensor", ["columns", "last dim", "4096x4096"]),
    ("softmax over dim 5 of a 4096x4096 tensor", ["dim 5", "last dim"]),   # sums of all elements are served
    ("matmul 4096x1024 by 2048x512", ["inner dimensions", "1024", "2048x512"]),
    ("softmax and layernorm of a 4096x4096 tensor", ["softmax", "layernorm", "one kernel per request"]),
    ("relu in fp16 and bf16", ["float16", "bfloat16", "one dtype"]),
    ("layernorm on a 4096x4096 tensor with dropout", ["dropout", "not in the catalog"]),
    ("softmax of a 4096x8192 tensor and a 1024x1024 tensor", ["several shapes", "4096x8192", "1024x1024"]),
    ("int8 matmul 4096x4096 by 4096x4096", ["int8", "float16"]),
    ("softmax 4096", ["4096", "shape"]),
    ("scaled softmax on 4096x4096", ["scale"]),
    ("reduce a 4096x4096 tensor", ["which reduction", "argmax"]),
    ("matmul 4096x1024", ["both operands", "4096x1024"]),
    ("layernorm with eps on 4096x4096", ["eps", "no value"]),
    ("rmsnorm with weight and bias on 64x64", ["no bias in rmsnorm"]),
    ("relu on 0x4096", ["out of range"]),
    ("a 4096x4096 tensor times two", ["times"]),
    ("sin(x) on 64x64", ["sin", "pointwise vocabulary"]),
    # a word after "then" that is no op used to be dropped: "relu then sofmax" was a plain relu
    ("relu then sofmax on 64x64", ["sofmax", "did you mean 'softmax'"]),
    ("layernorm then gelu then sigmod on 64x64", ["sigmod", "sigmoid"]),
    ("add a bias then gelu then round on 64x64", ["round", "not an op"]),
    ("silu then mutliply by y, 64x64", ["mutliply", "multiply"]),
    ("softmax then mask on 64x64", ["mask"]),
    ("sofmax over the rows of a 1024x1024 fp16 tensor", ["no kernel op", "did you mean 'softmax'"]),
    # two tensors named, one read: the second was silently ignored
    ("sigmoid of two 1024x1024 tensors", ["two tensors", "only one"]),
    ("focal loss between two 4096x4096 tensors", ["loss", "not in the catalog"]),
    # integer / double dtypes were silently read as float32
    ("relu on a 64x64 int tensor", ["dtype 'int'", "float16"]),
    ("matmul of 64x32 and 32x16 in double", ["dtype 'double'"]),
    ("sum of each row of 64x64 longs", ["dtype 'longs'"]),
    ("relu then double the values on 64x64", ["double"]),
]


@pytest.mark.parametrize("text, mentions", FAILURES, ids=[f[0][:48] for f in FAILURES])
def test_unservable_request_fails_with_a_helpful_message(text, mentions):
    result = parse_request(text)
    assert not result.ok and result.spec is None
    message = result.message.lower()
    for word in mentions:
        assert word in message, (word, result.message)
    assert "what i understood:" in message and "i can write" in message


def test_failure_reports_what_was_understood():
    result = parse_request("softmax over dim 3 of a 512x256 bf16 tensor")
    assert not result.ok
    assert result.understood["dtype"] == "bfloat16"
    assert result.understood["shapes"] == [[512, 256]]
    assert result.understood["axis"] == 3
    assert "512x256" in result.message and "bfloat16" in result.message


def test_ok_follows_the_spec():
    assert not ParseResult(None).ok
    assert parse_request("relu on 8x8").ok


def test_odd_inputs_answer_instead_of_raising():
    for text in ["", "   ", "x" * 5000, "(((((((((((((((((((((((((((((((((((((((((((((x", "2**99999 * x", "1e999x5"]:
        result = parse_request(text)
        assert not result.ok and result.message


def test_supported_summary_names_every_op_and_its_examples_parse():
    summary = supported_summary()
    for ops in FAMILY_OPS.values():
        for op in ops:
            if op != "chain":
                assert op in summary
    for unary in pointwise.UNARY:
        assert unary in summary
    for family, examples in EXAMPLES.items():
        for example in examples:
            assert example in summary
            result = parse_request(example)
            assert result.ok and result.spec.family == family, (example, result.message)


VOCAB = ["softmax", "log", "layernorm", "rmsnorm", "matmul", "bmm", "linear", "sum", "mean", "max", "argmax",
         "relu", "gelu", "tanh", "bias", "residual", "add", "then", "after", "of", "x", "y", "+", "*", "@", "(",
         ")", "[", "]", ",", "=", "4096", "4k", "x", "by", "rows", "columns", "width", "fp16", "bf16", "half",
         "scale", "0.5", "-1", "dim", "1e-5", "eps", "temperature", "two", "tensors", "matrices", "times",
         "multiply", "clamp", "leaky", "M=", "N=", "K=", "nn.Linear(", "W^T", "inputs", "outputs", "tokens",
         "batch", "elementwise", "without", "square", "sqrt", "1/8", "/", "-", "**", "2", "0", "→", "×"]


def _check_never_raises(text: str) -> None:
    result = parse_request(text)
    assert isinstance(result, ParseResult) and result.message
    assert "internal parser error" not in result.message.lower(), (text, result.message)
    if result.ok:
        spec = result.spec
        assert spec.op in FAMILY_OPS[spec.family] and spec.dtype in DTYPES
        assert all(isinstance(v, int) and v >= 1 for v in spec.dims.values())
        for key in ("chain", "prologue", "epilogue"):
            pointwise.validate_chain(spec.params.get(key, []))
        assert spec.request == text


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(max_size=200))
def test_fuzz_any_text_is_answered(text):
    _check_never_raises(text)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(VOCAB), max_size=14), st.sampled_from([" ", ""]))
def test_fuzz_kernel_vocabulary_is_answered(words, sep):
    _check_never_raises(sep.join(words))
