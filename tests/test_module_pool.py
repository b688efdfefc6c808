"""Pooling in uploaded modules: which forms become pool groups, their tails, why some stay
PyTorch, and that ModelNew with the pool kernels computes what Model does (interpreter)."""
from __future__ import annotations

from pathlib import Path

import torch

from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from tests.test_module_conv import (PARAMETER_TAIL, assert_model_new_matches, assert_one_value_read_at_run_time,
                                    captured_source)

MODULES = Path(__file__).parent / "modules"


def test_pool_block_forms_become_pool_groups(tmp_path):
    source = (MODULES / "pool_block.py").read_text()
    cap = capture(str(MODULES / "pool_block.py"))
    part = partition(cap)
    ops = [g.spec["op"] for g in part.groups]
    assert ops == ["max_pool2d", "avg_pool2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
                   "adaptive_max_pool2d", "adaptive_max_pool1d", "max_pool1d", "max_pool3d"]
    a, b, c, _, e, f, _, h, i = part.groups
    assert a.spec["params"]["epilogue"] == [{"op": "sigmoid"}]
    assert b.spec["params"]["epilogue"] == [{"op": "clamp_min", "value": 0.1}, {"op": "clamp_max", "value": 0.9}]
    assert b.spec["params"]["ceil_mode"] and not b.spec["params"]["count_include_pad"]
    assert c.spec["params"]["stride"] == [2, 2]                        # stride defaults to the kernel
    assert (e.spec["dims"]["OH"], e.spec["dims"]["OW"]) == (1, 1)    # global
    assert (f.spec["dims"]["OH"], f.spec["dims"]["OW"]) == (2, 10)   # (2, None) keeps W
    assert h.spec["params"]["dilation"] == [2] and h.spec["params"]["ceil_mode"]
    assert i.spec["params"]["indices"] and i.out["kind"] == "pool"   # indices only, values unused
    assert [t for t in part.torch_ops if "pool" in t["op"].lower()] == []
    assert_model_new_matches(tmp_path, source, cap, part)


NEAR_MISSES = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.lp = nn.LPPool2d(2, 2)

    def forward(self, x, k: int):
        v, i = self.pool(x)                      # both used: one kernel returns one of them
        u = F.max_pool2d(x[0], 2)                # no batch dim
        w = self.lp(x)                           # outside the catalog
        return v, i.float(), u, w


def get_inputs():
    return [torch.randn(2, 3, 8, 8), 2]


def get_init_inputs():
    return []
"""


def test_near_misses_stay_pytorch_with_the_reason(tmp_path):
    cap, part = captured_source(tmp_path, NEAR_MISSES)
    why = {t["op"].split(" (")[0]: t["why"] for t in part.torch_ops}
    assert "both used" in why["MaxPool2d pool"]
    assert "batch dim" in why["max_pool2d"]
    assert why["LPPool2d lp"] == "outside the kernel catalog"
    assert not [g for g in part.groups if g.family == "pool"]


TAILS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.scale = nn.Parameter(torch.rand(4, 1, 1) + 0.5)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x, r):
        y = self.pool(self.conv(x))
        return torch.tanh(y * self.scale + r)


def get_inputs():
    return [torch.randn(2, 3, 10, 9), torch.randn(2, 4, 4, 3)]


def get_init_inputs():
    return []
"""


def test_pool_after_a_conv_is_its_own_group_with_its_tail(tmp_path):
    cap, part = captured_source(tmp_path, TAILS)
    assert [g.family for g in part.groups] == ["conv", "pool"]
    pool = part.groups[1]
    assert pool.spec["params"]["epilogue"] == [{"op": "mul", "channel": True}, {"op": "add"}, {"op": "tanh"}]
    assert_model_new_matches(tmp_path, TAILS, cap, part)


def test_a_pool_divided_by_a_0d_parameter_reads_it_once_at_run_time(tmp_path):
    source = PARAMETER_TAIL.format(op="nn.MaxPool2d(2)", p="torch.tensor(4.0)", forward="self.op(x) / self.p",
                                   x="2, 3, 8, 10")
    (g,) = assert_one_value_read_at_run_time(tmp_path, source, torch.tensor(-0.5))
    assert g.spec["params"]["epilogue"] == [{"op": "div", "scalar": True}]
