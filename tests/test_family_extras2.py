"""where / masked_fill / select steps and operands transformed before their binop ("pre"), in
elementwise chains and in matmul and row-wise epilogues: kernels against PyTorch in the interpreter
(float64 truth, fp32 at 1e-4), fp16/bf16; refusals; the default configs compile for sm_90.  And
argmax / argmin of all elements split over the GPU, ties resolved as torch does."""
from __future__ import annotations

import pytest
import torch

from mtmc.kernels import pointwise
from mtmc.kernels.families import elementwise, matmul, reduction, softmax
from mtmc.kernels.spec import KernelSpec
from mtmc.tools.hardware import PROFILES
from mtmc.tools.loader import load_source
from kernel_helpers import compile_defaults
from tests.test_family_rows import assert_correct

H200 = PROFILES["h200"]
SELECT = {"op": "select", "cond": [], "cmp": "gt", "value": 0.0, "then": [], "else": [{"op": "scale", "value": 0.2}]}
CHAINS = {
    "relu(x) + relu(y)": [{"op": "relu"}, {"op": "add", "pre": [{"op": "relu"}]}],
    "x * sigmoid(y)": [{"op": "mul", "pre": [{"op": "sigmoid"}]}],
    "y / exp(x) (rdiv, pre)": [{"op": "exp"}, {"op": "rdiv", "pre": [{"op": "tanh"}]}],
    "masked_fill(-inf) then exp": [{"op": "masked_fill", "value": float("-inf")}, {"op": "exp"}],
    "where(mask, x, 0.5) broadcast mask": [{"op": "masked_keep", "value": 0.5, "every": 1, "period": 40}],
    "where(x > 0, x, 0.2x)": [SELECT],
    "where(|x| <= 0.5, 1, tanh x)": [{"op": "select", "cond": [{"op": "abs"}], "cmp": "le", "value": 0.5,
                                      "then": 1.0, "else": [{"op": "tanh"}]}],
    "select on a periodic add's pre": [{"op": "add", "every": 40, "period": 3, "pre": [SELECT]}],
}


def chain_spec(chain, dtype="float32", m=30, n=40) -> KernelSpec:
    spec = KernelSpec("elementwise", "chain", {"M": m, "N": n}, dtype, {"chain": chain})
    elementwise.FAMILY.validate(spec)
    return spec


@pytest.mark.parametrize("name", sorted(CHAINS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_chain_steps_match_pytorch(name, dtype):
    spec = chain_spec(CHAINS[name], dtype)
    assert_correct(elementwise.FAMILY, spec, elementwise.FAMILY.default_config(spec, H200))


def test_mask_operand_is_a_bool_input_and_counts_one_byte():
    spec = chain_spec(CHAINS["masked_fill(-inf) then exp"], "float16")
    x, mask = elementwise.FAMILY.inputs(spec)
    assert (mask.dtype, mask.init, mask.shape) == ("bool", "mask", ("M", "N"))
    assert elementwise.FAMILY.work(spec)[1] == 30 * 40 * (2 + 2 + 1)


def test_masked_fill_in_a_matmul_epilogue_before_a_softmax():
    spec = KernelSpec("matmul", "bmm", {"B": 2, "M": 20, "N": 24, "K": 16}, "float32",
                      {"b_layout": "nk", "epilogue": [{"op": "scale", "value": 0.25},
                                                      {"op": "masked_fill", "value": float("-inf")}]})
    matmul.FAMILY.validate(spec)
    assert matmul.FAMILY.inputs(spec)[2].dtype == "bool"
    assert_correct(matmul.FAMILY, spec, matmul.FAMILY.default_config(spec, H200))


def test_select_and_pre_in_a_softmax_epilogue():
    spec = KernelSpec("softmax", "softmax", {"M": 12, "N": 48}, "float32",
                      {"prologue": [SELECT], "epilogue": [{"op": "mul", "pre": [{"op": "sigmoid"}]}]})
    softmax.FAMILY.validate(spec)
    assert_correct(softmax.FAMILY, spec, softmax.FAMILY.default_config(spec, H200))


@pytest.mark.parametrize("step, match", [
    ({"op": "select", "cond": [], "cmp": "gt?", "value": 0.0, "then": [], "else": 1.0}, "compares with"),
    ({"op": "select", "cond": [], "cmp": "gt", "value": 0.0, "then": [], "else": "x"}, "list of steps or a number"),
    ({"op": "select", "cond": [{"op": "add"}], "cmp": "gt", "value": 0.0, "then": [], "else": 1.0},
     "reads no other tensor"),
    ({"op": "relu", "pre": [{"op": "relu"}]}, "only two-operand steps"),
    ({"op": "masked_fill", "value": float("nan")}, "NaN"),
    ({"op": "masked_fill"}, "numeric 'value'"),
])
def test_bad_steps_are_refused_in_words(step, match):
    with pytest.raises(ValueError, match=match):
        pointwise.validate_chain([step])


def test_default_configs_compile_for_sm90():
    specs = {name: chain_spec(chain, dtype, 8192, 8192).to_dict()
             for name, chain in CHAINS.items() for dtype in ("float32", "bfloat16")
             for name in [f"{name} {dtype}"]}
    for name, report in compile_defaults(specs).items():
        (kernel,) = report["kernels"]
        assert kernel["error"] is None, f"{name}: {kernel['error']}"
        assert report["violations"] == [] and kernel["spill_bytes"] == 0, name


# -- argmax / argmin over all elements, split over the GPU -------------------------------------------
@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_split_argmax_over_one_long_row(op, dtype):
    spec = KernelSpec("reduction", op, {"M": 1, "N": 1 << 24}, dtype, {})
    reduction.FAMILY.validate(spec)
    cfg = reduction.FAMILY.default_config(spec, H200)
    assert cfg["SPLIT"] >= 256   # enough programs for 132 SMs, not one
    assert_correct(reduction.FAMILY, spec, cfg, reduction.FAMILY.check_dims(spec, cfg))


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_split_argmax_ties_pick_the_first_extreme_as_torch(op):
    spec = KernelSpec("reduction", op, {"M": 3, "N": 500}, "float32", {"prologue": [{"op": "abs"}]})
    cfg = {**reduction.FAMILY.default_config(spec, H200), "BLOCK_N": 32, "SPLIT": 4}
    assert_correct(reduction.FAMILY, spec, cfg)
    launch = load_source(reduction.FAMILY.render(spec, cfg), "split_arg").launch
    x = torch.randint(-3, 4, (3, 500)).float()   # many ties, across segments
    out = torch.empty(3, dtype=torch.int64)
    launch(x, out=out)
    assert torch.equal(out, getattr(torch, op)(x.abs(), dim=-1))


def test_split_argmax_default_compiles_for_sm90():
    specs = {f"{op} {dt}": KernelSpec("reduction", op, {"M": 1, "N": 1 << 28}, dt, {}).to_dict()
             for op in ("argmax", "argmin") for dt in ("float32", "bfloat16")}
    for name, report in compile_defaults(specs).items():
        assert all(k["error"] is None and k["spill_bytes"] == 0 for k in report["kernels"]), name
        assert report["violations"] == [], name
