"""Convolution requests in words -> the conv family's spec, and clear failures."""
from __future__ import annotations

import pytest

from mtmc.kernels.families.conv import FAMILY as CONV
from mtmc.request.parse import parse_request

RELU, BIAS = {"op": "relu"}, {"op": "bias"}


def pads(*ps):
    return [[p, p] for p in ps]


# (request, op, dims, dtype, params other than the defaults: stride 1, padding 0, dilation 1, groups 1)
CASES = [
    ("conv2d 3x3 stride 2 padding 1 on 16x64x56x56 float16 with 128 output channels",
     "conv2d", {"N": 16, "C_in": 64, "C_out": 128, "H": 56, "W": 56, "OH": 28, "OW": 28}, "float16",
     {"kernel": [3, 3], "stride": [2, 2], "padding": pads(1, 1)}),
    ("a 3x3 conv with 64 in and 128 out channels, stride 2, on a 32x64x56x56 bf16 input, then relu",
     "conv2d", {"N": 32, "C_in": 64, "C_out": 128, "H": 56, "W": 56, "OH": 27, "OW": 27}, "bfloat16",
     {"kernel": [3, 3], "stride": [2, 2], "epilogue": [RELU]}),
    ("depthwise conv 5x5 padding 2 on a 8x96x112x112 bf16 input, then relu",
     "conv2d", {"N": 8, "C_in": 96, "C_out": 96, "H": 112, "W": 112, "OH": 112, "OW": 112}, "bfloat16",
     {"kernel": [5, 5], "padding": pads(2, 2), "groups": 96, "epilogue": [RELU]}),
    ("transposed conv1d kernel 4 stride 2 padding 1 on 8x32x1024 with 16 output channels and a bias",
     "conv_transpose1d", {"N": 8, "C_in": 32, "C_out": 16, "L": 1024, "OL": 2048}, "float32",
     {"kernel": [4], "stride": [2], "padding": pads(1), "output_padding": [0], "epilogue": [BIAS]}),
    ("conv_transpose2d kernel 3x3 stride 2 padding 1 output padding 1 groups 4 on 4x64x32x32 with 32 filters",
     "conv_transpose2d", {"N": 4, "C_in": 64, "C_out": 32, "H": 32, "W": 32, "OH": 64, "OW": 64}, "float32",
     {"kernel": [3, 3], "stride": [2, 2], "padding": pads(1, 1), "output_padding": [1, 1], "groups": 4}),
    ("conv3d kernel 3 padding same on (2, 16, 8, 32, 32), 32 output channels, with bias, then gelu then scale by 0.5",
     "conv3d", {"N": 2, "C_in": 16, "C_out": 32, "D": 8, "H": 32, "W": 32, "OD": 8, "OH": 32, "OW": 32}, "float32",
     {"kernel": [3, 3, 3], "padding": pads(1, 1, 1),
      "epilogue": [BIAS, {"op": "gelu"}, {"op": "scale", "value": 0.5}]}),
    ("1x1 pointwise conv from 64 to 256 channels on 32x64x28x28 fp16",
     "conv2d", {"N": 32, "C_in": 64, "C_out": 256, "H": 28, "W": 28, "OH": 28, "OW": 28}, "float16",
     {"kernel": [1, 1]}),
    ("convolution with kernel (3, 5), dilation 2, padding (2, 4) on a [4, 8, 20, 30] half tensor, 8 output channels, "
     "then add a residual", "conv2d", {"N": 4, "C_in": 8, "C_out": 8, "H": 20, "W": 30, "OH": 20, "OW": 30}, "float16",
     {"kernel": [3, 5], "dilation": [2, 2], "padding": pads(2, 4), "epilogue": [{"op": "residual"}]}),
    ("conv1d with kernel size 7 and same padding on 2x3x100, 5 output channels",
     "conv1d", {"N": 2, "C_in": 3, "C_out": 5, "L": 100, "OL": 100}, "float32",
     {"kernel": [7], "padding": pads(3)}),
    # the channel count right after the conv word was read as its kernel ("found the kernel twice")
    ("conv2d 3 input channels 64 output channels kernel 7 stride 2 padding 3 on 32x3x224x224 fp16",
     "conv2d", {"N": 32, "C_in": 3, "C_out": 64, "H": 224, "W": 224, "OH": 112, "OW": 112}, "float16",
     {"kernel": [7, 7], "stride": [2, 2], "padding": pads(3, 3)}),
]


@pytest.mark.parametrize("text, op, dims, dtype, params", CASES)
def test_conv_requests(text, op, dims, dtype, params):
    result = parse_request(text)
    assert result.ok, result.message
    spec = result.spec
    r = len(params["kernel"])
    want = {"stride": [1] * r, "padding": pads(*[0] * r), "dilation": [1] * r, "groups": 1, **params}
    assert (spec.family, spec.op, spec.dims, spec.dtype) == ("conv", op, dims, dtype)
    assert spec.params == want
    CONV.validate(spec)
    assert spec.request == text


def test_stated_defaults():
    result = parse_request("conv2d on 2x16x32x32")
    assert result.ok and result.spec.params["kernel"] == [3, 3] and result.spec.dims["C_out"] == 16
    said = " ".join(result.assumptions)
    assert "kernel size" in said and "output channel" in said and "float32" in said


@pytest.mark.parametrize("text, words", [
    ("write me a convolution", ["convolution", "shape", "i can write"]),
    ("write me a 3x3 convolution over a 224x224 image", ["224x224", "n x c x h x w"]),
    ("conv2d 3x3 on 16x64x56x56 with 100 output channels groups 3", ["groups=3", "dividing"]),
    ("relu then conv2d 3x3 on 1x3x8x8", ["relu", "before the conv"]),
    ("conv2d 3x3 with 32 input channels on 2x16x8x8", ["16 channels", "32 input channels"]),
    ("conv2d 3x3 output padding 1 on 2x16x8x8", ["output padding", "transposed"]),
    ("transposed conv2d 3x3 padding same on 2x16x8x8", ["same"]),
    ("conv2d 3x3 stride 2 on 2x16x8x8 then softmax", ["different kinds"]),
    ("conv2d kernel 3x3x3 on 2x16x8x8", ["3x3x3", "2d conv"]),
])
def test_conv_failures_say_why(text, words):
    result = parse_request(text)
    assert not result.ok
    message = result.message.lower()
    for w in words:
        assert w in message, (w, result.message)
