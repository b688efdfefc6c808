"""Batch / group / instance norm and L1 / L2 / Frobenius normalization requests in words -> the
norm family's spec, and clear failures."""
from __future__ import annotations

import pytest

from bench.tasks import NORM_TASKS
from mtmc.request.parse import parse_request

CASES = [
    ("batch norm on a 64x64x512x512 fp32 tensor", "batchnorm", {"N": 64, "C": 64, "S": 262144}, "float32",
     {"affine": True, "training": True}),
    ("batchnorm in eval mode on 32x128x56x56 bf16", "batchnorm", {"N": 32, "C": 128, "S": 3136}, "bfloat16",
     {"affine": True, "training": False}),
    ("BatchNorm2d with momentum 0.2 on 8x16x32x32 then gelu", "batchnorm", {"N": 8, "C": 16, "S": 1024}, "float32",
     {"affine": True, "training": True, "momentum": 0.2, "epilogue": [{"op": "gelu"}]}),
    ("group norm with 8 groups on 16x64x128x128 fp16, then relu", "groupnorm", {"N": 16, "C": 64, "S": 16384},
     "float16", {"affine": True, "groups": 8, "epilogue": [{"op": "relu"}]}),
    ("groupnorm groups=4 on a [8, 32, 16] half tensor without affine", "groupnorm", {"N": 8, "C": 32, "S": 16},
     "float16", {"affine": False, "groups": 4}),
    ("instance norm on 8x32x64x64 with affine", "instancenorm", {"N": 8, "C": 32, "S": 4096}, "float32",
     {"affine": True}),
    ("instance norm on 8x32x64x64, eps 1e-3", "instancenorm", {"N": 8, "C": 32, "S": 4096}, "float32", {"eps": 1e-3}),
    ("l2 normalize the rows of a 32768x65535 tensor", "l2norm", {"M": 32768, "N": 65535}, "float32", {}),
    ("L1 normalization of 4096x8192 fp16, eps 1e-12", "l1norm", {"M": 4096, "N": 8192}, "float16", {"eps": 1e-12}),
    ("frobenius norm normalization of a 112x64x512x512 tensor", "frobenius", {"M": 3670016, "N": 512}, "float32", {}),
]


@pytest.mark.parametrize("text, op, dims, dtype, params", CASES)
def test_norm_requests_parse(text, op, dims, dtype, params):
    r = parse_request(text)
    assert r.ok, r.message
    assert (r.spec.family, r.spec.op, r.spec.dims, r.spec.dtype) == ("norm", op, dims, dtype)
    assert r.spec.params == params


@pytest.mark.parametrize("text, words", [
    ("group norm on 16x64x128x128", "number of groups"),
    ("group norm with 3 groups on 2x8x4x4", "dividing C=8"),
    ("batch norm on 1x4", "more than one value per channel"),
    ("instance norm on 8x32", "spatial sizes"),
    ("relu then batch norm on 8x16x4x4", "comes before"),
    ("batch norm and group norm with 2 groups on 8x16x4x4", "one kernel computes one"),
    ("instance norm with momentum 0.1 on 8x16x4x4", "belong to a batch norm"),
    ("weight norm on 4x4", "not in the catalog"),
])
def test_refusals_say_why(text, words):
    r = parse_request(text)
    assert not r.ok and words in r.message, r.message


def test_the_benchmark_rows_parse():
    for text in NORM_TASKS:
        r = parse_request(text)
        assert r.ok and r.spec.family == "norm", (text, r.message)
