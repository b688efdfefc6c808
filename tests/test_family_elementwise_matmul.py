"""The elementwise and matmul families: generated kernels against PyTorch, in the interpreter.

Every kernel check goes through mtmc.tools.correctness.check (fresh random inputs, a NaN-filled
output, a float64 reference), so a test passes only when the rendered source computes the spec.
Shapes stay small because Triton's interpreter costs tens of milliseconds per program.
"""
from __future__ import annotations

import difflib
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtmc.kernels import catalog, pointwise
from mtmc.kernels.families.elementwise import FAMILY as ELEMENTWISE
from mtmc.kernels.families.matmul import FAMILY as MATMUL
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import check
from mtmc.tools.hardware import PROFILES

H200 = PROFILES["h200"]
DTYPES = ["float32", "float16", "bfloat16"]
PROPERTY = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Steps whose values stay in range for every dtype on random normal inputs (exp and square are
# covered by an explicit bounded chain below).
UNARY = ["relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "abs", "neg"]
SCALAR = list(pointwise.SCALAR)
# division by a random operand overflows fp16 near 0; test_pointred covers div in fp32
OPERAND = [op for op in pointwise.BINARY if op not in ("div", "rdiv")] + list(pointwise.VECTOR)


def assert_matches_torch(spec, config, dims=None, trials=1):
    family = catalog.family_of(spec)
    family.validate(spec)
    result = check(spec, family.render(spec, config), dims or spec.dims, device="cpu", trials=trials)
    assert result.ok, f"{result.reason}\nspec={spec}\nconfig={config}"
    return result


@st.composite
def steps(draw):
    op = draw(st.sampled_from(UNARY + SCALAR + OPERAND))
    if op in pointwise.SCALAR:
        return {"op": op, "value": draw(st.sampled_from([-1.5, -0.25, 0.1, 0.5, 2.0]))}
    return {"op": op}


@st.composite
def periodic_steps(draw):
    """A two-operand step whose operand broadcasts: element i meets operand[(i // every) % period]."""
    return {"op": draw(st.sampled_from([op for op in OPERAND if op in pointwise.BINARY])), "every": draw(st.sampled_from([1, 3, 64])),
            "period": draw(st.sampled_from([1, 2, 33]))}


def drawn_config(draw, space: dict, caps: dict) -> dict:
    """One value per knob from the family's own config space, under `caps` (interpreter cost)."""
    return {k: draw(st.sampled_from([v for v in values if k not in caps or v <= caps[k]]))
            for k, values in space.items()}


# -- elementwise ---------------------------------------------------------------------------
@st.composite
def elementwise_cases(draw):
    spec = KernelSpec("elementwise", "chain",
                      {"M": draw(st.integers(1, 200)), "N": draw(st.integers(1, 300))},
                      draw(st.sampled_from(DTYPES)), {"chain": draw(st.lists(st.one_of(steps(), periodic_steps()), min_size=1, max_size=4))})
    return spec, drawn_config(draw, ELEMENTWISE.config_space(spec), {"BLOCK": 4096})


@PROPERTY
@given(elementwise_cases())
def test_elementwise_matches_torch(case):
    assert_matches_torch(*case)


@pytest.mark.parametrize("config", [
    {"BLOCK": 16384, "num_warps": 16, "PERSISTENT": False},
    {"BLOCK": 256, "num_warps": 1, "PERSISTENT": True},   # 17 blocks over a 16-program grid
])
def test_elementwise_extreme_configs_and_bounded_exp(config):
    # exp(-x*x/2) * x: square and exp stay bounded, whatever the dtype
    chain = [{"op": "square"}, {"op": "scale", "value": -0.5}, {"op": "exp"}, {"op": "mul"}, {"op": "bias"}]
    for dtype in ("float16", "bfloat16"):
        assert_matches_torch(KernelSpec("elementwise", "chain", {"M": 33, "N": 129}, dtype, {"chain": chain}), config)


def test_elementwise_check_dims_run_and_cover_tails():
    spec = KernelSpec("elementwise", "chain", {"M": 4096, "N": 4099}, "float16",
                      {"chain": [{"op": "bias"}, {"op": "silu"}]})
    for persistent in (False, True):
        config = {"BLOCK": 512, "num_warps": 4, "PERSISTENT": persistent}
        dims = ELEMENTWISE.check_dims(spec, config)
        numel = dims["M"] * dims["N"]
        assert dims["N"] % 256 == 4099 % 256 and numel % 512 and numel > 2 * 512
        if persistent:  # more blocks than the CPU stand-in grid (4 SMs x 4 programs)
            assert numel > 16 * 512
        assert_matches_torch(spec, config, dims)


# -- matmul --------------------------------------------------------------------------------
@st.composite
def matmul_cases(draw):
    op = draw(st.sampled_from(["matmul", "bmm"]))
    batch = draw(st.integers(1, 2)) if op == "bmm" else 1
    probe = KernelSpec("matmul", op, {})
    cfg = drawn_config(draw, MATMUL.config_space(probe), {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64})
    # Bound the programs (tiles x batch x splits): each costs the interpreter ~30 ms.
    tiles = max(1, math.isqrt(24 // (batch * cfg["SPLIT_K"])))
    dims = {"M": draw(st.integers(1, min(80, tiles * cfg["BLOCK_M"]))),
            "N": draw(st.integers(1, min(80, tiles * cfg["BLOCK_N"]))),
            "K": draw(st.integers(1, 100))}
    if op == "bmm":
        dims["B"] = batch
    params = {"b_layout": draw(st.sampled_from(["kn", "nk"])),
              "epilogue": draw(st.lists(steps(), max_size=3))}
    return KernelSpec("matmul", op, dims, draw(st.sampled_from(DTYPES)), params), cfg


@PROPERTY
@given(matmul_cases())
def test_matmul_matches_torch(case):
    assert_matches_torch(*case)


def matmul_config(**knobs):
    cfg = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": 1,
           "PERSISTENT": False, "num_warps": 4, "num_stages": 2}
    return {**cfg, **knobs}


LINEAR_EPILOGUE = [{"op": "scale", "value": 0.5}, {"op": "bias"}, {"op": "relu"}, {"op": "residual"}]


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_biggest_tiles_on_a_tiny_shape(dtype):
    spec = KernelSpec("matmul", "bmm", {"B": 3, "M": 19, "N": 37, "K": 45}, dtype,
                      {"b_layout": "nk", "epilogue": LINEAR_EPILOGUE})
    assert_matches_torch(spec, matmul_config(BLOCK_M=256, BLOCK_N=256, BLOCK_K=128, GROUP_M=16,
                                             num_warps=8, num_stages=6))


def test_matmul_split_k_applies_activations_after_the_full_sum():
    # relu per split would differ from relu of the sum wherever the partial sums disagree in sign
    spec = KernelSpec("matmul", "matmul", {"M": 20, "N": 24, "K": 250}, "float32",
                      {"epilogue": [{"op": "relu"}, {"op": "bias"}]})
    assert_matches_torch(spec, matmul_config(SPLIT_K=16, PERSISTENT=True), trials=2)


def test_matmul_check_dims_run_and_cover_tiles_and_tails():
    spec = KernelSpec("matmul", "bmm", {"B": 8, "M": 4097, "N": 1000, "K": 4100}, "float16",
                      {"epilogue": LINEAR_EPILOGUE})
    config = matmul_config(GROUP_M=2, SPLIT_K=2, PERSISTENT=True)
    dims = MATMUL.check_dims(spec, config)
    assert dims["B"] == 3
    # more than a group of tile rows, two tile columns, two split chunks; the real tails kept
    assert dims["M"] // 32 >= 3 and dims["M"] % 32 == 4097 % 32
    assert dims["N"] // 32 == 2 and dims["N"] % 32 == 1000 % 32
    assert dims["K"] // 32 == 2 and dims["K"] % 32 == 4100 % 32
    assert_matches_torch(spec, config, dims)
    # a dim already small stays as it is
    assert MATMUL.check_dims(spec.with_dims(M=40), config)["M"] == 40


# -- broken sources must be rejected --------------------------------------------------------
def test_check_rejects_a_k_loop_that_skips_its_last_chunk():
    spec = KernelSpec("matmul", "matmul", {"M": 40, "N": 40, "K": 64}, "float16", {})
    source = MATMUL.render(spec, matmul_config())
    broken = source.replace("range(k_lo, k_hi, BLOCK_K)", "range(k_lo, k_hi - BLOCK_K, BLOCK_K)")
    assert broken != source
    assert check(spec, source, device="cpu", trials=1).ok
    assert not check(spec, broken, device="cpu", trials=1).ok


def test_check_rejects_a_missing_epilogue():
    with_relu = KernelSpec("matmul", "matmul", {"M": 40, "N": 40, "K": 48}, "bfloat16",
                           {"epilogue": [{"op": "relu"}]})
    plain = KernelSpec("matmul", "matmul", with_relu.dims, "bfloat16", {})
    assert not check(with_relu, MATMUL.render(plain, matmul_config()), device="cpu", trials=1).ok


def test_check_rejects_an_unwritten_tail():
    spec = KernelSpec("elementwise", "chain", {"M": 7, "N": 45}, "float32", {"chain": [{"op": "gelu"}]})
    source = ELEMENTWISE.render(spec, {"BLOCK": 256, "num_warps": 4, "PERSISTENT": False})
    broken = source.replace("mask = offs < numel", "mask = offs < numel - 1")
    assert broken != source
    result = check(spec, broken, device="cpu", trials=1)
    assert not result.ok and "NaN" in result.reason


def test_elementwise_periodic_operand_read_at_the_wrong_place_is_rejected():
    """A kernel that reads a broadcast operand as if it ran along the last dim gets caught."""
    spec = KernelSpec("elementwise", "chain", {"M": 30, "N": 7}, "float32",
                      {"chain": [{"op": "add", "every": 35, "period": 3}]})
    cfg = ELEMENTWISE.default_config(spec, H200)
    assert_matches_torch(spec, cfg)
    source = ELEMENTWISE.render(spec, cfg)
    wrong = source.replace("((offs) // 35) % 3", "(offs) % 3")
    assert wrong != source and not check(spec, wrong, spec.dims, device="cpu").ok


def test_one_value_operands_are_loaded_once_in_chains_and_split_k_epilogues():
    """A {"scalar": true} step (a 0-d parameter) reads a [1] input with one load, no offsets:
    in a chain, and in the split-K reduction that applies a matmul's epilogue."""
    ew = KernelSpec("elementwise", "chain", {"M": 9, "N": 70}, "float16",
                    {"chain": [{"op": "mul", "scalar": True},
                               {"op": "maximum", "scalar": True, "pre": [{"op": "neg"}]}]})
    mm = KernelSpec("matmul", "matmul", {"M": 20, "N": 24, "K": 250}, "float32",
                    {"epilogue": [{"op": "bias"}, {"op": "sub", "scalar": True}, {"op": "relu"}]})
    for spec, config, name in ((ew, ELEMENTWISE.default_config(ew, H200), "mul0"),
                               (mm, matmul_config(SPLIT_K=4), "sub1")):
        assert [a.shape for a in catalog.family_of(spec).inputs(spec) if a.name == name] == [(1,)]
        assert f"{name} = tl.load({name}_ptr).to(tl.float32)" in catalog.family_of(spec).render(spec, config)
        assert_matches_torch(spec, config)
    assert MATMUL.work(mm)[1] == 4 * (20 * 250 + 250 * 24 + 20 * 24 + 24 + 1)   # the operand is one value


# -- the plain-data parts -------------------------------------------------------------------
@pytest.mark.parametrize("params, match", [
    ({}, "non-empty"), ({"chain": []}, "non-empty"), ({"chain": [{"op": "wiggle"}]}, "unknown pointwise op"),
    ({"chain": [{"op": "scale"}]}, "numeric 'value'"),
    ({"chain": [{"op": "relu", "every": 2, "period": 3}]}, "periodic"),
    ({"chain": [{"op": "add", "every": 0, "period": 3}]}, "periodic"),
    ({"chain": [{"op": "relu", "scalar": True}]}, "one-value"),
    ({"chain": [{"op": "add", "scalar": True, "every": 1, "period": 3}]}, "one-value"),
])
def test_elementwise_validate_rejects_bad_chains(params, match):
    with pytest.raises(ValueError, match=match):
        ELEMENTWISE.validate(KernelSpec("elementwise", "chain", {"M": 4, "N": 4}, params=params))


@pytest.mark.parametrize("op, params, match", [
    ("matmul", {"b_layout": "mn"}, "b_layout"), ("matmul", {"epilogue": [{"op": "wiggle"}]}, "unknown"),
    ("gemv", {}, "no op"), ("matmul", {"epilogue": [{"op": "add", "every": 1, "period": 4}]}, "periodic"),
])
def test_matmul_validate_rejects_bad_specs(op, params, match):
    with pytest.raises(ValueError, match=match):
        MATMUL.validate(KernelSpec("matmul", op, {"M": 4, "N": 4, "K": 4}, params=params))


def test_bmm_validate_needs_a_batch_dim():
    with pytest.raises(ValueError, match="dim B"):
        MATMUL.validate(KernelSpec("matmul", "bmm", {"M": 4, "N": 4, "K": 4}))


@pytest.mark.parametrize("spec", [
    KernelSpec("matmul", "matmul", {"M": 4096, "N": 4096, "K": 4096}, "float16"),
    KernelSpec("matmul", "bmm", {"B": 4, "M": 100, "N": 30, "K": 64}, "float32"),
    KernelSpec("matmul", "matmul", {"M": 64, "N": 64, "K": 16384}, "bfloat16"),
    KernelSpec("elementwise", "chain", {"M": 3, "N": 5}, "float32", {"chain": [{"op": "relu"}]}),
    KernelSpec("elementwise", "chain", {"M": 8192, "N": 8192}, "bfloat16", {"chain": [{"op": "relu"}]}),
])
def test_default_config_is_in_the_config_space(spec):
    family = catalog.family_of(spec)
    space, cfg = family.config_space(spec), family.default_config(spec, H200)
    assert set(cfg) == set(space)
    for knob, values in space.items():
        assert values == sorted(values) and cfg[knob] in values


def test_matmul_defaults_follow_the_problem():
    big = MATMUL.default_config(KernelSpec("matmul", "matmul", {"M": 4096, "N": 4096, "K": 4096}, "float16"), H200)
    assert (big["BLOCK_M"], big["BLOCK_N"], big["BLOCK_K"], big["SPLIT_K"]) == (128, 128, 64, 1)
    fp32 = MATMUL.default_config(KernelSpec("matmul", "matmul", {"M": 4096, "N": 4096, "K": 4096}, "float32"), H200)
    assert fp32["BLOCK_K"] == 32
    small = MATMUL.default_config(KernelSpec("matmul", "matmul", {"M": 20, "N": 50, "K": 40}, "float16"), H200)
    assert (small["BLOCK_M"], small["BLOCK_N"], small["BLOCK_K"]) == (32, 64, 64)
    skinny = MATMUL.default_config(KernelSpec("matmul", "matmul", {"M": 64, "N": 64, "K": 16384}, "float16"), H200)
    assert skinny["SPLIT_K"] > 1  # one tile cannot fill 132 SMs; the long K can


def test_work_counts_flops_and_minimum_bytes():
    spec = KernelSpec("matmul", "bmm", {"B": 2, "M": 8, "N": 4, "K": 16}, "float16",
                      {"epilogue": [{"op": "bias"}, {"op": "residual"}]})
    flops, nbytes = MATMUL.work(spec)
    assert flops == 2 * 8 * 4 * (2 * 16 + 2)
    assert nbytes == 2 * (2 * (8 * 16 + 16 * 4 + 8 * 4) + 4 + 2 * 8 * 4)
    ew = KernelSpec("elementwise", "chain", {"M": 8, "N": 4}, "float32", {"chain": [{"op": "bias"}, {"op": "mul"}]})
    assert ELEMENTWISE.work(ew) == (8 * 4 * 2, 4 * (3 * 8 * 4 + 4))


def test_inputs_follow_the_operand_order():
    spec = KernelSpec("matmul", "bmm", {"B": 2, "M": 8, "N": 4, "K": 16}, "float16",
                      {"b_layout": "nk", "epilogue": LINEAR_EPILOGUE})
    shapes = [(a.name, a.shape) for a in MATMUL.inputs(spec)]
    assert shapes == [("a", ("B", "M", "K")), ("b", ("B", "N", "K")), ("bias1", ("N",)),
                      ("residual3", ("B", "M", "N"))]
    assert MATMUL.output(spec).shape == ("B", "M", "N")
    assert "nn.Linear" in MATMUL.describe(spec) and "relu" in MATMUL.describe(spec)


def test_one_knob_change_is_a_small_diff():
    spec = KernelSpec("matmul", "matmul", {"M": 512, "N": 512, "K": 512}, "float16", {"epilogue": LINEAR_EPILOGUE})
    before = MATMUL.render(spec, matmul_config()).splitlines()
    after = MATMUL.render(spec, matmul_config(num_warps=8)).splitlines()
    changed = [l for l in difflib.unified_diff(before, after, lineterm="", n=0)
               if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    assert len(changed) == 4  # the config line of the header and the launch line, each - and +


def test_fp32_matmul_runs_on_tensor_cores_at_fp32_accuracy_where_the_gpu_has_tf32():
    spec = KernelSpec("matmul", "matmul", {"M": 128, "N": 32768, "K": 32768}, "float32",
                      {"b_layout": "nk", "epilogue": [{"op": "bias"}, {"op": "silu"}]})
    assert MATMUL.default_config(spec, H200)["PRECISION"] == "tf32x3"
    assert MATMUL.default_config(spec, PROFILES["v100"])["PRECISION"] == "ieee"   # no TF32 before sm_80
    config = {**matmul_config(), "PRECISION": "tf32x3"}
    assert 'input_precision="tf32x3"' in MATMUL.render(spec, config)
    small = KernelSpec("matmul", "matmul", {"M": 40, "N": 70, "K": 90}, "float32", spec.params)
    assert_matches_torch(small, config)
    # the estimate ranks it above IEEE FMAs on a compute-bound shape
    from mtmc.kernels.estimate import estimate_time
    big = KernelSpec("matmul", "matmul", {"M": 4096, "N": 4096, "K": 4096}, "float32")
    cfg = MATMUL.default_config(big, H200)
    assert estimate_time(big, cfg, H200)["ms"] < estimate_time(big, {**cfg, "PRECISION": "ieee"}, H200)["ms"]


def test_a_matmul_config_from_before_the_precision_knob_means_ieee():
    spec = KernelSpec("matmul", "matmul", {"M": 16, "N": 16, "K": 16}, "float32")
    assert 'input_precision="ieee"' in MATMUL.render(spec, matmul_config())
    half = KernelSpec("matmul", "matmul", {"M": 16, "N": 16, "K": 16}, "float16")
    assert "PRECISION" not in MATMUL.render(half, matmul_config())   # fp16 has no such knob
