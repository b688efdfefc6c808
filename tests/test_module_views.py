"""Pure views (view / reshape / flatten / unflatten / squeeze / unsqueeze) inside a fusion group
(module.view_fusion): the pointwise tail after a softmax, norm or reduction, and the prologue
before one, are read through them, their operands mapped to the kernel's row-major index; a
transpose still ends the group, with the reason.  ModelNew is checked against Model in the
interpreter (small shapes)."""
from __future__ import annotations

import pytest
import torch

from mtmc.module import graph_stage
from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from mtmc.module.view_fusion import view_shape
from tests.test_module_conv import assert_model_new_matches, captured_source

SOFTMAX_FLAT = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench level 2 #38's tail: softmax over the flattened spatial dims, then a per-channel scale."""
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(1, 4, 1, 1, 1) + 0.5)

    def forward(self, x):
        b, c, d, h, w = x.shape
        x = x.view(b, c, -1)
        x = torch.softmax(x, dim=2)
        x = x.view(b, c, d, h, w)
        return x * self.scale


def get_inputs():
    return [torch.randn(2, 4, 3, 4, 5)]


def get_init_inputs():
    return []
'''


def _model_new(tmp_path, source, cap, part):
    from kernel_helpers import template_kernels
    from mtmc.module.assemble import assemble
    from mtmc.tools.loader import load_file
    out = tmp_path / "new_views.py"
    out.write_text(assemble(source, cap, part.groups, template_kernels(part.groups)))
    return load_file(out, f"views_new_{abs(hash(source))}")


def test_softmax_over_flattened_dims_takes_its_per_channel_scale_after_the_view(tmp_path):
    cap, part = captured_source(tmp_path, SOFTMAX_FLAT)
    assert len(part.groups) == 1 and part.torch_ops == []   # was softmax, then the multiply alone
    g = part.groups[0]
    assert (g.family, g.spec["dims"]) == ("softmax", {"M": 8, "N": 60})
    # one value per softmax row: the [1, C, 1, 1, 1] scale read in place, element i meets scale[(i // 60) % 4]
    assert g.spec["params"]["epilogue"] == [{"op": "mul", "every": 60, "period": 4}]
    assert g.inputs[1]["view"] == "periodic"
    assert g.out["view"] == [[2, 4, 60], [2, 4, 3, 4, 5]]
    assert_model_new_matches(tmp_path, SOFTMAX_FLAT, cap, part, {"scale": torch.rand(1, 4, 1, 1, 1)})
    # another batch: the recorded views follow the call's sizes
    m = _model_new(tmp_path, SOFTMAX_FLAT, cap, part)
    model, new = m.Model(), m.ModelNew()
    new.load_state_dict(model.state_dict())
    x = torch.randn(3, 4, 3, 4, 5)
    with torch.no_grad():
        torch.testing.assert_close(new(x), model(x), rtol=1e-4, atol=1e-5)


INSTANCE_NORM_SQUEEZED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench level 2 #28: instance norm of a [B, F] matrix seen as [B, 1, 1, F], then y added and multiplied."""
    def __init__(self):
        super().__init__()
        self.bmm = nn.Linear(16, 32)
        self.instance_norm = nn.InstanceNorm2d(32, eps=1e-5, momentum=0.1)

    def forward(self, x, y):
        x = self.bmm(x)
        x = self.instance_norm(x.unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1)
        x = x + y
        x = x * y
        return x


def get_inputs():
    return [torch.randn(6, 16), torch.randn(6, 32)]


def get_init_inputs():
    return []
'''


@pytest.mark.filterwarnings("ignore:input's size at dim=1 does not match num_features")
def test_squeezed_instance_norm_takes_the_full_size_residual_as_its_epilogue(tmp_path):
    cap, part = captured_source(tmp_path, INSTANCE_NORM_SQUEEZED)
    assert [g.family for g in part.groups] == ["matmul", "norm"]   # was matmul, norm, elementwise
    norm = part.groups[1]
    assert norm.spec["params"]["epilogue"] == [{"op": "add"}, {"op": "mul"}]
    # y ([6, 32], the add's shape) is viewed into the kernel's [6, 1, 1, 32] before it is read
    assert [i.get("space") for i in norm.inputs[1:]] == [[[6, 1, 1, 32], [6, 32]]] * 2
    assert norm.out["view"] == [[6, 1, 1, 32], [6, 32]]
    assert_model_new_matches(tmp_path, INSTANCE_NORM_SQUEEZED, cap, part)


THROUGH_VIEWS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(6)
        self.bias = nn.Parameter(torch.randn(6))
        self.six = nn.Parameter(torch.randn(6))
        self.piece = nn.Parameter(torch.randn(1, 1, 4))

    def forward(self, x, r):
        # a prologue with a full-size operand before a flatten, a full-size one after an unflatten
        a = F.log_softmax((x * 2.0 + r).flatten(1), dim=1).unflatten(1, (4, 6)) - r
        # the last dim kept: the bias stays a vector along the kernel's rows
        b = self.ln(x).reshape(-1, 6) + self.bias
        # the softmax's dim regrouped by the view: the operands meet the same elements in the same order
        c = torch.softmax((x + self.six).view(3, 24), dim=-1)
        d = torch.softmax(x.reshape(3, 24), dim=-1).view(3, 6, 4) * self.piece
        return a, b, c, d


def get_inputs():
    return [torch.randn(3, 4, 6), torch.randn(3, 4, 6)]


def get_init_inputs():
    return []
'''


def test_prologues_and_epilogues_read_through_views_with_every_operand_kind(tmp_path):
    cap, part = captured_source(tmp_path, THROUGH_VIEWS)
    assert [g.spec["op"] for g in part.groups] == ["log_softmax", "layernorm", "softmax", "softmax"]
    assert part.torch_ops == []
    a, b, c, d = part.groups
    assert a.spec["params"]["prologue"] == [{"op": "scale", "value": 2.0}, {"op": "add"}]
    assert a.spec["params"]["epilogue"] == [{"op": "sub"}]
    assert a.out["in_view"] == [[3, 4, 6], [3, 24]] and a.out["view"] == [[3, 24], [3, 4, 6]]
    assert b.spec["params"]["epilogue"] == [{"op": "bias"}] and b.out["view"] == [[3, 4, 6], [12, 6]]
    assert c.spec["params"]["prologue"] == [{"op": "add", "every": 1, "period": 6}]
    assert d.spec["params"]["epilogue"] == [{"op": "mul", "every": 1, "period": 4}]
    assert_model_new_matches(tmp_path, THROUGH_VIEWS, cap, part)


LOGSUMEXP_SQUEEZED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench level 2 #42's tail: a logsumexp over the channels, its size-1 dims squeezed, scaled."""
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(4, 1, 1))

    def forward(self, x):
        x = torch.mean(x, dim=(2, 3), keepdim=True) + self.bias
        x = torch.logsumexp(x, dim=1, keepdim=True)
        x = torch.sum(x, dim=(2, 3))
        return x * 10.0


def get_inputs():
    return [torch.randn(2, 4, 5, 6)]


def get_init_inputs():
    return []
'''


def test_reduction_takes_its_scale_after_a_squeeze(tmp_path):
    path = tmp_path / "lse.py"
    path.write_text(LOGSUMEXP_SQUEEZED)
    cap = graph_stage.run(capture(str(path)))["captured"]   # the sum over size-1 dims becomes a squeeze
    part = partition(cap)
    assert [g.ops for g in part.groups] == [   # the multiply was a group of its own
        ["mean (line 13)"], ["add (line 13)", "logsumexp (line 14)", "mul (line 16)"]]
    lse = part.groups[1]
    assert lse.spec["params"]["epilogue"] == [{"op": "scale", "value": 10.0}]
    assert lse.out["view"] == [[2, 1, 1, 1], [2, 1]]
    assert_model_new_matches(tmp_path, LOGSUMEXP_SQUEEZED, cap, part)


REORDERED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        a = torch.softmax(x, dim=-1).transpose(1, 2).reshape(2, -1) * 2.0   # elements reordered
        s = torch.softmax(x + 1.0, dim=-1)
        b = s.view(s.size(0), -1) * 3.0   # the softmax's own shape is read
        return a, b


def get_inputs():
    return [torch.randn(2, 3, 5)]


def get_init_inputs():
    return []
'''


def test_a_transpose_or_a_read_shape_still_ends_the_group_with_the_reason(tmp_path):
    cap, part = captured_source(tmp_path, REORDERED)
    assert [g.family for g in part.groups] == ["softmax", "softmax", "elementwise", "elementwise"]
    first, second = part.groups[:2]
    assert "epilogue" not in first.spec["params"] and "epilogue" not in second.spec["params"]
    assert any("transpose" in n and "reorders the elements" in n for n in first.notes)
    assert any("the shape of softmax" in n and "is read later" in n for n in second.notes)
    m = _model_new(tmp_path, REORDERED, cap, part)
    x = m.get_inputs()
    with torch.no_grad():
        for got, want in zip(m.ModelNew()(*x), m.Model()(*x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_view_shape_follows_kept_and_merged_dims_and_refuses_the_rest():
    assert view_shape((2, 4, 60), (2, 4, 60), (2, 4, 3, 4, 5)) == (2, 4, 3, 4, 5)
    assert view_shape((5, 4, 60), (2, 4, 60), (2, 4, 3, 4, 5)) == (5, 4, 3, 4, 5)
    assert view_shape((5, 1, 1, 7), (6, 1, 1, 32), (6, 32)) == (5, 7)
    assert view_shape((5, 7), (6, 32), (6, 1, 1, 32)) == (5, 1, 1, 7)
    assert view_shape((5, 4, 6), (3, 4, 6), (3, 24)) == (5, 24)
    with pytest.raises(ValueError, match="recorded as"):
        view_shape((3, 4), (4, 3), (2, 6))
