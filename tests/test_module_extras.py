"""Softmax over any dim, identity ops read past, where / masked_fill and whole-tensor reductions in
uploaded modules: the groups they become, why near misses stay PyTorch, and that ModelNew with the
default kernels computes what Model does (interpreter, small sizes)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from tests.test_module_conv import assert_model_new_matches, captured_source

MODULES = Path(__file__).parent / "modules"


@pytest.fixture(scope="module")
def softmax_dims():
    path = MODULES / "softmax_dims.py"
    cap = capture(str(path))
    return path.read_text(), cap, partition(cap)


def test_softmax_over_a_middle_dim_is_a_strided_group_with_its_tail(softmax_dims):
    _, _, part = softmax_dims
    by_line = {g.ops[0].split("(line ")[-1]: g for g in part.groups}
    a = by_line["20)"]
    assert a.family == "softmax" and a.spec["params"]["inner"] == 5 * 7 and a.spec["dims"] == {"M": 2 * 5 * 7, "N": 6}
    # the [C, 1, 1] bias is read in place (periodic), then the scale and sigmoid fuse
    assert a.spec["params"]["epilogue"] == [{"op": "add", "every": 35, "period": 6}, {"op": "scale", "value": 2.0},
                                           {"op": "sigmoid"}]
    assert a.inputs[0] == {"arg": 0, "view": "strided", "dim": 1}
    assert by_line["21)"].spec["params"]["epilogue"] == [{"op": "tanh"}, {"op": "scale", "value": 0.5}]
    assert by_line["22)"].spec["op"] == "log_softmax" and by_line["22)"].spec["params"] == {"inner": 9}
    assert "inner" not in by_line["23)"].spec["params"]   # the last dim stays the plain row layout


def test_identity_ops_split_no_group(softmax_dims):
    _, _, part = softmax_dims
    # clone().detach(), nn.Identity, nn.Dropout(0), .contiguous(), .float() on fp32, eval F.dropout:
    # nothing is left to PyTorch, and relu(x) + orig reads x once (orig is x)
    assert part.torch_ops == []
    e = next(g for g in part.groups if g.ops[0].startswith(".relu()"))
    assert e.spec["params"]["chain"][0]["op"] == "fork" and len(e.args) == 1


def test_softmax_dims_model_new_matches(tmp_path, softmax_dims):
    source, cap, part = softmax_dims
    assert_model_new_matches(tmp_path, source, cap, part)


KEPT_COPY = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        y = x.clone()
        y.relu_()            # the clone keeps x's old value: it is a real copy
        return nn.functional.softmax(y, dim=None) + x.float().half().float(), y  # implicit dim


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
"""


def test_near_misses_stay_pytorch_with_the_reason(tmp_path):
    cap, part = captured_source(tmp_path, KEPT_COPY)
    why = {t["op"].split(" (")[0]: t["why"] for t in part.torch_ops}
    assert "dim None" in why["softmax"] and "integer" in why["softmax"]
    assert why[".half()"] == "dtype casts are not fused"
    assert_model_new_matches(tmp_path, KEPT_COPY, cap, part)


OUTER_DIFFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.exp(x[..., :, None] - x[..., None, :])


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return []
"""


def test_an_outer_difference_left_to_pytorch_says_why(tmp_path):
    # Mamba2's segsum: both operands broadcast; the plan said "nothing to fuse it with"
    cap, part = captured_source(tmp_path, OUTER_DIFFERENCE)
    why = {t["op"].split(" ")[0]: t["why"] for t in part.torch_ops}
    assert "both operands are broadcast" in why["sub"], part.torch_ops
    assert_model_new_matches(tmp_path, OUTER_DIFFERENCE, cap, part)
