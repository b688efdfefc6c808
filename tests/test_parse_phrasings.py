"""Phrasings a user wrote that the words parser refused or misread (each failed before its fix):
channel counts said beside a shape, a 1d input's length in words, matrix products without the
word "matrix", `A * B` beside "matrix multiplication", plural vectors, "divide the row by it"."""
import pytest

from mtmc.request.parse import parse_request


def spec_of(text):
    res = parse_request(text)
    assert res.ok, res.message
    return res.spec


def test_depthwise_conv_with_its_channel_count():
    s = spec_of("a depthwise 3x3 convolution with 32 channels on 8x32x64x64 half input, padding 1")
    assert (s.op, s.dtype, s.params["groups"]) == ("conv2d", "float16", 32)
    assert s.dims["C_in"] == 32 and s.dims["C_out"] == 32


def test_plain_conv_channels_other_than_the_inputs_are_its_outputs():
    res = parse_request("a 3x3 conv with 128 channels on a 8x64x32x32 tensor")
    assert res.ok, res.message
    assert res.spec.dims["C_out"] == 128
    assert any("output channels" in a for a in res.assumptions)


def test_depthwise_conv_with_other_channels_is_refused_with_both_counts():
    res = parse_request("depthwise 3x3 conv with 16 channels on 8x32x64x64")
    assert not res.ok and "32 channels" in res.message and "16" in res.message


def test_conv1d_input_from_batch_channels_and_length_words():
    s = spec_of("a 1d convolution: 16 batch, 32 in channels, 64 out channels, length 1024, kernel size 5")
    assert s.op == "conv1d"
    assert (s.dims["N"], s.dims["C_in"], s.dims["C_out"], s.dims["L"]) == (16, 32, 64, 1024)


@pytest.mark.parametrize("text,op", [
    ("batch norm (training) over 64 channels, input 32x64x28x28", "batchnorm"),
    ("group norm with 8 groups and 64 channels on a 16x64x32x32 tensor", "groupnorm"),
])
def test_channel_norm_with_its_channel_count(text, op):
    s = spec_of(text)
    assert s.op == op and s.dims["C"] == 64


def test_channel_count_that_disagrees_with_the_shape_is_refused():
    res = parse_request("batch norm over 32 channels, input 8x64x28x28")
    assert not res.ok and "64 channels" in res.message


def test_max_pool_1d_from_length_words():
    s = spec_of("max pool 1d, window 4, batch 8, 16 channels, length 4096")
    assert s.family == "pool" and s.op == "max_pool1d"


@pytest.mark.parametrize("text,layout", [
    ("multiply A (1024x4096) by B transposed (B is 2048x4096), fp32", "nk"),
    ("multiply A of shape 1024x4096 with B of shape 4096x2048", "kn"),
    ("A times B, A is 512x256 and B is 256x1024, fp16", "kn"),
])
def test_product_of_two_matrices_without_the_word_matrix(text, layout):
    s = spec_of(text)
    assert s.family == "matmul" and s.params.get("b_layout", "kn") == layout
    assert not s.params.get("epilogue")


@pytest.mark.parametrize("text", [
    "C = A * B for A 256x512 and B 512x128 (matrix multiplication)",
    "y = x * w where x is 128x256 and w is 256x64, a matmul",
])
def test_star_beside_matrix_multiplication_is_the_product_not_an_epilogue(text):
    s = spec_of(text)
    assert s.family == "matmul" and not s.params.get("epilogue"), s.params


def test_equal_square_shapes_multiplied_ask_which_product():
    res = parse_request("multiply A of shape 64x64 with B of shape 64x64")
    assert not res.ok and "elementwise" in res.message and "matrix product" in res.message
    assert spec_of("elementwise multiply A of shape 64x64 with B of shape 64x64").family == "elementwise"
    assert spec_of("matrix multiply A of shape 64x64 with B of shape 64x64").family == "matmul"


def test_plural_vectors_of_length():
    s = spec_of("add two vectors of length 1048576")
    assert s.family == "elementwise" and s.dims["N"] == 1048576 and s.params["chain"][0]["op"] == "add"


def test_norm_then_divide_by_it_is_the_normalization():
    s = spec_of("compute the L2 norm of each row of a 4096x768 matrix and divide the row by it")
    assert (s.family, s.op, s.dims["N"]) == ("norm", "l2norm", 768)


@pytest.mark.parametrize("text,op,n", [
    ("column-wise softmax of a 2048 x 2048 matrix in half precision", "softmax", 2048),
    ("the maximum of each column of 4096x128", "max", 4096),
])
def test_each_column_of_a_matrix_is_dim_0(text, op, n):
    res = parse_request(text)
    assert res.ok, res.message
    assert res.spec.op == op and res.spec.dims["N"] == n   # the reduced dim is the rows' count
    assert any("dim 0" in a for a in res.assumptions)


def test_each_column_of_a_3d_tensor_asks_for_a_number():
    res = parse_request("max of each column of a 8x4096x128 tensor")
    assert not res.ok and "dim" in res.message and "number" in res.message


def test_attention_words_dropout_free_and_tokens_as_the_sequence():
    s = spec_of("apply dropout-free attention: q k v are 2x8x256x64, no mask, fp16")
    assert s.family == "attention"
    res = parse_request("causal self-attention with 32 heads of dim 128 over 2048 tokens, batch 1, bf16")
    assert res.ok, res.message
    assert [res.spec.dims[k] for k in ("B", "H", "L", "E")] == [1, 32, 2048, 128]


def test_log_of_softmax_is_log_softmax_not_log_then_softmax():
    assert spec_of("log of softmax over rows of 512x50257").op == "log_softmax"


def test_a_backward_pass_is_refused_not_served_as_the_forward():
    res = parse_request("gelu backward for 1024x4096")
    assert not res.ok and "backward" in res.message.lower()


def test_residual_add_then_layernorm_adds_the_residual_once():
    s = spec_of("fused residual add + layernorm for hidden 1024, 8192 tokens, bf16")
    assert [st["op"] for st in s.params["prologue"]] == ["residual"]


@pytest.mark.parametrize("text,chain", [
    ("divide x by y elementwise, 1024x1024", ["div"]),
    ("y / x with x, y of shape 256x256", ["rdiv"]),
    ("compute x**2 + 1 for x 100x100", ["square", "shift"]),
    ("x ** 3 on a 512x512 tensor", ["pow"]),
])
def test_division_by_a_tensor_and_powers_in_formulas(text, chain):
    s = spec_of(text)
    assert [st["op"] for st in s.params["chain"]] == chain


def test_rows_of_a_width():
    s = spec_of("rms norm with eps 1e-5 for 4096 rows of 8192")
    assert (s.dims["M"], s.dims["N"]) == (4096, 8192)


@pytest.mark.parametrize("text,chain", [
    ("sqrt of exp of a 1024x1024 tensor", ["exp", "sqrt"]),
    ("the log of the sigmoid of a 64x64 tensor", ["sigmoid", "log"]),
])
def test_f_of_g_applies_g_first(text, chain):
    assert [st["op"] for st in spec_of(text).params["chain"]] == chain


@pytest.mark.parametrize("text,pro,epi", [
    ("sqrt of the sum of squares of each row of 1000x300", ["square"], ["sqrt"]),
    ("tanh of the mean of each row of 64x1024", [], ["tanh"]),
    ("the mean of the relu of each row of 64x1024", ["relu"], []),
])
def test_f_of_a_reduction_is_its_epilogue(text, pro, epi):
    p = spec_of(text).params
    assert [st["op"] for st in p.get("prologue", [])] == pro and [st["op"] for st in p.get("epilogue", [])] == epi


def test_a_dtype_before_words_in_parentheses_is_kept():
    s = spec_of("Triton kernel: out = gelu(a) * b, a and b are 4096x14336 bf16 (the SwiGLU-like gate)")
    assert s.dtype == "bfloat16" and [st["op"] for st in s.params["chain"]] == ["gelu", "mul"]


def test_gate_times_up_keeps_the_second_tensor():
    s = spec_of("silu(gate) * up for tensors of shape [8, 2048, 14336] bfloat16")
    assert [st["op"] for st in s.params["chain"]] == ["silu", "mul"]


def test_gated_units_in_words():
    s = spec_of("swiglu with x of 4096x11008 and gate of 4096x11008, bf16")
    assert [st["op"] for st in s.params["chain"]] == ["silu", "mul"]


def test_top_k_is_refused_as_sorting():
    res = parse_request("top-k 8 over the last dim of 1024x32000")
    assert not res.ok and "top-k" in res.message.lower()


@pytest.mark.parametrize("text,x", [
    ("3x3 convolution, stride 1, padding 1, 64 input channels, 64 output channels, batch 32, 56x56 images, fp16",
     (32, 64, 56, 56)),
    ("average pooling with kernel 3 stride 2 on a batch of 64 images of 128 channels and 28x28 pixels",
     (64, 128, 28, 28)),
])
def test_input_from_batch_channels_and_image_size_words(text, x):
    d = spec_of(text).dims
    assert (d["N"], d.get("C_in", d.get("C")), d["H"], d["W"]) == x


def test_outer_product_is_a_matmul_with_k_1_not_an_elementwise_mul():
    s = spec_of("outer product of a 1024 vector and a 512 vector in fp16")
    assert s.family == "matmul" and s.dims == {"M": 1024, "N": 512, "K": 1}
    assert spec_of("outer product of two vectors of length 1024").dims == {"M": 1024, "N": 1024, "K": 1}
    assert not parse_request("outer product of 4096x4096").ok


def test_gelu_approximate_tanh_keyword_is_one_step():
    s = spec_of("gelu approximate='tanh' on 4096x4096")
    assert [st["op"] for st in s.params["chain"]] == ["gelu_tanh"]


@pytest.mark.parametrize("text,stride,padding", [
    ("conv2d 3x3 s2 p1 on 8x32x64x64 -> 64 channels", [2, 2], [[1, 1], [1, 1]]),
    ("maxpool 3x3 s2 on 16x64x112x112", [2, 2], None),
])
def test_stride_and_padding_shorthands(text, stride, padding):
    # "s2 p1" were dropped in silence: the conv ran with stride 1 and no padding
    p = spec_of(text).params
    assert p["stride"] == stride and (padding is None or p["padding"] == padding)


def test_a_tensor_methods_numbers_are_its_arguments_not_a_shape():
    s = spec_of("x.clamp(0, 1) for 512x512")
    assert s.dims == {"M": 512, "N": 512} and [st["op"] for st in s.params["chain"]] == ["clamp_min", "clamp_max"]


@pytest.mark.parametrize("text,pro,epi", [
    ("the 2-norm of every row of 1000x300", ["square"], ["sqrt"]),
    ("the l2 norm of each row of a 4096x768 fp16 matrix", ["square"], ["sqrt"]),
    ("l1 norm of each row of 512x1024", ["abs"], []),
])
def test_the_norm_of_each_row_is_its_value_not_a_normalization(text, pro, epi):
    s = spec_of(text)
    assert (s.family, s.op) == ("reduction", "sum")
    assert [st["op"] for st in s.params.get("prologue", [])] == pro
    assert [st["op"] for st in s.params.get("epilogue", [])] == epi
    assert spec_of("l2 normalize the rows of a 32768x65535 tensor").op == "l2norm"


def test_depthwise_separable_is_two_convs_and_refused_as_one():
    res = parse_request("depthwise separable convolution on 8x32x64x64")
    assert not res.ok and "two convolutions" in res.message   # was served as the depthwise half alone


def test_no_dropout_is_context():
    assert spec_of("softmax with no dropout on a 2048x2048 tensor").op == "softmax"


@pytest.mark.parametrize("text", [
    "subtract the row max from each row of 1024x1024 then exp",   # was served as exp alone
    "exp(x) / sum(exp(x)) over rows of 1024x512",                 # was exp times 1/sum over the probe's points
])
def test_a_reduction_inside_a_pointwise_request_is_refused_not_dropped(text):
    assert not parse_request(text).ok


def test_subtracting_the_max_still_describes_a_softmax():
    assert spec_of("softmax over rows of a 1024x1024 tensor, subtracting the row max first").op == "softmax"


@pytest.mark.parametrize("text", [
    "non-causal attention, batch 2, 12 heads, sequence 4096, head size 64",
    "attention without a causal mask on 2x4x128x64",
    "causal=False attention on 2x4x128x64",
])
def test_a_negated_causal_mask_is_no_mask(text):
    assert spec_of(text).params["mask"] == "none"   # each was read as a causal mask


@pytest.mark.parametrize("text", ["layer norm without elementwise affine on 8192x1024",
                                  "group norm with 8 groups without learnable affine on 8x64x32x32"])
def test_no_affine_with_an_adjective_drops_the_weight(text):
    assert spec_of(text).params["affine"] is False   # the weight and bias were kept


@pytest.mark.parametrize("text,op", [
    ("batchnorm over batch 16, 64 channels, 128x128 images, fp16", "batchnorm"),
    ("instance norm on batch 8, 64 channels, 128x128 images", "instancenorm"),
])
def test_channel_norm_input_from_batch_channels_and_image_words(text, op):
    s = spec_of(text)
    assert s.op == op and s.dims == {"N": s.dims["N"], "C": 64, "S": 128 * 128}


def test_elementwise_on_batch_channels_and_image_words():
    s = spec_of("mish activation on a batch 16, 64 channels, 128x128 images, fp16")
    assert s.params["shape"] == [16, 64, 128, 128] and s.params["chain"] == [{"op": "mish"}]


@pytest.mark.parametrize("text", [
    "batched matmul of 16 matrices of size 512x512 times 512x512, fp16",
    "batched matrix multiply: 16 matrices of 512x512 by 512x512",
    "matrix multiply 16 batches of 512x512 by 512x512",
])
def test_a_count_of_matrices_is_the_batch_of_a_bmm(text):
    s = spec_of(text)
    assert (s.op, s.dims) == ("bmm", {"B": 16, "M": 512, "N": 512, "K": 512})
    assert spec_of("multiply two 2048 by 2048 matrices in bf16").op == "matmul"   # a size, not a count


@pytest.mark.parametrize("text,dims", [
    ("matvec 8192x4096 times a length 4096 vector, fp16", {"M": 8192, "N": 1, "K": 4096}),
    ("gemv 4096x4096 in bf16", {"M": 4096, "N": 1, "K": 4096}),   # not a square matmul
])
def test_matrix_vector_words(text, dims):
    assert spec_of(text).dims == dims


@pytest.mark.parametrize("text", ["fully connected layer 784 to 10 on a batch of 64", "fc 784 to 10, batch 64"])
def test_linear_layer_in_to_out_features(text):
    s = spec_of(text)
    assert s.dims == {"M": 64, "N": 10, "K": 784} and s.params["b_layout"] == "nk"


@pytest.mark.parametrize("text,what", [
    ("log cumsum exp of 64x128", "cumsum / cumprod"),               # was a plain cumsum
    ("binary cross entropy on 4096x4096", "binary cross entropy"),  # was the multi-class cross entropy
])
def test_near_namesakes_outside_the_catalog_are_refused(text, what):
    res = parse_request(text)
    assert not res.ok and what in res.message.lower()


def test_a_conv_call_on_tensors_is_refused_not_a_parser_error():
    res = parse_request("F.conv2d(x, w, stride=2, padding=1) with x 8x3x32x32 and w 16x3x3x3")
    assert not res.ok and "internal parser error" not in res.message.lower() and "in words" in res.message


@pytest.mark.parametrize("text,op,params", [
    ("F.group_norm(x, 8) on 16x64x32x32", "groupnorm", {"groups": 8, "affine": False}),
    ("F.batch_norm(x, rm, rv) on 16x64x32x32", "batchnorm", {"training": False, "affine": False}),
    ("F.instance_norm(x, weight=w, bias=b) on 8x16x32x32", "instancenorm", {"affine": True}),
    ("torch.prod(x, dim=1) on 128x64", "prod", {}),
])
def test_functional_norm_and_prod_calls(text, op, params):
    s = spec_of(text)   # each was refused ("not in the catalog", "no kernel op")
    assert s.op == op and all(s.params.get(k) == v for k, v in params.items()), s.params


@pytest.mark.parametrize("text,dims", [
    ("attention with 8 heads, 64 head dim, 1024 sequence length, batch size 2, causal, half",
     {"B": 2, "H": 8, "L": 1024, "S": 1024, "E": 64, "EV": 64}),
    ("rms norm over the last dimension of size 4096 with 2048 rows, bf16", {"M": 2048, "N": 4096}),
])
def test_sizes_said_before_their_name_or_as_of_size(text, dims):
    assert spec_of(text).dims == dims


@pytest.mark.parametrize("text,op,dims", [
    ("layer norm over the last two dims of 16x64x32x32", "layernorm", {"M": 1024, "N": 1024}),
    ("rms norm over the last three dims of 8x16x32x32, bf16", "rmsnorm", {"M": 8, "N": 16384}),
    ("softmax over dims 2 and 3 of a 16x64x32x32 tensor", "softmax", {"M": 1024, "N": 1024}),
])
def test_a_norm_or_softmax_over_the_last_dims_is_one_over_them_flattened(text, op, dims):
    res = parse_request(text)   # was refused: "row ops work along the last dim only"
    assert res.ok, res.message
    assert (res.spec.op, res.spec.dims) == (op, dims)
    assert any("flattened" in a for a in res.assumptions)


def test_a_norm_over_dims_that_do_not_end_the_tensor_is_still_refused():
    res = parse_request("layer norm over dims 1 and 2 of 16x64x32x32")
    assert not res.ok and "last dim" in res.message


@pytest.mark.parametrize("text,params", [
    ("softplus with threshold 10 on 1024x1024", {"value": 1.0, "threshold": 10.0}),
    ("softplus, beta=2, threshold=10, on a 1024x1024 tensor", {"value": 2.0, "threshold": 10.0}),
    ("softplus with beta 2 on 1024x1024", {"value": 2.0}),
])
def test_softplus_parameters_each_on_their_own(text, params):
    (step,) = spec_of(text).params["chain"]   # a threshold alone, or after a comma, was refused
    assert step == {"op": "softplus", **params}


@pytest.mark.parametrize("text", ["compute A^T B where A is 1024x512 and B is 1024x256",
                                  "A.T @ B with A 1024x512 and B 1024x256"])
def test_a_transposed_left_operand_is_refused_in_plain_words(text):
    res = parse_request(text)   # the message read "the left operand of @ must be a plain tensor"
    assert not res.ok and "left operand transposed (A^T B)" in res.message


@pytest.mark.parametrize("text,dims", [
    ("relu on a batch of 8 64x64 matrices", {"M": 512, "N": 64}),
    ("softmax over the last dim of 64x128, batch 4", {"M": 256, "N": 128}),
    ("gelu on a 32x4096 tensor, batch 32", {"M": 32, "N": 4096}),   # the batch is the shape's rows
])
def test_a_batch_beside_one_shape_is_its_leading_dim(text, dims):
    res = parse_request(text)   # was refused: "the shape 64x64 has 64 rows, but the request also says 8"
    assert res.ok, res.message
    assert res.spec.dims == dims


@pytest.mark.parametrize("text,gated,after", [
    ("hard sigmoid then multiply by x on a 1024x1024 tensor", [{"op": "hardsigmoid"}], []),
    ("softplus then tanh then multiply by the input on 4096x4096 fp16",
     [{"op": "softplus", "value": 1.0}, {"op": "tanh"}], []),
    ("tanh then multiply by the original input, then scale by 2, on a 1024x1024 tensor",
     [{"op": "tanh"}], [{"op": "scale", "value": 2.0}]),
])
def test_multiply_by_the_input_gates_the_steps_before_it(text, gated, after):
    chain = spec_of(text).params["chain"]   # was refused: "I saw 'multiply' but not what it applies to"
    assert chain == [{"op": "fork", "binop": "mul", "left": [], "right": gated}, *after]


@pytest.mark.parametrize("text,why", [
    ("matmul of 64x128 and 128x256 then gelu then multiply by the input", "elementwise chain of the input only"),
    ("multiply by the input on 1024x1024", "one run of steps on the input alone"),
])
def test_multiply_by_the_input_elsewhere_is_refused(text, why):
    res = parse_request(text)   # the matmul case once read 'multiply' as a second matmul and dropped it
    assert not res.ok and why in res.message


@pytest.mark.parametrize("text,shape", [
    ("elementwise addition of two float16 vectors of length 1,000,000", [1000000]),   # was "what 000 means"
    ("relu on a tensor of size 1,048,576", [1048576]),   # a 1-d "tensor of size N" was not read
    ("sigmoid on an input of length 65536 in fp16", [65536]),
])
def test_one_dim_sizes_with_digit_groups_and_size_words(text, shape):
    assert spec_of(text).params["shape"] == shape


def test_attention_scores_name_the_tensor_not_an_attention_op():
    # was refused: "ops of different kinds: 'attention' (attention), 'softmax' (softmax)"
    spec = spec_of("softmax along the last axis of a [32, 16, 1024, 1024] bf16 attention score tensor")
    assert (spec.op, spec.dims, spec.dtype) == ("softmax", {"M": 32 * 16 * 1024, "N": 1024}, "bfloat16")


@pytest.mark.parametrize("text,words", [
    # diag(a) @ B was read as "(a) @ b", a matrix-vector product: a wrong kernel
    ("diag(a) @ B for a of shape (4096,) and B 4096x4096", "diagonal"),
    ("B @ torch.diag(v) for B 4096x4096 and v of shape (4096,)", "diagonal"),
    # x * v[:, None] was read as x * v with v of x's shape
    ("x * v[:, None] for x 4096x4096", "indexing"),
])
def test_formulas_the_words_cannot_hold_are_refused_not_misread(text, words):
    result = parse_request(text)
    assert not result.ok and words in result.message.lower()


@pytest.mark.parametrize("text,chain", [
    ("1/sqrt(x) for x 4096x4096 half", [{"op": "rsqrt"}]),   # was "no tensor exponents"
    ("2 / (1 + x) on 64x64", [{"op": "shift", "value": 1.0}, {"op": "reciprocal"}, {"op": "scale", "value": 2.0}]),
    # the clamps said in words and again in parentheses ran twice
    ("clamp between 0 and 6 (relu6) on 128x1024x14x14",
     [{"op": "clamp_min", "value": 0.0}, {"op": "clamp_max", "value": 6.0}]),
    ("scale by 2 then scale by 2 on 64x64", [{"op": "scale", "value": 2.0}] * 2),   # not idempotent: kept
])
def test_reciprocals_and_repeated_idempotent_steps(text, chain):
    assert spec_of(text).params["chain"] == chain


@pytest.mark.parametrize("text,channels", [
    ("a 2x2 max pool with stride 2 on a batch of 64 RGB images 224x224", 3),   # was "not N x C x H x W"
    ("conv 3x3 with 16 output channels on 8 grayscale images of 64x64", 1),
])
def test_image_kind_gives_the_channel_count(text, channels):
    dims = spec_of(text).dims
    assert (dims.get("C", dims.get("C_in")), dims["H"], dims["W"]) == (channels, *(
        (224, 224) if "224" in text else (64, 64)))


@pytest.mark.parametrize("text,op,params", [
    # "log-probabilities" named the tensor and became log steps
    ("exp of log-probabilities 64x64", "chain", {"chain": [{"op": "exp"}]}),
    ("sum of the log-probs over rows of 4096x1000", "sum", {}),
    ("kl div of log-probs and probs, 4096x8192, reduction mean", "kl_div", {"reduction": "mean"}),
])
def test_log_nouns_are_no_log_step(text, op, params):
    spec = spec_of(text)
    assert (spec.op, spec.params) == (op, params)


def test_negative_log_likelihood_is_refused_not_two_logs():
    # was read as the chain log -> log: a wrong kernel
    result = parse_request("negative log likelihood of log-probabilities 8192x1000 with integer targets")
    assert not result.ok and "nll" in result.message.lower()


@pytest.mark.parametrize("text,chain", [
    # was square -> add -> square, (x^2 + y)^2: the second "squared" is y's
    ("x squared plus y squared for two 2048x2048 tensors", [{"op": "square"}, {"op": "add", "pre": [{"op": "square"}]}]),
    ("x plus y, squared, on two 64x64 tensors", [{"op": "add"}, {"op": "square"}]),
])
def test_a_step_said_after_the_second_operand_is_its_own(text, chain):
    assert spec_of(text).params["chain"] == chain


def test_moving_averages_are_refused_not_a_mean_of_exp():
    result = parse_request("exponential moving average over 4096x4096")   # was mean(exp(x))
    assert not result.ok and "moving average" in result.message.lower()


@pytest.mark.parametrize("text,dims,inner", [
    # "the sequence dimension" was ignored: the max ran over the features (the last dim)
    ("max over the sequence dimension of 32x512x768", {"M": 32 * 768, "N": 512}, 768),
    ("sum over the token axis of 512x768", {"M": 768, "N": 512}, 768),
    ("mean over the feature dim of 32x512x768", {"M": 32 * 512, "N": 768}, None),
])
def test_named_dims_of_a_sequence_tensor(text, dims, inner):
    spec = spec_of(text)
    assert (spec.dims, spec.params.get("inner")) == (dims, inner)


def test_a_dim_named_by_an_unknown_word_is_refused_not_taken_as_the_last():
    result = parse_request("softmax over the head dim of 8x16x128x128")
    assert not result.ok and "head dim" in result.message


@pytest.mark.parametrize("text,op,dims,layout", [
    # einsum in words was refused outright; its matrix-product forms are a matmul / bmm
    ("einsum bij,bjk->bik for 8x256x128 and 8x128x64", "bmm", {"B": 8, "M": 256, "N": 64, "K": 128}, None),
    ("einsum('ij,jk->ik') on a 256x128 and a 128x64 matrix", "matmul", {"M": 256, "N": 64, "K": 128}, None),
    ('einsum "mk,nk->mn" with 1024x512 and 2048x512 fp16', "matmul", {"M": 1024, "N": 2048, "K": 512}, "nk"),
])
def test_einsum_matrix_products_in_words(text, op, dims, layout):
    spec = spec_of(text)
    assert (spec.op, spec.dims, spec.params.get("b_layout")) == (op, dims, layout)


@pytest.mark.parametrize("text", ["einsum ij,ij->i for two 64x64 tensors", "einsum ji,jk->ik on 128x64 and 128x32"])
def test_other_einsums_are_refused_with_the_forms_served(text):
    result = parse_request(text)
    assert not result.ok and "not a matrix product" in result.message


@pytest.mark.parametrize("text,key,value", [
    # "ceil_mode=False" was read as ceil mode on; "count_include_pad False" was ignored (True)
    ("max pool kernel 2 stride 2 ceil_mode=False on 8x64x28x28", "ceil_mode", False),
    ("max pool kernel 2 stride 2 ceil_mode=True on 8x64x27x27", "ceil_mode", True),
    ("avg pool kernel 3 stride 1 padding 1 count_include_pad False on 8x64x28x28", "count_include_pad", False),
    ("max pool 2x2 return_indices=True on 8x64x28x28", "indices", True),
    ("max pooling 2 by 2 on a 32x64x112x112 tensor", "kernel", None),   # "2 by 2" was left over
])
def test_pool_keywords_with_their_values(text, key, value):
    params = spec_of(text).params
    assert params[key] == [2, 2] if value is None else params[key] is value


@pytest.mark.parametrize("text,dims,params", [
    # each was refused: channel counts as "256 channels to 64" / "64 in 64 out" / in=, and k= s= p=
    ("conv2d(in=32, out=64, k=5, s=2, p=2) on 8x32x64x64 bf16", {"C_in": 32, "C_out": 64, "OH": 32},
     {"kernel": [5, 5], "stride": [2, 2], "padding": [[2, 2], [2, 2]]}),
    ("a 1x1 conv projecting 256 channels to 64 on 32x256x56x56 fp16", {"C_in": 256, "C_out": 64, "OH": 56},
     {"kernel": [1, 1]}),
    ("grouped conv 3x3 with 8 groups, 64 in 64 out, on 16x64x56x56", {"C_in": 64, "C_out": 64, "OH": 54},
     {"groups": 8}),
    ("max pool k=3 s=2 p=1 on 8x64x56x56", {"C": 64, "OH": 28}, {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
])
def test_conv_and_pool_shorthands(text, dims, params):
    spec = spec_of(text)
    assert {k: spec.dims[k] for k in dims} == dims
    assert {k: spec.params[k] for k in params} == params
