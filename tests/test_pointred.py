"""Pointwise activations and general reductions (the "pointred" piece): the new pointwise steps
against PyTorch across their whole range, forks, tril/triu in a matmul epilogue, and the
reduction ops (prod, logsumexp, several dims), all in Triton's interpreter at small sizes."""
from __future__ import annotations

import math

import pytest
import torch

from mtmc.kernels import catalog, pointwise
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import check
from mtmc.tools.hardware import PROFILES
from mtmc.tools.loader import load_source

H200 = PROFILES["h200"]

# Every new step (with a parameter where it takes one), and the torch function it must equal.
NEW_STEPS = [
    {"op": "selu"}, {"op": "hardsigmoid"}, {"op": "hardswish"}, {"op": "softsign"}, {"op": "mish"},
    {"op": "log_sigmoid"}, {"op": "erf"}, {"op": "sign"},
    {"op": "elu", "value": 1.0}, {"op": "elu", "value": 0.3}, {"op": "celu", "value": 1.5},
    {"op": "celu", "value": -0.7}, {"op": "softplus", "value": 1.0}, {"op": "softplus", "value": 2.0, "threshold": 5.0},
    {"op": "softplus", "value": -0.5}, {"op": "pow", "value": 3.0}, {"op": "pow", "value": -2.0},
    {"op": "pow", "value": 2.5}, {"op": "pow", "value": 0.5},
]
POSITIVE_STEPS = [{"op": "log"}, {"op": "sqrt"}, {"op": "rsqrt"}, {"op": "reciprocal"}]


def run_chain(chain: list[dict], x: torch.Tensor) -> torch.Tensor:
    """The elementwise family's kernel for `chain` on x (fp32, [M, N]) in the interpreter."""
    spec = KernelSpec("elementwise", "chain", {"M": x.shape[0], "N": x.shape[1]}, "float32", {"chain": chain})
    fam = catalog.family_of(spec)
    fam.validate(spec)
    mod = load_source(fam.render(spec, fam.default_config(spec, H200)))
    out = torch.empty_like(x)
    mod.launch(x, out=out)
    return out


def reference(chain: list[dict], x: torch.Tensor) -> torch.Tensor:
    ns = {"torch": torch, "math": math}
    exec("def f(x):\n    return " + pointwise.torch_expr(chain, "x", {}), ns)
    return ns["f"](x.double())


def whole_range(positive: bool = False) -> torch.Tensor:
    """fp32 values from tiny to huge, both signs (or positive only): where unstable forms fail."""
    mags = torch.logspace(-30, 30, 1200, dtype=torch.float64)
    mids = torch.linspace(-100, 100, 1200, dtype=torch.float64)
    x = torch.cat([mags, -mags, mids]) if not positive else torch.cat([mags, mids.abs() + 1e-3])
    return x.float().reshape(-1, 40)


@pytest.mark.parametrize("step", NEW_STEPS + POSITIVE_STEPS, ids=lambda s: pointwise.describe_chain([s]))
def test_new_step_is_accurate_over_the_whole_fp32_range(step):
    x = whole_range(positive=step in POSITIVE_STEPS)
    with torch.no_grad():
        ref = reference([step], x)
        out = run_chain([step], x).double()
    finite = torch.isfinite(ref) & (ref.abs() < 1e37)   # outside fp32's range the kernel may give inf
    err = (out - ref).abs()[finite]
    bound = 1e-4 * ref.abs()[finite] + 1e-30
    worst = int((err / bound).argmax())
    assert bool((err <= bound).all()), (f"{step}: x={x.double().reshape(-1)[finite.reshape(-1)][worst].item()!r} "
                                        f"ref={ref[finite][worst].item()!r} got={out[finite][worst].item()!r}")


# -- reductions ------------------------------------------------------------------------------

def assert_matches_torch(spec, config=None, dims=None):
    fam = catalog.family_of(spec)
    fam.validate(spec)
    config = config or fam.default_config(spec, H200)
    result = check(spec, fam.render(spec, config), dims or fam.check_dims(spec, config), device="cpu", trials=1)
    assert result.ok, f"{result.reason}\nspec={spec}\nconfig={config}"


REDUCE_CASES = [  # (op, dims, params): last dim, middle dim (inner), a looped row, prologue and epilogue
    ("logsumexp", {"M": 37, "N": 300}, {}),
    ("logsumexp", {"M": 6, "N": 50}, {"inner": 3}),
    ("prod", {"M": 19, "N": 24}, {}),
    ("prod", {"M": 8, "N": 20}, {"inner": 4}),
    ("sum", {"M": 12, "N": 40}, {"epilogue": [{"op": "scale", "value": 0.5}, {"op": "relu"}]}),
    ("logsumexp", {"M": 5, "N": 64}, {"prologue": [{"op": "sigmoid"}], "epilogue": [{"op": "mish"}]}),
    ("mean", {"M": 10, "N": 49}, {"inner": 5, "epilogue": [{"op": "gelu"}]}),
    ("var", {"M": 9, "N": 70}, {}),
    ("var", {"M": 8, "N": 33}, {"inner": 4, "correction": 0, "epilogue": [{"op": "sqrt"}]}),
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("op,dims,params", REDUCE_CASES)
def test_reduction_ops_match_torch(op, dims, params, dtype):
    assert_matches_torch(KernelSpec("reduction", op, dims, dtype, params))


@pytest.mark.parametrize("op", ["logsumexp", "prod", "sum", "var"])
def test_looped_reductions_match_torch(op):
    spec = KernelSpec("reduction", op, {"M": 5, "N": 300}, "float32", {})
    fam = catalog.family_of(spec)
    config = {**fam.default_config(spec, H200), "BLOCK_N": 64, "num_stages": 2}
    assert_matches_torch(spec, config, {"M": 5, "N": 300})


def test_var_is_exact_where_the_mean_dwarfs_the_spread():
    """Rows of 1e4 + N(0, 1): the sum of squares minus the squared sum would lose every digit in
    fp32; subtracting the mean (one tile) or Welford's lanes (looped) keep var within 1e-4."""
    spec = KernelSpec("reduction", "var", {"M": 4, "N": 300}, "float32", {})
    fam = catalog.family_of(spec)
    x = torch.randn(4, 300) + 1e4
    for block in (512, 32):
        mod = load_source(fam.render(spec, {**fam.default_config(spec, H200), "BLOCK_N": block,
                                            "num_stages": 1 if block >= 300 else 2}))
        out = torch.empty(4)
        mod.launch(x, out=out)
        torch.testing.assert_close(out.double(), x.double().var(-1), rtol=1e-3, atol=0)


def test_logsumexp_is_stable_for_large_values():
    spec = KernelSpec("reduction", "logsumexp", {"M": 4, "N": 100}, "float32", {})
    fam = catalog.family_of(spec)
    x = torch.randn(4, 100) * 1e3 + torch.tensor([[0.0], [3e4], [-3e4], [88.0]])
    for block in (128, 32):
        mod = load_source(fam.render(spec, {**fam.default_config(spec, H200), "BLOCK_N": block,
                                            "num_stages": 1 if block >= 100 else 2}))
        out = torch.empty(4)
        mod.launch(x, out=out)
        torch.testing.assert_close(out.double(), torch.logsumexp(x.double(), -1), rtol=1e-6, atol=0)


# -- words -------------------------------------------------------------------------------------

from mtmc.request.parse import parse_request  # noqa: E402

WORDS = [
    ("selu on a 4096x4096 tensor", "chain", {"M": 4096, "N": 4096}, {"chain": [{"op": "selu"}]}),
    ("elu with alpha 0.5 on a 1024x1024 fp16 tensor", "chain", {"M": 1024, "N": 1024},
     {"chain": [{"op": "elu", "value": 0.5}]}),
    ("tanhshrink on a 1024x1024 tensor", "chain", {"M": 1024, "N": 1024},
     {"chain": [{"op": "fork", "binop": "sub", "left": [], "right": [{"op": "tanh"}]}]}),
    ("hardshrink (lambda=0.3) then relu on a 64x4096 tensor", "chain", {"M": 64, "N": 4096},
     {"chain": [{"op": "select", "cond": [{"op": "abs"}], "cmp": "gt", "value": 0.3, "then": [], "else": 0.0},
                {"op": "relu"}]}),
    ("softshrink on a 256x256 tensor", "chain", {"M": 256, "N": 256},
     {"chain": [{"op": "fork", "binop": "sub", "left": [],
                 "right": [{"op": "clamp_min", "value": -0.5}, {"op": "clamp_max", "value": 0.5}]}]}),
    ("softplus with beta 2 and threshold 10 on a 8192x8192 tensor", "chain", {"M": 8192, "N": 8192},
     {"chain": [{"op": "softplus", "value": 2.0, "threshold": 10.0}]}),
    ("hardtanh with min -2 and max 2 on a 4096x4096 tensor", "chain", {"M": 4096, "N": 4096},
     {"chain": [{"op": "clamp_min", "value": -2.0}, {"op": "clamp_max", "value": 2.0}]}),
    ("square root then reciprocal on a 4096x4096 tensor", "chain", {"M": 4096, "N": 4096},
     {"chain": [{"op": "sqrt"}, {"op": "reciprocal"}]}),
    ("x to the power 3 on a 4096x4096 tensor", "chain", {"M": 4096, "N": 4096}, {"chain": [{"op": "pow", "value": 3.0}]}),
    ("logsumexp over the last dim of a 8192x4096 fp16 tensor", "logsumexp", {"M": 8192, "N": 4096}, {}),
    ("product over each row of a 1024x64 tensor", "prod", {"M": 1024, "N": 64}, {}),
    ("sum over dims 2 and 3 of a 16x64x56x56 tensor", "sum", {"M": 1024, "N": 3136}, {}),
    ("max over dims (1, 2) of a 8x16x32x64 tensor", "max", {"M": 512, "N": 512}, {"inner": 64}),
    ("argmax over dim 1 of a 16x128x512 tensor", "argmax", {"M": 8192, "N": 128}, {"inner": 512}),
    ("sum over dim 0 of a 1024x1024 tensor", "sum", {"M": 1024, "N": 1024}, {"inner": 1024}),
    # torch.sum(x) without a dim sums every element (it was a row sum of the default 4096x4096)
    ("sum(x) * 2", "sum", {"M": 1, "N": 4096 * 4096}, {"epilogue": [{"op": "scale", "value": 2.0}]}),
    ("x ** 3 on a 64x64 tensor", "chain", {"M": 64, "N": 64}, {"chain": [{"op": "pow", "value": 3.0}]}),
    ("sqrt of a 4096x4096 tensor", "chain", {"M": 4096, "N": 4096}, {"chain": [{"op": "sqrt"}]}),
    ("logsumexp over the rows of a 512x30000 fp32 tensor", "logsumexp", {"M": 512, "N": 30000}, {}),
    ("row-wise sum of a 4096x8192 tensor then scale by 0.5", "sum", {"M": 4096, "N": 8192},
     {"epilogue": [{"op": "scale", "value": 0.5}]}),
]


@pytest.mark.parametrize("text,op,dims,params", WORDS)
def test_words_parse_to_the_spec(text, op, dims, params):
    r = parse_request(text)
    assert r.ok, r.message
    assert (r.spec.op, r.spec.dims) == (op, dims)
    assert {k: v for k, v in r.spec.params.items() if k != "shape"} == params


@pytest.mark.parametrize("text,why", [
    ("sum over dims 1 and 3 of a 2x3x4x5 tensor", "not next to each other"),
    ("elu with alpha 0 on a 4x4 tensor", "undefined"),
    ("sum over dims 2 and 3", "needs the tensor's shape"),
    ("hardtanh with min 2 and max -2 on a 4x4 tensor", "above its max"),
])
def test_words_refusals_say_why(text, why):
    r = parse_request(text)
    assert not r.ok and why in r.message, r.message


# -- tril / triu and forks in kernels ----------------------------------------------------------

@pytest.mark.parametrize("op,diag", [("tril", 0), ("triu", 1), ("tril", -2)])
def test_tril_triu_in_the_matmul_epilogue(op, diag):
    epi = [{"op": "bias"}, {"op": op, "value": diag}, {"op": "relu"}]
    spec = KernelSpec("matmul", "matmul", {"M": 40, "N": 36, "K": 24}, "float32", {"epilogue": epi})
    fam = catalog.family_of(spec)
    assert fam.config_space(spec)["SPLIT_K"] == [1]
    config = {**fam.default_config(spec, H200), "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
    assert_matches_torch(spec, config, spec.dims)
    bmm = KernelSpec("matmul", "bmm", {"B": 2, "M": 20, "N": 20, "K": 8}, "float16", {"epilogue": [{"op": op, "value": diag}]})
    assert_matches_torch(bmm, {**fam.default_config(bmm, H200), "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, bmm.dims)


def test_tiles_a_tril_zeroes_whole_skip_their_products():
    """L1 15 (tril of a 4096^3 fp32 product) computed every tile and lost to cuBLAS (3.90 vs
    2.65 ms on an H100); the tiles above the diagonal now run no K loop, so half the products go."""
    fam = catalog.family_of(KernelSpec("matmul", "matmul", {"M": 8, "N": 8, "K": 8}, "float32", {}))
    def spec(epi, m=4096, n=4096):
        return KernelSpec("matmul", "matmul", {"M": m, "N": n, "K": 4096}, "float32", {"epilogue": epi})
    full = fam.work(spec([]))[0]
    assert fam.work(spec([{"op": "tril", "value": 0}]))[0] == pytest.approx(full / 2, rel=1e-3)
    assert pointwise.kept_share([{"op": "triu", "value": 1}], 4, 4) == 6 / 16
    assert pointwise.kept_share([{"op": "tril", "value": 1}, {"op": "triu", "value": -1}], 4, 5) == 11 / 20
    src = fam.render(spec([{"op": "bias"}, {"op": "tril", "value": -2}]), fam.default_config(spec([]), H200))
    assert "k_hi = tl.where((off_n - off_m + BLOCK_M - 1 > -2), k_lo, k_hi)" not in src   # bounds as written
    assert "k_hi = tl.where((off_n - (off_m + BLOCK_M - 1) > -2), k_lo, k_hi)" in src
    assert "tl.where" not in fam.render(spec([{"op": "relu"}]), fam.default_config(spec([]), H200)).split("def matmul_kernel")[1].split("dot_tile(")[0]
    # a tril inside a fork zeroes only part of that branch: no skip
    fork = {"op": "fork", "binop": "add", "left": [{"op": "tril", "value": 0}], "right": []}
    assert pointwise.zeroed_tile([fork], ("0", "1"), ("0", "1")) is None


def test_tril_outside_a_matmul_is_refused():
    spec = KernelSpec("elementwise", "chain", {"M": 4, "N": 4}, "float32", {"chain": [{"op": "tril", "value": 0}]})
    with pytest.raises(ValueError, match="matmul epilogue"):
        catalog.family_of(spec).validate(spec)


FORK = {"op": "fork", "binop": "mul", "left": [{"op": "scale", "value": 0.5}],
        "right": [{"op": "fork", "binop": "add", "left": [], "right": [{"op": "pow", "value": 3.0}]}, {"op": "tanh"}]}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fork_steps_in_chains_and_epilogues(dtype):
    chain = KernelSpec("elementwise", "chain", {"M": 9, "N": 70}, dtype, {"chain": [FORK, {"op": "relu"}]})
    assert_matches_torch(chain)
    mm = KernelSpec("matmul", "matmul", {"M": 20, "N": 24, "K": 40}, dtype, {"epilogue": [{"op": "bias"}, FORK]})
    fam = catalog.family_of(mm)
    assert_matches_torch(mm, {**fam.default_config(mm, H200), "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, mm.dims)
    assert pointwise.describe_chain([FORK]) == "mul(scale(0.5), add(x, pow(3.0)) -> tanh)"


def test_fork_validation_refuses_operands_and_unknown_binops():
    for bad in ({**FORK, "binop": "pow"}, {**FORK, "left": [{"op": "add"}]}):
        with pytest.raises(ValueError):
            pointwise.validate_chain([bad])


# -- sm_90 resources of the defaults at benchmark sizes ------------------------------------------

def test_default_configs_compile_for_sm90_without_spills():
    from bench.tasks import POINTRED_TASKS
    from kernel_helpers import compile_defaults
    specs = {t: parse_request(t).spec.to_dict() for t in POINTRED_TASKS}
    specs["tril matmul"] = KernelSpec("matmul", "matmul", {"M": 4096, "N": 4096, "K": 4096}, "float32",
                                      {"epilogue": [{"op": "tril", "value": 0}]}).to_dict()
    for name, report in compile_defaults(specs).items():
        assert report["violations"] == [], f"{name}: {report['violations']}"
        for kernel in report["kernels"]:
            assert kernel["error"] is None, f"{name}: {kernel['error']}"
            assert kernel["spill_bytes"] == 0 and kernel["regs"] <= 255, name
            assert 0 <= kernel["shared_bytes"] <= H200.smem_per_block, name


@pytest.mark.parametrize("text, spec", [
    ("variance over the rows of a 512x30000 fp32 tensor", ("var", {"M": 512, "N": 30000}, {})),
    ("unbiased variance of a 64x4096 bf16 tensor then sqrt", ("var", {"M": 64, "N": 4096},
                                                              {"epilogue": [{"op": "sqrt"}]})),
])
def test_variance_words_parse_to_the_var_reduction(text, spec):
    r = parse_request(text)
    assert (r.spec.family, r.spec.op, r.spec.dims, r.spec.params) == ("reduction", *spec)


@pytest.mark.parametrize("text, params", [
    # "std" and "population variance" were refused as outside the catalog, though torch.std is the
    # catalog's var then a sqrt (what a captured module gets)
    ("std over the last dim of a 64x128 tensor", {"epilogue": [{"op": "sqrt"}]}),
    ("standard deviation of each row of a 64x128 tensor then scale by 2",
     {"epilogue": [{"op": "sqrt"}, {"op": "scale", "value": 2.0}]}),
    ("population variance over the last dim of a 64x128 tensor", {"correction": 0}),
    ("population std over dims 2 and 3 of a 8x16x32x32 tensor", {"epilogue": [{"op": "sqrt"}], "correction": 0}),
    ("unbiased variance of each row of a 64x128 tensor", {}),
])
def test_deviations_in_words_are_var_with_a_sqrt(text, params):
    spec = parse_request(text).spec
    assert spec is not None and spec.op == "var" and spec.params == params
    fam = catalog.family_of(spec)
    cfg = fam.default_config(spec, PROFILES["h200"])
    assert check(spec, fam.render(spec, cfg), fam.check_dims(spec, cfg)).ok
