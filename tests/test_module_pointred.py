"""Activations and reductions in uploaded modules: which nodes become groups of which steps, why
near misses stay PyTorch, and that ModelNew computes what Model does (interpreter, small sizes);
tests/modules/pointred_block.py also runs through `mtmc optimize` end to end here."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from tests.test_module_conv import assert_model_new_matches, captured_source

MODULES = Path(__file__).parent / "modules"


def test_pointred_block_groups_and_model_new_matches(tmp_path):
    source = (MODULES / "pointred_block.py").read_text()
    cap = capture(str(MODULES / "pointred_block.py"))
    part = partition(cap)
    by_op = {g.spec["op"]: g for g in part.groups}
    fc = part.groups[0]
    # NewGELU written out is gelu_tanh; the hand-written hardswish is one step; module params kept
    assert fc.spec["params"]["epilogue"] == [
        {"op": "bias"}, {"op": "gelu_tanh"}, {"op": "mish"}, {"op": "softplus", "value": 2.0, "threshold": 5.0},
        {"op": "elu", "value": 0.5}, {"op": "hardswish"}]
    tril = [g for g in part.groups if g.family == "matmul"][1]
    assert tril.spec["params"]["epilogue"] == [{"op": "tril", "value": 0.0}]
    assert by_op["logsumexp"].spec["dims"] == {"M": 4, "N": 20}
    means = [g for g in part.groups if g.spec["op"] == "mean"]
    assert means[0].spec["dims"] == {"M": 12, "N": 30} and means[0].out["dim"] == [2, 3]
    assert by_op["sum"].spec["params"] == {"inner": 6, "epilogue": [{"op": "scale", "value": 0.25}]}
    assert by_op["max"].spec["params"] == {"inner": 30} and by_op["argmin"].spec["params"] == {"inner": 6}
    assert part.torch_ops == []
    assert_model_new_matches(tmp_path, source, cap, part)


NEAR_MISSES = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, e):
        a = x.sum(dim=(1, 3))
        b = torch.pow(x, e)
        c = torch.tril(x + 1.0)
        d = torch.nn.functional.elu(x, alpha=0.0)
        f = torch.nn.functional.celu(x, alpha=x.shape[0] * 0.5)
        return a, b, c, d, f


def get_inputs():
    return [torch.randn(2, 3, 4, 5), torch.rand(2, 3, 4, 5)]


def get_init_inputs():
    return []
'''


def test_near_misses_stay_pytorch_with_the_reason(tmp_path):
    _, part = captured_source(tmp_path, NEAR_MISSES)
    why = {t["op"].split(" ")[0]: t["why"] for t in part.torch_ops}
    assert "not next to each other" in why[".sum()"]
    assert "not a plain number" in why["pow"]
    assert "matmul epilogue" in why["tril"] or "outside" not in why["tril"]
    assert "alpha 0 is undefined" in why["elu"]
    assert "celu's alpha that is not a plain number" in why["celu"]


TWO_TENSORS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, y):
        u = F.hardsigmoid(x) * F.softsign(y) / (y.abs() + 1.0)
        return 2.0 / (u + 3.0), (-F.logsigmoid(x)).sqrt().rsqrt() + torch.sign(y) + torch.reciprocal(y.exp())


def get_inputs():
    return [torch.randn(6, 7), torch.randn(6, 7)]


def get_init_inputs():
    return []
'''


def test_divisions_and_math_functions_fuse_and_match(tmp_path):
    cap, part = captured_source(tmp_path, TWO_TENSORS)
    chain = [s for g in part.groups for s in g.spec["params"]["chain"]]
    steps = [s["op"] for s in chain + [p for s in chain for p in s.get("pre", [])]]   # an operand's own steps too
    for op in ("hardsigmoid", "div", "reciprocal", "log_sigmoid", "sqrt", "rsqrt", "sign"):
        assert op in steps, (op, steps)
    assert_model_new_matches(tmp_path, TWO_TENSORS, cap, part)


VECTOR_NORMS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        a = torch.norm(x, p=2, dim=1)
        b = x.norm(dim=-1, keepdim=True) * 0.5
        c = torch.linalg.vector_norm(x, ord=1, dim=1)
        d = torch.linalg.norm(x, ord=float("inf"), dim=2)
        e = torch.norm(x)
        f = x / (x.norm(dim=2, keepdim=True) + 1e-6)
        return a, b, c, d, e, f


def get_inputs():
    return [torch.randn(3, 5, 33)]


def get_init_inputs():
    return []
'''


def test_vector_norms_are_reductions_with_steps_before_and_after(tmp_path):
    """torch.norm, Tensor.norm and torch.linalg.(vector_)norm of order 1, 2 ("fro") and inf are
    reductions (2: square, sum, sqrt), and x / (x.norm() + eps) is a norm reduction then a pointwise
    group: nothing stays PyTorch, and ModelNew matches Model."""
    path = tmp_path / "norms.py"
    path.write_text(VECTOR_NORMS)
    cap = capture(str(path))
    part = partition(cap)
    assert part.torch_ops == []
    reductions = [g for g in part.groups if g.family == "reduction"]
    forms = [(g.spec["op"], g.spec["params"].get("prologue"), g.spec["params"].get("epilogue")) for g in reductions]
    assert forms == [
        ("sum", [{"op": "square"}], [{"op": "sqrt"}]),
        ("sum", [{"op": "square"}], [{"op": "sqrt"}, {"op": "scale", "value": 0.5}]),
        ("sum", [{"op": "abs"}], None),
        ("max", [{"op": "abs"}], None),
        ("sum", [{"op": "square"}], [{"op": "sqrt"}]),
        ("sum", [{"op": "square"}], [{"op": "sqrt"}, {"op": "shift", "value": 1e-6}]),
    ], forms
    assert reductions[4].spec["dims"] == {"M": 1, "N": 3 * 5 * 33}   # the norm of every element
    assert_model_new_matches(tmp_path, VECTOR_NORMS, cap, part)


@pytest.mark.parametrize("expr, why", [
    ("torch.norm(x, p=3, dim=1)", "order 3"),
    ("torch.linalg.norm(x, dim=(1, 2))", "matrix norm"),
    ("torch.norm(x, p='nuc', dim=(1, 2))", "order 'nuc'"),
])
def test_norms_the_kernels_do_not_serve_stay_pytorch_with_the_reason(tmp_path, expr, why):
    path = tmp_path / "m.py"
    path.write_text(VECTOR_NORMS.replace("        a = torch.norm(x, p=2, dim=1)\n", f"        a = {expr}\n"))
    part = partition(capture(str(path)))
    assert any(why in t["why"] for t in part.torch_ops), part.torch_ops


VARIANCES = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        a = torch.var(x, dim=1)
        b = x.std(dim=-1, keepdim=True) * 2.0
        c = torch.std(x, dim=(1, 2), correction=0)
        d = x.var(2, False, True)
        e = x.var()
        return a, b, c, d, e


def get_inputs():
    return [torch.randn(3, 5, 33) * 3.0 + 100.0]


def get_init_inputs():
    return []
'''


def test_var_and_std_are_reductions_with_torchs_correction(tmp_path):
    path = tmp_path / "var.py"
    path.write_text(VARIANCES)
    cap = capture(str(path))
    part = partition(cap)
    assert part.torch_ops == []
    forms = [(g.spec["op"], g.spec["params"].get("correction"), g.spec["params"].get("epilogue"))
             for g in part.groups]
    assert forms == [("var", 1, None), ("var", 1, [{"op": "sqrt"}, {"op": "scale", "value": 2.0}]),
                     ("var", 0, [{"op": "sqrt"}]), ("var", 0, None), ("var", 1, None)], forms
    assert_model_new_matches(tmp_path, VARIANCES, cap, part)
