"""Pooling requests in words -> the pool family's spec, and clear failures."""
from __future__ import annotations

import pytest

from mtmc.request.parse import parse_request

CASES = [
    ("max pool 3x3 stride 2 on a 16x64x112x112 fp16 tensor", "max_pool2d",
     {"N": 16, "C": 64, "H": 112, "W": 112, "OH": 55, "OW": 55}, "float16", {"kernel": [3, 3], "stride": [2, 2]}),
    ("2x2 average pooling of 8x32x64x64, then sigmoid", "avg_pool2d",
     {"N": 8, "C": 32, "H": 64, "W": 64, "OH": 32, "OW": 32}, "float32", {"epilogue": [{"op": "sigmoid"}]}),
    ("adaptive avg pool to 7x7 on 32x512x14x14 bf16, then relu", "adaptive_avg_pool2d",
     {"N": 32, "C": 512, "H": 14, "W": 14, "OH": 7, "OW": 7}, "bfloat16", {"epilogue": [{"op": "relu"}]}),
    ("global average pooling over a 64x2048x7x7 tensor", "adaptive_avg_pool2d",
     {"N": 64, "C": 2048, "H": 7, "W": 7, "OH": 1, "OW": 1}, "float32", {}),
    ("maxpool1d kernel 4 stride 2 dilation 2 on 16x32x4096 with indices", "max_pool1d",
     {"N": 16, "C": 32, "L": 4096, "OL": 2045}, "float32", {"dilation": [2], "indices": True}),
    ("avg pool 3x3x3 padding 1 ceil mode, not counting padding, on 2x16x32x32x32", "avg_pool3d",
     {"N": 2, "C": 16, "D": 32, "H": 32, "W": 32, "OD": 11, "OH": 11, "OW": 11}, "float32",
     {"padding": [1, 1, 1], "ceil_mode": True, "count_include_pad": False}),
    ("avg pool 4x4 divisor 10 on 2x3x16x16 float16", "avg_pool2d",
     {"N": 2, "C": 3, "H": 16, "W": 16, "OH": 4, "OW": 4}, "float16", {"divisor_override": 10}),
]


@pytest.mark.parametrize("text, op, dims, dtype, params", CASES)
def test_pool_requests(text, op, dims, dtype, params):
    r = parse_request(text)
    assert r.ok, r.message
    assert (r.spec.family, r.spec.op, r.spec.dims, r.spec.dtype) == ("pool", op, dims, dtype)
    for k, v in params.items():
        assert r.spec.params[k] == v, k


@pytest.mark.parametrize("text, words", [
    ("max_pool2d kernel 3 padding 2 on 1x3x8x8", "half the kernel"),
    ("average pooling 2x2 with dilation 2 on 1x3x8x8", "no dilation"),
    ("max pool 2x2", "shape"),
    ("adaptive max pool to 4 stride 2 on 2x3x16", "output size"),
])
def test_pool_failures_say_why(text, words):
    r = parse_request(text)
    assert not r.ok and words in r.message, r.message
