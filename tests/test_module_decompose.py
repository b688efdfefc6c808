"""Composite ops (baddbmm, glu, addcmul, addcdiv, lerp, addmm with scales) are written out at
capture as the plain ops the catalog fuses, and the shrink / threshold activations are steps:
none stays PyTorch, and ModelNew computes Model's outputs."""
from __future__ import annotations

import pytest

from tests.test_module_conv import assert_model_new_matches, captured_source

TEMPLATE = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 24)
{init}

    def forward(self, x, y, z):
{body}

def get_inputs():
    return [torch.randn(4, 6, 16), torch.randn(4, 6, 16), torch.randn(4, 6, 16)]


def get_init_inputs():
    return []
"""


def _source(body: str, init: str = "") -> str:
    return TEMPLATE.format(body="".join(f"        {line}\n" for line in body.splitlines()),
                           init="".join(f"        {line}\n" for line in init.splitlines()))


CASES = [
    # name, forward, init, ops that must not stay PyTorch
    ("baddbmm", "s = torch.baddbmm(z[:, :, :6], x, y.transpose(1, 2), beta=0.5, alpha=0.25)\nreturn s.softmax(-1)",
     "", ["baddbmm"]),
    ("baddbmm method, beta 0", "return z[:, :, :6].baddbmm(x, y.transpose(1, 2), beta=0)", "", ["baddbmm"]),
    ("addmm scaled", "return torch.addmm(z[0, :, :6], x[0], y[0].t(), alpha=2.0)", "", ["addmm"]),
    ("glu", "return F.glu(self.fc(x), dim=-1)", "", ["glu"]),
    ("glu module", "return self.glu(torch.cat([x, y], dim=1))", "self.glu = nn.GLU(dim=1)", ["glu"]),
    ("addcmul, addcdiv", "a = torch.addcmul(x, y, z, value=0.5)\nreturn a.addcdiv(y, z.abs() + 1.0, value=2.0)", "",
     ["addcmul", "addcdiv"]),
    ("lerp both forms", "return torch.lerp(x, y, 0.25) + x.lerp(z, 0.75)", "", ["lerp"]),
    ("shrinks", "return F.tanhshrink(x) + F.softshrink(y, 0.5) + F.hardshrink(z, 0.3) + torch.hardshrink(x)", "",
     ["tanhshrink", "softshrink", "hardshrink"]),
    ("threshold, rrelu in eval", "return F.threshold(x, 0.1, 2.0) + F.rrelu(y) + self.th(z) + self.shrink(x)",
     "self.th = nn.Threshold(-0.2, -3.0)\nself.shrink = nn.Softshrink(0.25)", ["threshold", "rrelu", "shrink"]),
]


@pytest.mark.parametrize("name, body, init, ops", CASES, ids=[c[0] for c in CASES])
def test_composite_ops_fuse_and_match(tmp_path, name, body, init, ops):
    source = _source(body, init)
    cap, part = captured_source(tmp_path, source)
    left = [t for t in part.torch_ops if any(op in t["op"] for op in ops)]
    assert not left, left
    assert part.groups
    assert_model_new_matches(tmp_path, source, cap, part)


def test_rrelu_in_training_mode_stays_pytorch_with_the_reason(tmp_path):
    source = _source("return self.act(x) * 2.0", "self.act = nn.RReLU()")
    _, part = captured_source(tmp_path, source)
    assert any("random slope" in t["why"] for t in part.torch_ops), part.torch_ops


PRELU = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.PReLU(8)
        self.one = nn.PReLU()
        self.fc = nn.Linear(8, 5)
        self.w = nn.Parameter(torch.rand(5))

    def forward(self, x):
        h = self.act(self.bn(self.conv(x)))
        h = self.one(h * 2.0)
        return h, F.prelu(self.fc(h.mean(dim=(2, 3))), self.w)


def get_inputs():
    return [torch.randn(2, 3, 6, 5)]


def get_init_inputs():
    return []
"""


def test_prelu_per_channel_and_single_weight_fuse_and_follow_their_weights(tmp_path):
    import torch
    cap, part = captured_source(tmp_path, PRELU)
    assert not [t for t in part.torch_ops if "prelu" in t["op"].lower()], part.torch_ops
    assert sum("prelu" in op for g in part.groups for op in g.nodes) == 3
    assert_model_new_matches(tmp_path, PRELU, cap, part, changed={
        "act.weight": torch.linspace(-2.0, 3.0, 8), "one.weight": torch.tensor([-0.7]), "w": torch.rand(5) * 4 - 2})


def test_clamp_between_tensors_is_a_maximum_and_a_minimum(tmp_path):
    source = _source("lo = y.mean(-1, keepdim=True)[..., :1].expand(4, 6, 24)\n"
                     "return torch.clamp(self.fc(x), min=lo).clamp(max=2.0) + x.clip(z, z + 1.0).sum(-1, keepdim=True)")
    cap, part = captured_source(tmp_path, source)
    assert not [t for t in part.torch_ops if "clamp" in t["op"] or "clip" in t["op"]], part.torch_ops
    assert_model_new_matches(tmp_path, source, cap, part)
