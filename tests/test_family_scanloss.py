"""The scan and loss families: generated kernels against PyTorch (float64) in the interpreter on
fresh random inputs, every variant, the default configs' sm_90 resources, and refusals."""
from __future__ import annotations

import itertools

import pytest
from kernel_helpers import compile_defaults

from mtmc.kernels import catalog
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import check
from mtmc.tools.hardware import PROFILES

H200 = PROFILES["h200"]


def assert_matches_torch(spec: KernelSpec, knobs: dict | None = None, dims: dict | None = None):
    fam = catalog.family_of(spec)
    fam.validate(spec)
    config = {**fam.default_config(spec, H200), **(knobs or {})}
    dims = dims or fam.check_dims(spec, config)
    result = check(spec, fam.render(spec, config), dims, device="cpu", trials=1)
    assert result.ok, f"{result.reason}\nspec={spec}\nconfig={config}"


SCAN_SMALL = {"BLOCK_N": 32, "SPLIT": 2, "ROWS_PER_PROG": 2}


@pytest.mark.parametrize("op, reverse, exclusive, masked",
                         [(op, *flags) for op in ("cumsum", "cumprod")
                          for flags in itertools.product([False, True], repeat=3)])
def test_scan_variants_match_torch(op, reverse, exclusive, masked):
    """A two-level scan (SPLIT segments of several chunks, a ragged tail, packed rows)."""
    params = {k: v for k, v in (("reverse", reverse), ("exclusive", exclusive), ("masked", masked)) if v}
    assert_matches_torch(KernelSpec("scan", op, {"M": 5, "N": 200}, "float32", params), SCAN_SMALL)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_scan_chains_half_precision_and_middle_dim(dtype):
    chains = {"prologue": [{"op": "scale", "value": 2.0}], "epilogue": [{"op": "relu"}, {"op": "add"}]}
    assert_matches_torch(KernelSpec("scan", "cumsum", {"M": 6, "N": 100}, dtype, chains), {"BLOCK_N": 32})
    assert_matches_torch(KernelSpec("scan", "cumsum", {"M": 12, "N": 50}, dtype, {"inner": 4, "reverse": True}))


def test_long_rows_split_to_fill_the_gpu_and_stay_accurate():
    """Few long rows: the default cuts them into segments (a two-level scan) and the fp32 result
    holds 1e-4 against float64 over 32768 elements."""
    spec = KernelSpec("scan", "cumsum", {"M": 128, "N": 32768}, "float32", {})
    cfg = catalog.family_of(spec).default_config(spec, H200)
    assert cfg["SPLIT"] > 1 and 128 * cfg["SPLIT"] >= 4 * H200.sms
    many = KernelSpec("scan", "cumsum", {"M": 32768, "N": 32768}, "float32", {})
    assert catalog.family_of(many).default_config(many, H200)["SPLIT"] == 1
    assert_matches_torch(spec, dims={"M": 2, "N": 32768})


LOSSES = [("mse", {}), ("l1", {"reduction": "sum"}), ("smooth_l1", {"beta": 0.5}),
          ("smooth_l1", {"beta": 0.0, "reduction": "none"}), ("huber", {"delta": 2.0, "reduction": "none"}),
          ("kl_div", {"reduction": "batchmean"}), ("kl_div", {"log_input": True, "reduction": "sum"}),
          ("kl_div", {"log_target": True}), ("hinge_embedding", {"margin": 0.5}),
          ("total", {"prologue": [{"op": "mul", "every": 1, "period": 7}, {"op": "neg"},
                                  {"op": "shift", "value": 1.0}, {"op": "clamp_min", "value": 0.0}]}),
          ("total", {"reduction": "sum", "prologue": [{"op": "sub"}, {"op": "square"}]})]
ROW_LOSSES = [("cross_entropy", {}), ("cross_entropy", {"reduction": "none"}),
              ("cross_entropy", {"reduction": "sum", "ignore_index": 3}),
              ("cross_entropy", {"label_smoothing": 0.1, "ignore_index": 3}),
              ("cross_entropy", {"label_smoothing": 0.3, "reduction": "none"}), ("triplet_margin", {}),
              ("triplet_margin", {"p": 1.0, "swap": True, "reduction": "sum"}),
              ("triplet_margin", {"p": 3.0, "margin": 0.3, "reduction": "none"}),
              ("cosine_similarity", {"reduction": "none"}),
              # cos(a, b).mean() with no epilogue: the reference returned the rows unreduced
              ("cosine_similarity", {}), ("cosine_similarity", {"reduction": "sum"}),
              ("cosine_similarity", {"epilogue": [{"op": "neg"}, {"op": "shift", "value": 1.0}]}),
              ("cosine_embedding", {"margin": 0.2})]


@pytest.mark.parametrize("op, params", LOSSES)
def test_elementwise_losses_match_torch(op, params):
    """More chunks than the off-GPU grid has programs: the grid-stride loop and the partials turn."""
    assert_matches_torch(KernelSpec("loss", op, {"M": 6, "N": 700}, "float32", params), {"BLOCK": 256, "WAVES": 2})


@pytest.mark.parametrize("op, params", ROW_LOSSES)
def test_row_losses_match_torch(op, params):
    assert_matches_torch(KernelSpec("loss", op, {"M": 9, "N": 100}, "float32", params),
                         {"BLOCK_N": 32, "ROWS_PER_PROG": 2})


@pytest.mark.parametrize("op", ["cross_entropy", "triplet_margin", "mse"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_losses_half_precision(op, dtype):
    knobs = {"BLOCK": 256, "WAVES": 2} if op == "mse" else {"BLOCK_N": 32, "ROWS_PER_PROG": 2}
    assert_matches_torch(KernelSpec("loss", op, {"M": 5, "N": 300}, dtype, {}), knobs)


COMPILE_SPECS = {  # KernelBench level-1 shapes and the held-out kinds
    "cumsum 32768x32768": KernelSpec("scan", "cumsum", {"M": 32768, "N": 32768}, "float32", {}),
    "cumsum 128x32768 reverse masked": KernelSpec("scan", "cumsum", {"M": 128, "N": 32768}, "float32",
                                                  {"reverse": True, "masked": True}),
    "cumprod exclusive": KernelSpec("scan", "cumprod", {"M": 4096, "N": 4000}, "float32", {"exclusive": True}),
    "cumsum middle dim": KernelSpec("scan", "cumsum", {"M": 64 * 512, "N": 256}, "float32", {"inner": 512}),
    "cross_entropy": KernelSpec("loss", "cross_entropy", {"M": 32768, "N": 4096}, "float32", {}),
    "triplet_margin": KernelSpec("loss", "triplet_margin", {"M": 32768, "N": 8192}, "float32", {}),
    "cosine_similarity": KernelSpec("loss", "cosine_similarity", {"M": 32768, "N": 8192}, "float32",
                                    {"epilogue": [{"op": "neg"}, {"op": "shift", "value": 1.0}]}),
    "cosine_embedding": KernelSpec("loss", "cosine_embedding", {"M": 32768, "N": 8192}, "float32", {}),
    "huber": KernelSpec("loss", "huber", {"M": 32768, "N": 32768}, "float32", {}),
    "kl_div": KernelSpec("loss", "kl_div", {"M": 32768, "N": 32768}, "float32",
                         {"reduction": "batchmean", "log_input": True}),
    "hinge": KernelSpec("loss", "total", {"M": 32768, "N": 32768}, "float32",
                        {"prologue": [{"op": "mul", "every": 1, "period": 32768}, {"op": "neg"},
                                      {"op": "shift", "value": 1.0}, {"op": "clamp_min", "value": 0.0}]}),
}


def test_default_configs_compile_for_sm90_without_spills():
    specs = {}
    for name, spec in COMPILE_SPECS.items():
        for dtype in ("float32", "bfloat16"):
            specs[f"{name} {dtype}"] = {**spec.to_dict(), "dtype": dtype}
    for name, report in compile_defaults(specs).items():
        assert report["kernels"], name
        for kernel in report["kernels"]:
            assert kernel["error"] is None, f"{name}: {kernel['error']}"
            assert kernel["spill_bytes"] == 0 and kernel["regs"] <= 255, f"{name}: {kernel}"
        assert report["violations"] == [], f"{name}: {report['violations']}"


@pytest.mark.parametrize("family, op, params, match", [
    ("scan", "cumsum", {"reverse": "yes"}, "true or false"),
    ("scan", "cumsum", {"inner": 2, "epilogue": [{"op": "relu"}]}, "middle dim"),
    ("scan", "cumsum", {"dim": 0}, "does not understand"),
    ("loss", "mse", {"reduction": "batchmean"}, "batchmean"),
    ("loss", "total", {"reduction": "none"}, "mean or a sum"),
    ("loss", "huber", {"delta": 0.0}, "delta > 0"),
    ("loss", "cross_entropy", {"weight": 0.1}, "does not take"),
    ("loss", "cosine_similarity", {"epilogue": [{"op": "add"}]}, "no tensor operands"),
])
def test_refusals_in_plain_words(family, op, params, match):
    spec = KernelSpec(family, op, {"M": 8, "N": 16}, "float32", params)
    with pytest.raises(ValueError, match=match):
        catalog.family_of(spec).validate(spec)
