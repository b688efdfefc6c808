"""Convolutions in uploaded modules: which nodes become conv groups, what their epilogues take,
why some stay PyTorch, and that ModelNew with the conv kernels computes what Model does (in the
interpreter, Model's state_dict loaded).  tests/modules/conv_block.py and conv_bias_act.py also
run through optimize end to end in tests/test_module_optimize.py."""
from __future__ import annotations

from pathlib import Path

import torch

from mtmc.module.assemble import assemble
from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from mtmc.tools.loader import load_file
from kernel_helpers import assert_groups_compile, template_kernels

MODULES = Path(__file__).parent / "modules"


def captured_source(tmp_path, source: str, name: str = "model.py"):
    path = tmp_path / name
    path.write_text(source)
    cap = capture(str(path))
    return cap, partition(cap)


def assert_model_new_matches(tmp_path, source: str, cap, part, changed: dict | None = None) -> None:
    """ModelNew with every group's template kernel at its default config: Model's outputs; and
    again once `changed` (state_dict entries, new values) is loaded into both, which a kernel
    that baked a parameter's value into its source would miss."""
    out = tmp_path / "new_model.py"
    out.write_text(assemble(source, cap, part.groups, template_kernels(part.groups)))
    m = load_file(out, f"conv_new_{abs(hash(source))}")
    torch.manual_seed(0)
    model, new = m.Model(*m.get_init_inputs()), m.ModelNew(*m.get_init_inputs())
    new.load_state_dict(model.state_dict())
    inputs = m.get_inputs()

    def compare():
        with torch.no_grad():
            torch.testing.assert_close(new(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)

    compare()
    if changed:
        state = {**model.state_dict(), **changed}
        model.load_state_dict(state)
        new.load_state_dict(state)
        compare()


def test_conv_block_groups():
    part = partition(capture(str(MODULES / "conv_block.py")))
    conv, depthwise, up = part.groups
    assert [g.spec["op"] for g in part.groups] == ["conv2d", "conv2d", "conv_transpose2d"]
    # bias, the [C, 1, 1] scale as a channel vector, relu; the weights are module parameters
    assert conv.spec["params"]["epilogue"] == [{"op": "bias"}, {"op": "mul", "channel": True}, {"op": "relu"}]
    assert conv.args[1:3] == [{"attr": "conv.weight"}, {"attr": "conv.bias"}]
    # F.conv2d(padding="same", groups=self.mid_ch): a depthwise conv with its padding worked out
    assert depthwise.spec["params"]["groups"] == 8 and depthwise.spec["params"]["padding"] == [[1, 1], [1, 1]]
    # the transposed conv adds the skip tensor (a full operand) and applies tanh
    assert up.spec["params"]["output_padding"] == [1, 1] and up.spec["dims"]["OH"] == 10
    assert up.spec["params"]["epilogue"] == [{"op": "add"}, {"op": "tanh"}]
    assert up.inputs[2] == {"arg": 2, "view": "like", "of": "out"} and part.torch_ops == []


LEFT_TO_PYTORCH = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.reflect = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
        self.conv = nn.Conv1d(4, 6, 3)

    def forward(self, x, seq):
        y = self.reflect(x)
        z = F.conv2d(y, self.reflect.weight, groups=y.shape[1] // 4)   # groups computed from a size
        return z.sum(), self.conv(seq[0])                                # an unbatched conv1d


def get_inputs():
    return [torch.randn(2, 4, 6, 6), torch.randn(2, 4, 9)]


def get_init_inputs():
    return []
"""


def test_what_the_conv_kernels_do_not_serve_stays_pytorch_with_the_reason(tmp_path):
    _, part = captured_source(tmp_path, LEFT_TO_PYTORCH)
    # the reflect-padded conv is served now (its gather remaps indices); the other two are not
    assert [g.spec["params"].get("padding_mode") for g in part.groups if g.family == "conv"] == ["reflect"]
    why = {t["node"]: t["why"] for t in part.torch_ops}
    assert "computed number of groups" in why["conv2d"]
    assert "unbatched" in why["conv"]


TAILS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv3d(2, 4, (2, 3, 1), stride=(1, 2, 1), padding=(1, 0, 0), bias=False)
        self.b = nn.ConvTranspose1d(4, 4, 3, stride=2, groups=2)
        self.mask = nn.Parameter(torch.rand(1, 1, 5, 1, 5))

    def forward(self, x, s):
        y = self.a(x) * self.mask            # broadcast over all but channels: expanded, noted
        y = y - 0.25
        t = self.b(s)                        # two users: the conv alone, its users are their own ops
        return torch.sigmoid(y), t + t.mean()


def get_inputs():
    return [torch.randn(2, 2, 4, 6, 5), torch.randn(1, 4, 7)]


def get_init_inputs():
    return []
"""


def test_conv_tails_and_model_new_matches(tmp_path):
    cap, part = captured_source(tmp_path, TAILS)
    a, b = [g for g in part.groups if g.family == "conv"]
    assert a.spec["op"] == "conv3d" and [s["op"] for s in a.spec["params"]["epilogue"]] == ["mul", "shift", "sigmoid"]
    assert a.inputs[2]["view"] == "like" and any("expanded" in n for n in a.notes)
    assert b.spec["op"] == "conv_transpose1d" and b.spec["params"]["epilogue"] == [{"op": "bias"}]
    assert_model_new_matches(tmp_path, TAILS, cap, part)


# a module whose one op `self.op` is followed by a pointwise step with a small parameter `self.p`
PARAMETER_TAIL = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.op = {op}
        self.p = nn.Parameter({p})

    def forward(self, x):
        return {forward}


def get_inputs():
    return [torch.randn({x})]


def get_init_inputs():
    return []
"""


def assert_one_value_read_at_run_time(tmp_path, source: str, p) -> list:
    """Every group reads the one-value parameter `p` as a scalar input (loaded once, no full-size
    copy, so no "(a copy)" note); ModelNew matches Model, again once p is changed to another
    value (read at run time, not baked into the source); the kernels compile for sm_90.  The
    groups, for the caller's own checks."""
    cap, part = captured_source(tmp_path, source)
    for g in part.groups:
        assert any(i["view"] == "scalar" for i in g.inputs), g.inputs
        assert not any("(a copy)" in n for n in g.notes), g.notes
    assert_model_new_matches(tmp_path, source, cap, part, changed={"p": p})
    assert_groups_compile(part.groups)
    return part.groups


def test_a_0d_parameter_in_a_conv_tail_is_one_value_read_at_run_time(tmp_path):
    source = PARAMETER_TAIL.format(op="nn.Conv2d(3, 4, 3)", p="torch.tensor(2.0)",
                                   forward="torch.relu(self.op(x) * self.p)", x="2, 3, 7, 9")
    (g,) = assert_one_value_read_at_run_time(tmp_path, source, torch.tensor(-0.75))
    assert g.spec["params"]["epilogue"] == [{"op": "bias"}, {"op": "mul", "scalar": True}, {"op": "relu"}]
    assert g.inputs[3] == {"arg": 3, "view": "scalar"} and g.args[3] == {"node": "p"}   # the parameter itself


_METADATA_READERS = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose2d(3, 4, 3, stride=2)

    def forward(self, x):
        y = self.conv(x) + 0.5
        y = torch.min(y, torch.tensor(0.0, device=y.device))   # KernelBench L2 93's constant
        n = y.size(0)
        z = torch.nn.functional.gelu(y) * 2.0
        return z.reshape(n, -1) + z.sum(-1).reshape(n, -1).mean()

def get_inputs():
    return [torch.rand(2, 3, 5, 6)]

def get_init_inputs():
    return []
'''


def test_metadata_readers_do_not_end_a_conv_epilogue(tmp_path):
    """`x.device` and `x.size(0)` read no data: the chain after the conv runs on through them (it
    stopped at the add, whose `.device` looked like a second user, leaving min, gelu and mul to a
    pass of their own on the H100), and ModelNew reads the size from the kernel's output instead
    of running the conv in PyTorch too."""
    cap, part = captured_source(tmp_path, _METADATA_READERS)
    conv = part.groups[0]
    assert [op.split(" (")[0] for op in conv.ops] == ["ConvTranspose2d conv", "add", "min", "gelu", "mul"]
    assert conv.spec["params"]["epilogue"][-3:] == [{"op": "clamp_max", "value": 0.0}, {"op": "gelu"},
                                                   {"op": "scale", "value": 2.0}]
    assert_model_new_matches(tmp_path, _METADATA_READERS, cap, part)
    forward = (tmp_path / "new_model.py").read_text().split("class ModelNew")[1]
    assert "self.conv(" not in forward and "torch.tensor" not in forward
    assert "size = group_0.size(0)" in forward
