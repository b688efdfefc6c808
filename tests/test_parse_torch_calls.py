"""PyTorch calls written as code in a request (request.torch_calls): each is read against its
PyTorch signature into the same spec as the words; each of these was refused before (or, for the
attention and pooling calls, crashed the parser)."""
import pytest

from mtmc.request.parse import parse_request
from mtmc.request.torch_calls import rewrite_calls
from tests.test_parse_phrasings import spec_of


def test_conv_module_positional_and_keyword_arguments():
    s = spec_of("nn.Conv2d(3, 64, kernel_size=3, padding=1) applied to a 8x3x224x224 image batch")
    assert s.op == "conv2d" and (s.dims["C_in"], s.dims["C_out"], s.dims["OH"]) == (3, 64, 224)
    assert s.params["padding"] == [[1, 1], [1, 1]] and s.params.get("epilogue") == [{"op": "bias"}]
    t = spec_of("torch.nn.ConvTranspose2d(64, 32, 4, 2, 1, bias=False) on 8x64x32x32")
    assert t.op == "conv_transpose2d" and t.dims["OH"] == 64 and not t.params.get("epilogue")


def test_pool_module_and_functional():
    s = spec_of("nn.MaxPool2d(3, 2, 1) over 16x64x112x112")
    assert s.op == "max_pool2d" and s.dims["OH"] == 56
    a = spec_of("F.avg_pool1d(x, 4) on 8x32x1024")
    assert a.op == "avg_pool1d" and a.dims["OL"] == 256
    g = spec_of("nn.AdaptiveAvgPool2d((1, 1)) on 32x2048x7x7")
    assert g.op == "adaptive_avg_pool2d"


@pytest.mark.parametrize("text,op,c", [
    ("nn.GroupNorm(32, 256) on 8x256x64x64", "groupnorm", 256),
    ("nn.BatchNorm2d(128) on 32x128x28x28", "batchnorm", 128),
    ("nn.InstanceNorm2d(64, affine=True) on a 4x64x128x128 input", "instancenorm", 64),
])
def test_channel_norm_modules(text, op, c):
    s = spec_of(text)
    assert s.op == op and s.dims["C"] == c


def test_norm_module_channels_must_match_the_input():
    res = parse_request("nn.BatchNorm2d(64) on 32x128x28x28")
    assert not res.ok and "128 channels" in res.message


def test_layer_norm_module_and_normalize():
    s = spec_of("nn.LayerNorm(768, eps=1e-6) on x of shape (32, 128, 768)")
    assert s.op == "layernorm" and s.dims["N"] == 768 and s.params["eps"] == 1e-6
    n = spec_of("F.normalize(x, p=1, dim=1) for a 1024x512 matrix")
    assert n.op == "l1norm"


@pytest.mark.parametrize("text,family,op", [
    ("torch.cumsum(x, dim=1) where x is 16x8192", "scan", "cumsum"),
    ("x.cumprod(-1) for 32x1024", "scan", "cumprod"),
    ("torch.logsumexp(x, dim=1) of 512x2048", "reduction", "logsumexp"),
    ("F.cross_entropy(logits, labels) with logits 512x10000", "loss", "cross_entropy"),
    ("nn.SmoothL1Loss(beta=0.5) on 4096x512 predictions and targets", "loss", "smooth_l1"),
    ("F.triplet_margin_loss(a, p, n, margin=0.5) for 128x4096 embeddings", "loss", "triplet_margin"),
])
def test_scan_reduction_and_loss_calls(text, family, op):
    s = spec_of(text)
    assert (s.family, s.op) == (family, op)


def test_sdpa_call_causal_and_mask_left_to_the_words():
    s = spec_of("scaled_dot_product_attention(q, k, v, is_causal=True) with q, k, v of shape 4x16x1024x64 fp16")
    assert s.family == "attention" and s.params["mask"] == "causal"
    res = parse_request("F.scaled_dot_product_attention(q, k, v, attn_mask=m) with q, k, v of shape 4x16x1024x64")
    assert not res.message.startswith("Internal parser error")


def test_calls_the_words_cannot_say_are_left_as_written():
    assert rewrite_calls("nn.layernorm((64, 32)) on 8x64x32") == "nn.layernorm((64, 32)) on 8x64x32"
    assert rewrite_calls("nn.conv2d(3) on 8x3x32x32") == "nn.conv2d(3) on 8x3x32x32"   # no out channels
    assert rewrite_calls("torch.softmax(x, dim=-1)") == "torch.softmax(x, dim=-1)"      # the formula phase's


def test_max_values_after_a_call_is_read_whole_and_not_misread():
    res = parse_request("torch.exp(x - x.max(dim=-1, keepdim=True).values) for 256x256")
    assert not res.ok and "twice" in res.message   # once read as "max after exp"
    assert spec_of("x.max(dim=-1).indices for a 256x1024 tensor").op == "argmax"
