"""Normalizations in uploaded modules: which forms become norm groups (modules, F.* functions,
hand-written x / norm(x)), the pointwise tail they take, why near misses stay PyTorch, and that
ModelNew computes what Model does in training mode -- batch norm's running buffers included --
in the interpreter; tests/modules/norm_block.py also runs through optimize end to end."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtmc.agents.context import Context
from mtmc.agents.module_flow import optimize_module
from mtmc.module.assemble import assemble
from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from mtmc.tools.loader import load_file
from kernel_helpers import template_kernels
from test_module_conv import PARAMETER_TAIL, assert_one_value_read_at_run_time

MODULES = Path(__file__).parent / "modules"


@pytest.fixture(scope="module")
def block():
    cap = capture(str(MODULES / "norm_block.py"))
    return cap, partition(cap)


def test_every_norm_form_is_a_group(block):
    _, part = block
    assert [g.spec["op"] for g in part.groups] == [
        "batchnorm", "groupnorm", "instancenorm", "layernorm", "rmsnorm", "batchnorm", "frobenius", "batchnorm",
        "l2norm", "l2norm", "l1norm"]
    assert part.torch_ops == []
    bn, gn, inorm, ln, rms, bn_eval, fro, bn1, normalize, l2, l1 = part.groups
    # training mode: the running buffers are launch keywords, the mode a guard
    assert bn.out["kwargs"] == {"running_mean": 4, "running_var": 5, "num_batches_tracked": 6}
    assert bn.args[3] == {"attr": "bn.training"} and bn.guards == [{"arg": 3, "value": True}]
    assert bn.spec["dims"] == {"N": 2, "C": 6, "S": 35} and bn.inputs[0]["view"] == "channels"
    assert bn1.spec["params"]["momentum"] is None and bn1.spec["dims"] == {"N": 2, "C": 30, "S": 7}
    # F.batch_norm(training=False): the running statistics are kernel inputs
    assert bn_eval.spec["params"]["training"] is False and len(bn_eval.inputs) == 3 and "kwargs" not in bn_eval.out
    assert gn.spec["params"]["epilogue"] == [{"op": "relu"}, {"op": "scale", "value": 0.5}]
    assert ln.spec["dims"] == {"M": 12, "N": 35} and ln.inputs[0]["view"] == "trailing"
    assert inorm.spec["params"]["affine"] is True and rms.spec["params"]["eps"] == 1e-5
    assert normalize.spec["params"]["eps"] == 1e-12 and l2.spec["params"]["eps"] == 0.0
    assert l1.spec["params"]["epilogue"] == [{"op": "shift", "value": 1.0}] and len(l1.nodes) == 4
    assert fro.nodes == ["norm", "truediv"]


def test_model_new_matches_model_and_updates_the_running_buffers(block, tmp_path):
    cap, part = block
    kernels = template_kernels(part.groups)
    source = (MODULES / "norm_block.py").read_text()
    out = tmp_path / "new_norm_block.py"
    out.write_text(assemble(source, cap, part.groups, kernels))
    m = load_file(out, "norm_block_new")
    torch.manual_seed(0)
    model, new = m.Model(*m.get_init_inputs()), m.ModelNew(*m.get_init_inputs())
    new.load_state_dict(model.state_dict())
    with torch.no_grad():
        for _ in range(2):   # the second call sees the first one's running statistics
            x = m.get_inputs()
            torch.testing.assert_close(new(*x), model(*x), rtol=1e-4, atol=1e-5)
    for name, want in model.state_dict().items():
        torch.testing.assert_close(new.state_dict()[name], want, rtol=1e-5, atol=1e-6, msg=name)
    new.eval()   # built for training mode: says so rather than using the wrong statistics
    with pytest.raises(ValueError, match="built for a value of True"):
        new(*m.get_inputs())


CHANNELS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x):
        a = x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)   # RMSNorm over the channels
        b = F.normalize(a, dim=1)
        c = b * torch.rsqrt((b * b).mean(1, keepdim=True) + 1e-6)
        d = c / c.norm(p=1, dim=1, keepdim=True)
        return d / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + 1e-5) - 0.5   # and over the last dim


def get_inputs():
    return [torch.randn(2, 6, 5, 7)]


def get_init_inputs():
    return []
'''


def test_normalizations_over_the_channels_read_x_in_place(tmp_path):
    path = tmp_path / "channels.py"
    path.write_text(CHANNELS)
    cap = capture(str(path))
    part = partition(cap)
    assert [(g.spec["op"], g.spec["params"].get("inner")) for g in part.groups] == [
        ("rmsnorm", 35), ("l2norm", 35), ("rmsnorm", 35), ("l1norm", 35), ("rmsnorm", None)]
    assert part.groups[0].inputs[0]["view"] == "strided" and part.groups[0].spec["dims"] == {"M": 70, "N": 6}
    assert part.groups[-1].spec["params"]["epilogue"] == [{"op": "shift", "value": -0.5}]
    assert part.torch_ops == []
    out = tmp_path / "new_channels.py"
    out.write_text(assemble(CHANNELS, cap, part.groups, template_kernels(part.groups)))
    m = load_file(out, "norm_channels_new")
    x = m.get_inputs()
    torch.testing.assert_close(m.ModelNew()(*x), m.Model()(*x), rtol=1e-4, atol=1e-5)


NEAR_MISSES = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.inorm = nn.InstanceNorm2d(4, track_running_stats=True)
        self.gn = nn.GroupNorm(2, 4)

    def forward(self, x, v):
        a = self.inorm(x)
        b = F.normalize(x, dim=(1, 2))                 # over two dims
        c = x / torch.norm(x, p=3)                     # a 3-norm
        d = F.group_norm(x, x.shape[1] // 2)           # groups computed from a size
        e = F.batch_norm(v, None, None, None, self.gn.bias, training=True)   # a bias without a weight
        return a, b, c, d, e


def get_inputs():
    return [torch.randn(2, 4, 3, 3), torch.randn(3, 4)]


def get_init_inputs():
    return []
'''


def test_near_misses_stay_pytorch_with_a_reason(tmp_path):
    path = tmp_path / "near.py"
    path.write_text(NEAR_MISSES)
    part = partition(capture(str(path)))
    why = {t["op"].split(" (")[0]: t["why"] for t in part.torch_ops}
    assert "track_running_stats=True" in why["InstanceNorm2d inorm"]
    assert "over dim (1, 2)" in why["normalize"]
    assert "a bias but no weight" in why["batch_norm"]
    assert "group_norm" in why and "norm" in why
    assert [g.spec["op"] for g in part.groups if g.family == "norm"] == []


SMALL = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4)
        self.gn = nn.GroupNorm(2, 4)

    def forward(self, x):
        y = torch.relu(self.bn(x))
        z = self.gn(y) * 2.0
        return z / torch.norm(z, p="fro")


def get_inputs():
    return [torch.randn(2, 4, 5, 6) + 1.0]


def get_init_inputs():
    return []
'''


def test_optimize_end_to_end_passes_the_guard(tmp_path):
    """Training-mode batch norm with its tail, group norm, Frobenius: captured in a child, each group's
    template verified by the guard, ModelNew checked against Model (norm_block.py runs the same way
    in test_module_optimize's end-to-end test)."""
    path, out, report = tmp_path / "small.py", tmp_path / "new.py", tmp_path / "report.md"
    path.write_text(SMALL)
    summary = optimize_module(str(path), Context(target="h200", max_steps=0), str(out), str(report))
    assert summary["status"] == "done", summary.get("message")
    assert summary["check"]["status"] == "passed", summary["check"]
    assert [g["family"] for g in summary["groups"]] == ["norm"] * 3
    assert all(g["status"] == "kernel" for g in summary["groups"])
    assert "Triton norm" in report.read_text()


def test_a_one_value_parameter_after_norms_is_read_once_at_run_time(tmp_path):
    source = PARAMETER_TAIL.format(op="nn.ModuleList([nn.GroupNorm(2, 4), nn.LayerNorm(10)])",
                                   p="torch.full((1, 1, 1, 1), 0.5)",
                                   forward="self.op[0](x) / self.p, self.op[1](x) - self.p", x="2, 4, 3, 10")
    gn, ln = assert_one_value_read_at_run_time(tmp_path, source, torch.full((1, 1, 1, 1), 2.0))
    assert gn.spec["params"]["epilogue"] == [{"op": "div", "scalar": True}]     # the split template's apply
    assert ln.spec["params"]["epilogue"] == [{"op": "sub", "scalar": True}]     # the row template


def test_layer_norms_written_out_are_norm_groups(tmp_path):
    """(x - mean) / sqrt(mean((x - mean)^2) + eps) took three groups and three passes (a mean, a
    variance, a divide): tried as a user's upload, 2026-12-06.  Over the last dim it is one norm
    group; over a middle dim (ConvNeXt's channels-first form) it stays as it was."""
    from test_module_conv import assert_model_new_matches
    path = MODULES / "handwritten_layernorm.py"
    cap = capture(str(path))
    part = partition(cap)
    norms = [g for g in part.groups if g.family == "norm"]
    assert [g.spec["op"] for g in norms] == ["layernorm", "layernorm"]
    assert all(g.spec["params"]["affine"] is False for g in norms)
    assert [s["op"] for s in norms[0].spec["params"]["epilogue"]][:2] == ["mul", "bias"]   # * w + b
    assert {g.family for g in part.groups} == {"norm", "reduction", "elementwise"}   # the channels-first one
    assert_model_new_matches(tmp_path, path.read_text(), cap, part, changed={"w": torch.rand(40) + 0.5})
