"""The norm family's batch / group / instance norms, Frobenius, L1 and L2 normalizations and the
split path of layer / RMS norms: generated kernels against PyTorch in the interpreter (float64
truth, fresh random inputs), the split template forced with small tiles and splits (the code path
of statistics over millions of elements), batch norm's running-buffer update, the default
configs' sm_90 resources, and the specs' refusals."""
from __future__ import annotations

import pytest
import torch

from mtmc.kernels import catalog
from mtmc.kernels.families.norm import FAMILY as NORM
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import check
from mtmc.tools.hardware import PROFILES
from mtmc.tools.loader import load_source
from kernel_helpers import compile_defaults

H200 = PROFILES["h200"]
# small tiles and several programs per statistic: the split path at interpreter sizes
SMALL = {"BLOCK_P": 2, "BLOCK_T": 2, "BLOCK_Q": 16, "SPLIT": 4, "NORM_BLOCK": 256, "num_warps": 4, "norm_warps": 4}


def small_config(spec: KernelSpec, **knobs) -> dict:
    cfg = NORM.default_config(spec, H200)
    space = NORM.config_space(spec)
    for k, v in {**SMALL, **knobs}.items():
        if k in space and v in space[k]:
            cfg[k] = v
    return cfg


def assert_matches_torch(spec: KernelSpec, cfg: dict, dims: dict | None = None):
    NORM.validate(spec)
    result = check(spec, NORM.render(spec, cfg), dims or spec.dims, device="cpu", trials=1)
    assert result.ok, f"{result.reason}\nspec={spec}\nconfig={cfg}"


CASES = [
    ("batchnorm", {"N": 3, "C": 5, "S": 37}, {}),
    ("batchnorm", {"N": 9, "C": 7, "S": 1}, {"affine": False}),                      # BatchNorm1d on [N, C]
    ("batchnorm", {"N": 3, "C": 5, "S": 20}, {"training": False}),                  # running statistics
    ("batchnorm", {"N": 2, "C": 4, "S": 30}, {"epilogue": [{"op": "gelu"}, {"op": "relu"}]}),
    ("groupnorm", {"N": 2, "C": 8, "S": 30}, {"groups": 4}),
    ("groupnorm", {"N": 3, "C": 6, "S": 1}, {"groups": 2, "affine": False, "epilogue": [{"op": "clamp_min", "value": 0.1}]}),
    ("groupnorm", {"N": 2, "C": 6, "S": 25}, {"groups": 3, "epilogue": [{"op": "add"}]}),   # a residual
    ("groupnorm", {"N": 2, "C": 4, "S": 9},                                          # a [C, 1] operand
     {"groups": 2, "epilogue": [{"op": "mul", "every": 9, "period": 4}]}),
    ("instancenorm", {"N": 2, "C": 3, "S": 50}, {}),
    ("instancenorm", {"N": 2, "C": 3, "S": 50}, {"affine": True, "epilogue": [{"op": "scale", "value": 0.5}]}),
    ("frobenius", {"M": 5, "N": 70}, {}),
    ("l2norm", {"M": 5, "N": 70}, {}),
    ("l2norm", {"M": 5, "N": 70}, {"eps": 1e-12, "epilogue": [{"op": "tanh"}]}),
    ("l1norm", {"M": 4, "N": 33}, {"eps": 1e-12}),
    ("layernorm", {"M": 3, "N": 100}, {}),
    ("rmsnorm", {"M": 3, "N": 100}, {"prologue": [{"op": "shift", "value": 1.0}]}),
    # a conv's activation before the norm, applied on the loads (regroup's library conv + tail);
    # the padding of the last tile must not count in the statistics (sigmoid(0) != 0)
    ("groupnorm", {"N": 2, "C": 8, "S": 29}, {"groups": 4, "prologue": [{"op": "sigmoid"}, {"op": "scale", "value": 2.0}]}),
    ("batchnorm", {"N": 3, "C": 5, "S": 21}, {"prologue": [{"op": "gelu"}], "epilogue": [{"op": "tanh"}]}),
    ("instancenorm", {"N": 2, "C": 3, "S": 47}, {"prologue": [{"op": "shift", "value": 3.0}, {"op": "relu"}]}),
]


@pytest.mark.parametrize("op, dims, params", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_split_template_matches_torch(op, dims, params):
    spec = KernelSpec("norm", op, dims, "float32", params)
    cfg = small_config(spec)
    if op in ("layernorm", "rmsnorm", "l1norm", "l2norm"):   # the row ops' split path
        cfg.update(BLOCK_N=32, ROWS_PER_PROG=2, SPLIT=4)
    assert_matches_torch(spec, cfg)


@pytest.mark.parametrize("op, params", [("l2norm", {}), ("l1norm", {"eps": 1e-12}), ("rmsnorm", {}),
                                        ("l2norm", {"epilogue": [{"op": "relu"}]})])
@pytest.mark.parametrize("block", [128, 32])   # one tile per row, and chunks along it
def test_row_template_serves_l1_l2(op, params, block):
    spec = KernelSpec("norm", op, {"M": 5, "N": 100}, "float32", params)
    cfg = {**NORM.default_config(spec, H200), "BLOCK_N": block, "ROWS_PER_PROG": 2, "SPLIT": 1}
    assert_matches_torch(spec, cfg)


@pytest.mark.parametrize("op, params", [("rmsnorm", {"eps": 1e-5}), ("l2norm", {"eps": 1e-12}), ("l1norm", {}),
                                        ("rmsnorm", {"epilogue": [{"op": "relu"}, {"op": "add"}]})])
@pytest.mark.parametrize("block", [64, 32])   # the channels in one tile, and in chunks
def test_norms_over_a_middle_dim_read_x_in_place(op, params, block):
    """x [2, 40, 12] normalized over dim 1 (spec inner=12): the strided row layout, out laid out as x."""
    spec = KernelSpec("norm", op, {"M": 24, "N": 40}, "float32", {"inner": 12, **params})
    cfg = {**NORM.default_config(spec, H200), "BLOCK_N": block, "ROWS_PER_PROG": 4}
    assert NORM.config_space(spec)["SPLIT"] == [1]
    assert_matches_torch(spec, cfg)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op, dims, params", [("batchnorm", {"N": 2, "C": 3, "S": 40}, {}),
                                              ("groupnorm", {"N": 2, "C": 4, "S": 20}, {"groups": 2}),
                                              ("frobenius", {"M": 3, "N": 50}, {})])
def test_half_precisions(op, dims, params, dtype):
    spec = KernelSpec("norm", op, dims, dtype, params)
    assert_matches_torch(spec, small_config(spec))


def test_default_configs_run_at_their_check_dims():
    for spec in [KernelSpec("norm", "batchnorm", {"N": 64, "C": 64, "S": 262144}),
                 KernelSpec("norm", "groupnorm", {"N": 1024, "C": 8192, "S": 1}, params={"groups": 512}),
                 KernelSpec("norm", "batchnorm", {"N": 1024, "C": 8192, "S": 1}),
                 KernelSpec("norm", "frobenius", {"M": 112 * 64 * 512, "N": 512}),
                 KernelSpec("norm", "layernorm", {"M": 16, "N": 64 * 256 * 256})]:
        cfg = NORM.default_config(spec, H200)
        space = NORM.config_space(spec)
        assert all(cfg[k] in v for k, v in space.items()), (spec, cfg)
        dims = NORM.check_dims(spec, cfg)
        assert sum(dims.values()) < sum(spec.dims.values()) or dims == spec.dims
        assert_matches_torch(spec, cfg, dims)


def _run(spec: KernelSpec, cfg: dict, x: torch.Tensor, *vectors, **kwargs) -> torch.Tensor:
    module = load_source(NORM.render(spec, cfg), f"norm_direct_{spec.key()}")
    out = torch.empty_like(x)
    module.launch(x, *vectors, out=out, **kwargs)
    return out


def test_statistics_keep_their_accuracy_when_the_mean_dwarfs_the_spread():
    """Mean 300, spread 0.1: E[x^2] - E[x]^2 in fp32 would get the variance wrong by about half;
    what is left is fp32's own rounding of x - mean (ulp(300) / 0.1 = 3e-4)."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 300) * 0.1 + 300.0
    for op, params, ref in [
        ("batchnorm", {"affine": False}, lambda t: torch.nn.functional.batch_norm(t, None, None, training=True)),
        ("groupnorm", {"groups": 2, "affine": False}, lambda t: torch.nn.functional.group_norm(t, 2)),
    ]:
        spec = KernelSpec("norm", op, {"N": 3, "C": 4, "S": 300}, "float32", params)
        got = _run(spec, small_config(spec, BLOCK_Q=32, SPLIT=8), x)
        torch.testing.assert_close(got.double(), ref(x.double()), rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_training_updates_the_running_buffers_as_pytorch(momentum):
    torch.manual_seed(1)
    x, w, b = torch.randn(4, 3, 21) + 2.0, torch.rand(3) + 0.5, torch.randn(3)
    spec = KernelSpec("norm", "batchnorm", {"N": 4, "C": 3, "S": 21}, "float32", {"momentum": momentum})
    rm, rv, nbt = torch.randn(3), torch.rand(3) + 0.5, torch.tensor(4)
    rm_t, rv_t, nbt_t = rm.clone(), rv.clone(), nbt.clone()
    got = _run(spec, small_config(spec), x, w, b, running_mean=rm, running_var=rv, num_batches_tracked=nbt)
    nbt_t += 1
    factor = momentum if momentum is not None else 1.0 / float(nbt_t)
    want = torch.nn.functional.batch_norm(x, rm_t, rv_t, w, b, True, factor, 1e-5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rm, rm_t, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rv, rv_t, rtol=1e-5, atol=1e-6)
    assert int(nbt) == int(nbt_t)


def test_check_rejects_a_kernel_with_the_wrong_group_statistics():
    spec = KernelSpec("norm", "groupnorm", {"N": 2, "C": 4, "S": 10}, "float32", {"groups": 2})
    source = NORM.render(spec, small_config(spec)).replace("SA, SB = G, C // G", "SA, SB = G, C")
    assert not check(spec, source, spec.dims, device="cpu", trials=1).ok


# -- sm_90 resources of the defaults -----------------------------------------------------------------
COMPILE_SPECS = {  # KernelBench shapes
    "batchnorm2d": KernelSpec("norm", "batchnorm", {"N": 64, "C": 64, "S": 512 * 512}),
    "batchnorm1d": KernelSpec("norm", "batchnorm", {"N": 1024, "C": 8192, "S": 1}, params={"epilogue": [{"op": "gelu"}]}),
    "groupnorm": KernelSpec("norm", "groupnorm", {"N": 112, "C": 64, "S": 512 * 512}, params={"groups": 8}),
    "groupnorm_gemm": KernelSpec("norm", "groupnorm", {"N": 1024, "C": 8192, "S": 1}, params={"groups": 512}),
    "instancenorm": KernelSpec("norm", "instancenorm", {"N": 128, "C": 128, "S": 126 * 126},
                               params={"epilogue": [{"op": "scale", "value": 0.5}]}),
    "frobenius": KernelSpec("norm", "frobenius", {"M": 112 * 64 * 512, "N": 512}),
    "l2norm": KernelSpec("norm", "l2norm", {"M": 32768, "N": 65535}),
    "layernorm_split": KernelSpec("norm", "layernorm", {"M": 16, "N": 64 * 256 * 256}),
    "rmsnorm_channels": KernelSpec("norm", "rmsnorm", {"M": 112 * 512 * 512, "N": 64},
                                   params={"inner": 512 * 512, "affine": False}),
}

def test_default_configs_compile_for_sm90_without_spills():
    specs = {}
    for name, spec in COMPILE_SPECS.items():
        specs[f"{name} float32"] = spec.to_dict()
    specs["batchnorm2d bfloat16"] = {**COMPILE_SPECS["batchnorm2d"].to_dict(), "dtype": "bfloat16"}
    specs["groupnorm float16"] = {**COMPILE_SPECS["groupnorm"].to_dict(), "dtype": "float16"}
    reports = compile_defaults(specs)
    for name, report in reports.items():
        assert report["violations"] == [], f"{name}: {report['violations']}"
        names = {k["name"] for k in report["kernels"]}
        assert names & {"norm_apply", "layernorm_kernel", "l2norm_kernel", "rmsnorm_kernel"}, (name, names)
        for k in report["kernels"]:
            assert k["error"] is None, f"{name} {k['name']}: {k['error']}"
            assert k["spill_bytes"] == 0 and k["regs"] <= 255, (name, k)
            assert 0 <= k["shared_bytes"] <= H200.smem_per_block, (name, k)


# -- the plain-data parts -----------------------------------------------------------------------------
@pytest.mark.parametrize("op, dims, params, match", [
    ("groupnorm", {"N": 2, "C": 6, "S": 4}, {"groups": 4}, "dividing C"),
    ("groupnorm", {"N": 2, "C": 6, "S": 4}, {}, "groups"),
    ("batchnorm", {"N": 1, "C": 6, "S": 1}, {}, "more than one value"),
    ("batchnorm", {"N": 2, "C": 6, "S": 4}, {"momentum": 2.0}, "momentum"),
    ("batchnorm", {"M": 2, "N": 6}, {}, "dims N"),
    ("instancenorm", {"N": 2, "C": 6, "S": 4}, {"groups": 2}, "does not understand"),
    ("batchnorm", {"N": 2, "C": 6, "S": 4}, {"epilogue": [{"op": "bias"}]}, "vectors"),
    ("l2norm", {"M": 2, "N": 6}, {"eps": -1.0}, "eps"),
    ("frobenius", {"M": 2, "N": 6}, {"prologue": [{"op": "relu"}]}, "prologue"),
])
def test_validate_refuses_in_plain_words(op, dims, params, match):
    with pytest.raises(ValueError, match=match):
        NORM.validate(KernelSpec("norm", op, dims, "float32", params))


def test_catalog_descriptions_and_work():
    spec = KernelSpec("norm", "groupnorm", {"N": 8, "C": 64, "S": 1024}, "float16", {"groups": 8})
    assert catalog.family_of(spec) is NORM
    assert "8 groups" in catalog.describe(spec) and "8x64x1024" in catalog.describe(spec)
    flops, nbytes = NORM.work(spec)
    assert nbytes == (2 * 8 * 64 * 1024 + 2 * 64) * 2 and flops > 0
    assert "running statistics" in NORM.describe(KernelSpec("norm", "batchnorm", {"N": 2, "C": 3, "S": 4},
                                                            params={"training": False}))
