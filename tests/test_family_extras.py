"""Softmax over a middle dim (the strided [outer, dim, inner] layout) and split reductions over a
few long rows (x.sum(), torch.max(x)): kernels against PyTorch in the interpreter (the project's
checker: float64 truth, fp32 at 1e-4), every op and dtype, single-pass and looped, chains; the
default configs compile for sm_90 without spills."""
from __future__ import annotations

import pytest

from mtmc.kernels.families import _split, reduction, softmax
from mtmc.kernels.spec import KernelSpec
from mtmc.tools.hardware import PROFILES
from kernel_helpers import compile_defaults
from tests.test_family_rows import assert_correct, config

H200 = PROFILES["h200"]
BIAS = {"op": "add", "every": 7, "period": 12}   # a [C, 1, 1] bias over [B, C=12, 7]


def spec_of(family, op, M, N, dtype="float32", **params) -> KernelSpec:
    spec = KernelSpec(family.name, op, {"M": M, "N": N}, dtype, params)
    family.validate(spec)
    return spec


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_softmax_over_a_middle_dim(op, dtype):
    spec = spec_of(softmax.FAMILY, op, 3 * 7, 12, dtype, inner=7, epilogue=[BIAS, {"op": "sigmoid"}])
    assert_correct(softmax.FAMILY, spec, softmax.FAMILY.default_config(spec, H200))   # one tile, one read of x
    assert_correct(softmax.FAMILY, spec, {**config(32, rows=4), "num_stages": 2} | {"BLOCK_N": 32})


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_over_a_long_middle_dim_loops_with_an_online_max(op):
    spec = spec_of(softmax.FAMILY, op, 2 * 5, 300, inner=5, prologue=[{"op": "tanh"}], scale=0.5)
    cfg = config(64, rows=4, stages=2)
    assert_correct(softmax.FAMILY, spec, cfg)


def test_strided_softmax_default_keeps_the_dim_in_one_tile_and_fills_the_gpu():
    spec = spec_of(softmax.FAMILY, "softmax", 128 * 64 * 64, 128, inner=64 * 64)
    cfg = softmax.FAMILY.default_config(spec, H200)
    assert cfg["BLOCK_N"] == 128 and cfg["ROWS_PER_PROG"] * 128 <= softmax.STRIDED_TILE
    assert spec.dims["M"] // cfg["ROWS_PER_PROG"] >= 4 * H200.sms


@pytest.mark.parametrize("op", sorted(_split.COMBINE))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_split_reduction_over_one_long_row(op, dtype):
    spec = spec_of(reduction.FAMILY, op, 1, 1 << 24, dtype)
    cfg = reduction.FAMILY.default_config(spec, H200)
    assert cfg["SPLIT"] >= 256   # enough programs for 132 SMs
    assert_correct(reduction.FAMILY, spec, cfg, reduction.FAMILY.check_dims(spec, cfg))


@pytest.mark.parametrize("op", ["sum", "logsumexp", "max"])
def test_split_reduction_with_chains_and_several_rows(op):
    spec = spec_of(reduction.FAMILY, op, 3, 500, prologue=[{"op": "relu"}], epilogue=[{"op": "scale", "value": 2.0}])
    cfg = {**config(32, stages=2), "SPLIT": 4}
    assert_correct(reduction.FAMILY, spec, cfg)


def test_split_is_offered_only_where_it_helps():
    many_rows = spec_of(reduction.FAMILY, "sum", 4096, 4096)
    assert reduction.FAMILY.config_space(many_rows)["SPLIT"] == [1]
    # argmax / argmin split too now ((value, column) pairs: tests/test_family_extras2.py)
    assert reduction.FAMILY.config_space(spec_of(reduction.FAMILY, "argmax", 1, 1 << 20))["SPLIT"][-1] > 1
    with pytest.raises(ValueError, match="SPLIT"):
        reduction.FAMILY.render(many_rows, {**reduction.FAMILY.default_config(many_rows, H200), "SPLIT": 16})


def test_default_configs_compile_for_sm90_without_spills():
    specs = {"softmax dim1": spec_of(softmax.FAMILY, "softmax", 128 * 4096, 128, inner=4096,
                                     epilogue=[{"op": "add", "every": 4096, "period": 128}]),
             "log_softmax dim1 looped": spec_of(softmax.FAMILY, "log_softmax", 16 * 1024, 4096, inner=1024)}
    reports = compile_defaults({k: v.to_dict() for k, v in specs.items()})
    reports.update(compile_defaults({"sum all": spec_of(reduction.FAMILY, "sum", 1, 1 << 28).to_dict(),
                                     "max all fp16": spec_of(reduction.FAMILY, "max", 1, 1 << 28, "float16").to_dict()}))
    for name, report in reports.items():
        assert report["kernels"], name
        for kernel in report["kernels"]:
            assert kernel["error"] is None, f"{name}: {kernel['error']}"
            assert kernel["spill_bytes"] == 0 and kernel["regs"] <= 255, name
        assert report["violations"] == [], f"{name}: {report['violations']}"
