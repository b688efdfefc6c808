"""Words for row ops over other dims: softmax over a middle dim or the channel dim (strided specs
whose kernels pass against PyTorch), a reduction over all elements (one row, split), refusals."""
from __future__ import annotations

import pytest

from mtmc.kernels.families import softmax
from mtmc.request.parse import parse_request
from tests.test_family_rows import assert_correct


@pytest.mark.parametrize("text,op,dims,params", [
    ("softmax over dim 1 of a 16x64x56x56 fp32 tensor", "softmax", {"M": 16 * 56 * 56, "N": 64}, {"inner": 3136}),
    ("log softmax along the channel dim of a 32x128x64x64 tensor, then tanh", "log_softmax",
     {"M": 32 * 64 * 64, "N": 128}, {"inner": 4096, "epilogue": [{"op": "tanh"}]}),
    ("softmax over dim -2 of a [8, 300, 50] bf16 tensor then add a bias", "softmax", {"M": 400, "N": 300},
     {"inner": 50, "epilogue": [{"op": "bias"}]}),
])
def test_softmax_over_a_middle_dim(text, op, dims, params):
    r = parse_request(text)
    assert r.spec is not None, r.message
    assert (r.spec.family, r.spec.op, r.spec.dims, r.spec.params) == ("softmax", op, dims, params)


def test_a_parsed_channel_softmax_with_a_bias_is_correct():
    spec = parse_request("softmax along the channels of a 2x12x5x3 tensor then add a bias, then sigmoid").spec
    assert spec.params["inner"] == 15 and spec.params["epilogue"] == [{"op": "bias"}, {"op": "sigmoid"}]
    assert_correct(softmax.FAMILY, spec, softmax.FAMILY.default_config(spec, None))


@pytest.mark.parametrize("text,op", [("sum of all elements of a 8192x8192 tensor", "sum"),
                                     ("max over all dims of a 64x1024x1024 fp16 tensor", "max")])
def test_reduction_over_everything_is_one_row(text, op):
    r = parse_request(text)
    assert r.spec is not None, r.message
    assert r.spec.op == op and r.spec.dims["M"] == 1 and r.spec.dims["N"] == 8192 * 8192


def test_refusals_say_why():
    r = parse_request("softmax over dim 7 of a 16x64 tensor")
    assert r.spec is None and "dim 7" in r.message
    last = parse_request("softmax over dim 1 of a 16x64 tensor").spec
    assert last.dims == {"M": 16, "N": 64} and "inner" not in last.params   # the last dim: plain rows
