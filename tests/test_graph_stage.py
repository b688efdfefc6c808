"""The graph stage's algebraic rewrites (mtmc.module.graph_stage): each applied where legal (the
module still matches Model, the fusion groups change as expected) and refused where not, with
the reason.  CPU only: kernels in Triton's interpreter at small shapes."""
from __future__ import annotations

import pytest
import torch

from kernel_helpers import template_kernels
from mtmc.agents.context import Context
from mtmc.agents.module_flow import optimize_module, plan_module
from mtmc.module import graph_stage
from mtmc.module.assemble import assemble
from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from mtmc.module.report import rewrite_answer
from mtmc.tools.loader import load_file
from test_module_optimize import MODULES

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


def _module(tmp_path, forward: str, init: str = "", inputs: str = "torch.rand(4, 16)", args: str = "",
            name: str = "model.py"):
    path = tmp_path / name
    path.write_text(HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                    + "".join(f"        {line}\n" for line in (init or "pass").splitlines())
                    + "\n    def forward(self, x):\n"
                    + "".join(f"        {line}\n" for line in forward.splitlines())
                    + f"\n\ndef get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return [{args}]\n")
    return path


def _by_rule(cands, rule):
    return [c for c in cands if c.rule == rule]


def _one(path, rule: str):
    """(the capture of the module at `path`, its one candidate of `rule`)."""
    cap = capture(str(path))
    (c,) = _by_rule(graph_stage.candidates(cap["graphs"][0]), rule)
    return cap, c


def _with(cap: dict, desc: dict) -> dict:
    """The capture with its (only) graph replaced by a candidate's edited one."""
    return {**cap, "graphs": [{**desc, "rewritten": True}]}


def _both(path, source: str, cap: dict, kernels: bool = True, seed: int = 0, update=None):
    """Model and ModelNew (written from `cap`) on the same weights and inputs; `update(model)`
    runs on both after the state_dict is loaded (a parameter update after construction)."""
    part = partition(cap)
    out = path.with_name(f"new_{path.stem}_{seed}.py")
    out.write_text(assemble(source, cap, part.groups, template_kernels(part.groups) if kernels else {}))
    m = load_file(out, f"gs_{path.stem}_{seed}_{id(cap)}")
    torch.manual_seed(seed)
    model = m.Model(*m.get_init_inputs())
    new = m.ModelNew(*m.get_init_inputs())
    new.load_state_dict(model.state_dict())
    if update is not None:
        with torch.no_grad():
            update(model)
            update(new)
    inputs = m.get_inputs()
    with torch.no_grad():
        return model(*inputs), new(*inputs), new, inputs, part


def _close(a, b):
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def _matches(tmp_path, path, cap: dict, **kw):
    """ModelNew written from `cap` computes Model's output (see _both); _both's other values."""
    a, b, *rest = _both(tmp_path / path.name, path.read_text(), cap, **kw)
    _close(a, b)
    return rest


# -- a reduction moved before the linear map ----------------------------------------------------

def test_sum_after_matmul_becomes_a_gemv_and_follows_parameter_updates(tmp_path):
    path = MODULES / "gemm_divide_sum.py"
    cap = capture(str(path))
    before = partition(cap)
    assert [g.family for g in before.groups] == ["matmul", "reduction"]
    stage = graph_stage.run(cap)
    (rw,) = stage["applied"]
    assert rw["rule"] == "reduction_before_linear" and rw["status"] == "applied"
    assert "affine" in rw["reason"] and rw["predicted"]["gain_ms"] > 0
    assert rw["predicted"]["after"]["flops"] < rw["predicted"]["before"]["flops"] / 50
    stage_decision = stage["decisions"][0]
    assert stage_decision["action"]["rule"] == "reduction_before_linear" and stage_decision["alternatives"]
    after = partition(stage["captured"])
    # no GEMM left: the weight's sum over the features, then x times it summed over the last dim (the GEMV)
    assert [g.family for g in after.groups] == ["reduction", "reduction"]
    gemv = after.groups[1]
    assert gemv.spec["dims"] == {"M": 256, "N": 2048} and gemv.spec["params"]["prologue"][0]["op"] == "mul"

    def update(m):   # the derived weights follow a change of the parameter after construction
        m.weight.mul_(-0.5).add_(0.01)
    _matches(tmp_path, path, stage["captured"], update=update)


def test_mean_over_features_with_a_subtract_and_a_singleton_logsumexp_through_optimize(tmp_path):
    """The real optimize path: rewrite, plan, kernels, assemble and the whole-module guard."""
    out, report = tmp_path / "new.py", tmp_path / "report.md"
    summary = optimize_module(str(MODULES / "gemm_subtract_mean.py"), Context(target="h200", max_steps=0), str(out),
                              str(report))
    assert summary["status"] == "done" and summary["check"]["status"] == "passed", summary["check"]
    applied = {(r["rule"], r["status"]) for r in summary["rewrites"]["applied"]}
    assert applied == {("reduction_before_linear", "applied"), ("identity", "applied")}
    assert "matmul" not in {g["family"] for g in summary["groups"]}
    text = report.read_text()
    assert "## Graph-stage rewrites" in text and "reduction_before_linear" in text and "logsumexp" in text
    answer = "\n".join(rewrite_answer("why did you rewrite the mean?", summary))
    assert "reduction_before_linear" in answer and "affine" in answer and "predicted" in answer


def test_plan_only_lists_the_rewrites(tmp_path):
    plan = plan_module(str(MODULES / "gemm_divide_sum.py"))
    assert plan["status"] == "planned"
    assert [r["rule"] for r in plan["rewrites"]["applied"]] == ["reduction_before_linear"]
    assert [g["family"] for g in plan["groups"]] == ["reduction", "reduction"]


@pytest.mark.parametrize("forward, why", [
    ("return torch.relu(self.fc(x)).sum(-1)", "not linear"),
    ("return self.fc(x).sum()", "every dim"),
    ("return self.fc(x).sum((0, 1))", "dims [0, 1]"),
    ("y = self.fc(x)\nreturn y.sum(-1, keepdim=True) + y", "also read"),
    ("y = self.fc(x)\ny.mul_(2.0)\nreturn y.sum(-1) + y[:, 0]", "also read"),   # y.mul_ made a value at capture
    ("y = self.fc(x)\ny[:, 0].mul_(2.0)\nreturn y.sum(-1)", "in-place"),   # through a view: stays in place
    ("return (self.fc(x) * x[:, :8]).sum(-1)", "varies along"),
])
def test_sum_after_linear_is_refused_with_the_reason(tmp_path, forward, why):
    path = _module(tmp_path, forward, init="self.fc = nn.Linear(16, 8)")
    cap = capture(str(path))
    found = _by_rule(graph_stage.candidates(cap["graphs"][0]), "reduction_before_linear")
    assert found and not any(c.legal for c in found), [c.reason for c in found]
    assert any(why in c.reason for c in found), [c.reason for c in found]
    assert not [a for a in graph_stage.run(cap)["applied"] if a["rule"] == "reduction_before_linear"]


def test_fp16_is_refused_for_its_accumulation(tmp_path):
    path = _module(tmp_path, "return self.fc(x).mean(-1)", init="self.fc = nn.Linear(16, 8).half()",
                   inputs="torch.rand(4, 16).half()")
    _, c = _one(path, "reduction_before_linear")
    assert not c.legal and "float16" in c.reason


def test_affine_chain_with_per_feature_scale_shift_and_negation_is_exact(tmp_path):
    """sum_n (-(y_n * s_n) / 3 + c_n - 1): vector scale, scalar divide, a vector shift, rsub."""
    path = _module(tmp_path, "y = self.fc(x)\ny = -(y * self.s) / 3.0\ny = y + self.c\ny = 1.0 - y\n"
                   "return torch.mean(y, dim=-1)",
                   init="self.fc = nn.Linear(16, 8)\nself.s = nn.Parameter(torch.randn(8))\n"
                        "self.c = nn.Parameter(torch.randn(1, 8))", inputs="torch.rand(2, 3, 16)")
    cap, c = _one(path, "reduction_before_linear")
    assert c.legal, c.reason
    a, b, *_ = _both(path, path.read_text(), _with(cap, c.apply))
    assert b.shape == a.shape == (2, 3)
    _close(a, b)


def test_channel_sum_after_a_conv_becomes_a_one_channel_conv(tmp_path):
    path = MODULES / "conv_bn_eval.py"
    cap, c = _one(path, "reduction_before_linear")
    assert c.legal and "conv2d" in c.result, c.reason
    edited = _with(cap, c.apply)
    convs = [g for g in partition(edited).groups if g.family == "conv"]
    assert sorted(g.spec["dims"]["C_out"] for g in convs) == [1, 8]

    def update(m):
        m.conv.bias.add_(0.25)
    _matches(tmp_path, path, edited, update=update)


def test_conv_transpose_channel_mean(tmp_path):
    path = _module(tmp_path, "return self.up(x).mean(dim=1) * 2.0",
                   init="self.up = nn.ConvTranspose2d(3, 6, 3, stride=2, padding=1, output_padding=1)",
                   inputs="torch.rand(2, 3, 5, 5)")
    cap, c = _one(path, "reduction_before_linear")
    assert c.legal, c.reason
    _matches(tmp_path, path, _with(cap, c.apply), kernels=False)


@pytest.mark.parametrize("reduce", ["mean(dim=1)", "sum(dim=(0, 1), keepdim=True)"])
def test_a_mean_or_sum_over_rows_moves_onto_the_input(tmp_path, reduce):
    """mean_b f(x_b W^T + b) = f(mean_b(x_b) W^T + b): the GEMM runs on the reduced rows."""
    path = _module(tmp_path, f"y = self.fc(x) * self.s - 0.5\nreturn y.{reduce}",
                   init="self.fc = nn.Linear(16, 8)\nself.s = nn.Parameter(torch.randn(8))",
                   inputs="torch.rand(3, 5, 16)")
    cap, c = _one(path, "reduction_before_linear")
    assert c.legal and "rows" in c.reason, c.reason
    assert c.after.flops < c.before.flops
    edited = _with(cap, c.apply)
    (mm,) = [g for g in partition(edited).groups if g.family == "matmul"]
    assert mm.spec["dims"]["M"] == (3 if "dim=1" in reduce else 1)
    _matches(tmp_path, path, edited, update=lambda m: m.fc.weight.mul_(-1.5))


POSITION_CASES = [
    # (conv, input, forward): every geometry's borders live in the tap-window matrices
    ("nn.Conv2d(3, 4, 3, padding=1)", "torch.rand(2, 3, 6, 7)", "return self.conv(x).mean(dim=(2, 3))"),
    ("nn.Conv2d(3, 4, (3, 2), stride=(2, 3), padding=(1, 0), dilation=(1, 2))", "torch.rand(2, 3, 9, 11)",
     "return (self.conv(x) * 0.5 - self.s.view(4, 1, 1)).sum(dim=[2, 3], keepdim=True)"),
    ("nn.ConvTranspose2d(3, 4, 4, stride=2, padding=1, output_padding=1)", "torch.rand(2, 3, 5, 6)",
     "return torch.mean(self.conv(x) * 2.0 + self.s.view(1, 4, 1, 1), dim=(2, 3), keepdim=True)"),
    ("nn.ConvTranspose3d(2, 4, 3, stride=1, padding=1)", "torch.rand(2, 2, 5, 4, 6)",   # L2 13: depth only
     "y = self.conv(x).mean(dim=2, keepdim=True) + self.s.view(1, 4, 1, 1, 1)\nreturn torch.softmax(y, dim=1)"),
    ("nn.Conv3d(2, 3, (2, 3, 3), stride=(1, 2, 1), padding=(0, 1, 2))", "torch.rand(1, 2, 4, 7, 5)",
     "return self.conv(x).sum(dim=(2, 4))"),
    # a strided, dilated transposed conv with output padding, one dim reduced and one kept
    ("nn.ConvTranspose2d(3, 4, (3, 4), stride=(2, 3), padding=(1, 0), output_padding=(1, 2), dilation=(1, 2))",
     "torch.rand(2, 3, 4, 5)", "return self.conv(x).mean(dim=3, keepdim=True) * self.s.view(4, 1, 1)"),
    ("nn.ConvTranspose1d(3, 4, 5, stride=3, padding=2, dilation=2)", "torch.rand(2, 3, 8)",
     "return -self.conv(x).mean(-1)"),
    ("nn.Conv1d(3, 4, 3, padding='same', dilation=2, bias=False)", "torch.rand(2, 3, 10)",
     "return self.conv(x).sum(2)"),
    # global average pools: a module and a function
    ("nn.ConvTranspose2d(3, 4, 3, stride=2)\nself.pool = nn.AdaptiveAvgPool2d((1, 1))", "torch.rand(2, 3, 5, 4)",
     "return self.pool(self.conv(x) * 0.5).flatten(1)"),
    ("nn.Conv3d(3, 4, 2)", "torch.rand(2, 3, 4, 5, 3)", "return F.adaptive_avg_pool3d(self.conv(x) - 1.0, 1)"),
]


@pytest.mark.parametrize("conv, inputs, forward", POSITION_CASES)
def test_a_mean_or_sum_over_a_convs_positions_becomes_window_sums(tmp_path, conv, inputs, forward):
    """sum_o conv(x)[o] = sum_k (sum of x over tap k's window) w[k]: the conv runs over the kept
    dims only (or becomes a GEMM), on inputs of every geometry; parameters updated after the
    state_dict load are followed."""
    path = _module(tmp_path, forward, init=f"self.conv = {conv}\nself.s = nn.Parameter(torch.randn(4))",
                   inputs=inputs)
    cap, c = _one(path, "reduction_before_linear")
    assert c.legal and "window" in c.reason + c.result, c.reason
    edited = _with(cap, c.apply)
    assert edited["graphs"][0]["shapes_fixed"]
    # the full-size conv (and a pooling module reading it) no longer runs
    assert not [n for n in edited["graphs"][0]["nodes"] if n["op"] == "call_module"]
    for kernels in (False, True):
        _matches(tmp_path, path, edited, kernels=kernels, update=lambda m: m.conv.weight.mul_(-1.5))


def test_positions_rewrite_cuts_the_work_and_is_chosen_at_real_size(tmp_path):
    """KernelBench L2 13's shape: the 3-D transposed conv becomes a 2-D one on 3x the channels."""
    path = _module(tmp_path, "y = self.conv(x).mean(dim=2, keepdim=True) + self.s.view(1, 64, 1, 1, 1)\n"
                   "return torch.tanh(torch.softmax(y, dim=1)) * 2.0",
                   init="self.conv = nn.ConvTranspose3d(16, 64, 3, padding=1)\nself.s = nn.Parameter(torch.randn(64))",
                   inputs="torch.rand(16, 16, 32, 128, 128)")
    stage = graph_stage.run(capture(str(path)))
    (rw,) = stage["applied"]
    assert rw["rule"] == "reduction_before_linear" and "conv_transpose2d" in rw["result"]
    assert rw["predicted"]["after"]["flops"] < rw["predicted"]["before"]["flops"] / 8
    (conv,) = [g for g in partition(stage["captured"]).groups if g.family == "conv"]
    assert conv.spec["op"] == "conv_transpose2d" and conv.spec["dims"]["C_in"] == 48


@pytest.mark.parametrize("conv, forward, why", [
    ("nn.Conv2d(4, 8, 3, groups=2)", "return self.conv(x).mean(dim=(2, 3))", "grouped"),
    ("nn.Conv2d(4, 8, 3, padding=1, padding_mode='reflect')", "return self.conv(x).mean(dim=(2, 3))", "padding_mode"),
    ("nn.Conv2d(4, 8, 3)", "return self.conv(x).mean(dim=(0, 2, 3))", "positions alone"),
    ("nn.Conv2d(4, 8, 3)", "return torch.relu(self.conv(x)).mean(dim=(2, 3))", "not linear"),
    ("nn.Conv2d(4, 8, 3)", "return self.conv(x[0]).mean(dim=2)", "unbatched"),
    ("nn.Conv2d(4, 8, 3)", "return self.conv(x[0]).sum(1)", "unbatched"),   # dim 1 is a position there
])
def test_a_reduction_over_positions_is_refused_where_it_does_not_commute(tmp_path, conv, forward, why):
    path = _module(tmp_path, forward, init=f"self.conv = {conv}", inputs="torch.rand(1, 4, 6, 6)")
    _, c = _one(path, "reduction_before_linear")
    assert not c.legal and why in c.reason, c.reason


def test_grouped_conv_channel_sum_is_refused(tmp_path):
    path = _module(tmp_path, "return self.conv(x).sum(1)", init="self.conv = nn.Conv2d(4, 8, 3, groups=2)",
                   inputs="torch.rand(1, 4, 6, 6)")
    _, c = _one(path, "reduction_before_linear")
    assert not c.legal and "grouped" in c.reason


# -- BatchNorm folded ------------------------------------------------------------------------------

def test_inference_batch_norm_folds_into_the_conv_and_follows_its_statistics(tmp_path):
    path = MODULES / "conv_bn_eval.py"   # F.batch_norm(conv(x), ..., training=False)
    cap, c = _one(path, "fold_batchnorm")
    assert c.legal and "eval mode" in c.reason
    edited = _with(cap, c.apply)
    assert "norm" not in {g.family for g in partition(edited).groups}

    def update(m):   # running statistics and affine parameters changed after construction
        m.running_mean.add_(0.3)
        m.running_var.mul_(1.7)
        m.gamma.mul_(-2.0)
        m.conv.weight.mul_(0.5)
    _matches(tmp_path, path, edited, update=update)


def test_eval_batchnorm_module_folds_and_asserts_eval_mode(tmp_path):
    path = _module(tmp_path, "return self.bn(self.conv(x)) * 2.0",
                   init="self.conv = nn.Conv2d(3, 8, 3)\nself.bn = nn.BatchNorm2d(8)\nself.bn.eval()",
                   inputs="torch.rand(2, 3, 9, 9)")
    cap, c = _one(path, "fold_batchnorm")
    assert c.legal and "asserts" in c.reason, c.reason

    def update(m):
        m.bn.running_mean.add_(0.3)
        m.bn.weight.mul_(-2.0)
    a, b, new, inputs, _ = _both(path, path.read_text(), _with(cap, c.apply), update=update)
    _close(a, b)
    new.bn.train()   # the fold is only right in eval mode: ModelNew says so rather than compute wrongly
    with pytest.raises(Exception, match="eval"):
        new(*inputs)


def test_training_batch_norm_call_is_refused(tmp_path):
    path = _module(tmp_path, "return F.batch_norm(self.fc(x), self.m, self.v, training=True)",
                   init="self.fc = nn.Linear(16, 8)\nself.register_buffer('m', torch.zeros(8))\n"
                        "self.register_buffer('v', torch.ones(8))")
    _, c = _one(path, "fold_batchnorm")
    assert not c.legal and "training-mode BatchNorm uses batch statistics" in c.reason


def test_eval_batchnorm_after_linear_folds(tmp_path):
    path = _module(tmp_path, "return torch.relu(self.bn(self.fc(x)))",
                   init="self.fc = nn.Linear(16, 8)\nself.bn = nn.BatchNorm1d(8)\nself.bn.eval()")
    cap, c = _one(path, "fold_batchnorm")
    assert c.legal, c.reason
    _matches(tmp_path, path, _with(cap, c.apply), update=lambda m: m.bn.running_mean.add_(1.0))


def test_training_mode_batchnorm_is_refused(tmp_path):
    path = _module(tmp_path, "return self.bn(self.fc(x))",
                   init="self.fc = nn.Linear(16, 8)\nself.bn = nn.BatchNorm1d(8)")
    cap, c = _one(path, "fold_batchnorm")
    assert not c.legal and "training-mode BatchNorm uses batch statistics" in c.reason
    refused = graph_stage.run(cap)["refused"]
    assert any(r["rule"] == "fold_batchnorm" and r["status"] == "refused" for r in refused)


# -- identities ------------------------------------------------------------------------------------

IDENTITIES = """y = x.unsqueeze(1)
a = torch.softmax(y, dim=1)
b = F.log_softmax(y, dim=1)
c = torch.amax(y, dim=1)
d = y.sum(dim=1, keepdim=True).squeeze(1)
e = x.transpose(0, 1).transpose(0, 1)
f = x.permute(1, 0).permute(1, 0)
g = x.reshape(4, 16) * 1
h = (x + 0.0) - 0
return a.squeeze(1) + b.squeeze(1) + c + d + e + f + g + h"""


def test_identities_are_removed_and_the_module_still_matches(tmp_path):
    path = _module(tmp_path, IDENTITIES)
    cap = capture(str(path))
    stage = graph_stage.run(cap)
    what = sorted(r["reason"].split(": ", 1)[1].split(" ")[0] for r in stage["applied"])
    assert {"softmax", "log_softmax", "amax", "sum", "two", "a", "x"} <= set(what), what
    assert len(stage["applied"]) >= 9
    left = {n["target"] for n in stage["captured"]["graphs"][0]["nodes"]}
    assert not {"transpose", "permute", "torch.softmax", "torch.amax"} & left
    _matches(tmp_path, path, stage["captured"])


@pytest.mark.parametrize("forward, why", [
    ("return x * 1", "aliased"),
    ("y = x + 0\ny[0].add_(1.0)\nreturn y", "changed in place"),   # through a view: y.add_ alone is made a value
])
def test_identity_is_refused_where_it_is_not_one(tmp_path, forward, why):
    cap = capture(str(_module(tmp_path, forward)))
    found = _by_rule(graph_stage.candidates(cap["graphs"][0]), "identity")
    assert found and not any(c.legal for c in found) and why in found[0].reason, [c.reason for c in found]


def test_softmax_over_a_real_dim_and_a_cast_are_not_identities(tmp_path):
    cap = capture(str(_module(tmp_path, "return torch.softmax(x, dim=1) + x.double().float() + x.view(-1).view(4, 16)")))
    found = _by_rule(graph_stage.candidates(cap["graphs"][0]), "identity")
    assert not [c for c in found if "softmax" in c.node or "double" in c.node or "float" in c.node], found


CONSTANT_CASES = [
    # the mean over a size-1 dim is its input, so x - x: zeros, and the GEMM and max feeding it go
    ("h = self.fc(x)\nh = torch.amax(h, dim=1, keepdim=True)\nh = h - h.mean(dim=1, keepdim=True)\nreturn F.gelu(h)",
     "self.fc = nn.Linear(16, 32)", "new_zeros", ["Linear fc", "amax"]),
    # a softmax over a size-1 dim is ones: the linear map, the training-mode dropout and the mean go
    ("h = self.drop(self.fc(x))\nreturn torch.softmax(h.mean(dim=1, keepdim=True), dim=1)",
     "self.fc = nn.Linear(16, 32)\nself.drop = nn.Dropout(0.3)", "new_ones", ["Linear fc", "Dropout drop", "mean"]),
]


@pytest.mark.parametrize("forward, init, made, gone", CONSTANT_CASES, ids=["x-x", "softmax1"])
def test_an_output_that_is_a_constant_drops_the_work_that_fed_it(tmp_path, forward, init, made, gone):
    path = _module(tmp_path, forward, init)
    cap = capture(str(path))
    stage = graph_stage.run(cap)
    targets = [n["target"] for n in stage["captured"]["graphs"][0]["nodes"]]
    assert made in targets and not any("fc" in t or "drop" in t or "amax" in t for t in targets), targets
    last = stage["applied"][-1]
    assert all(g in last["result"] for g in gone), last["result"]
    assert last["predicted"]["gain_ms"] > 0
    # the fill left to PyTorch says what it is (it read "outside the kernel catalog")
    why = {t["op"]: t["why"] for t in partition(stage["captured"]).torch_ops}
    assert [w for op, w in why.items() if made in op] == ["a constant fill: nothing to compute, PyTorch writes it"], why
    _matches(tmp_path, path, stage["captured"])


def test_a_constant_output_module_passes_the_whole_module_guard(tmp_path):
    """Through optimize: the guard once refused such a module outright ("cannot be told from
    zeros"), even with every group left to PyTorch, so it came back unoptimized and failed."""
    forward, init, _, _ = CONSTANT_CASES[0]
    summary = optimize_module(str(_module(tmp_path, forward, init)), Context(target="h200", max_steps=0),
                              str(tmp_path / "new.py"))
    assert summary["status"] == "done" and summary["check"]["status"] == "passed", summary["check"]
    assert "new_zeros" in (tmp_path / "new.py").read_text()


def test_max_and_min_values_over_a_size_one_dim_are_their_input(tmp_path):
    path = _module(tmp_path, "h = x.sum(dim=1, keepdim=True)\nh = torch.max(h, dim=1, keepdim=True)[0]\n"
                             "return torch.relu(h.min(dim=1).values)")
    stage = graph_stage.run(capture(str(path)))
    assert sorted(a["reason"] for a in stage["applied"]) == [
        "exact: max over dim [1] of size 1 is its input", "exact: min over dim [1] of size 1 is its input"]
    targets = [n["target"] for n in stage["captured"]["graphs"][0]["nodes"]]
    assert "torch.max" not in targets and "min" not in targets and "squeeze" in targets, targets
    _matches(tmp_path, path, stage["captured"])


def test_a_random_op_is_not_dropped_while_another_draws_after_it(tmp_path):
    """Dropping the first dropout would move the generator's stream under the second one, so the
    module's random output would change: the constant is then made like its input, nothing dropped."""
    path = _module(tmp_path, "h = self.d1(self.fc(x))\nz = torch.softmax(h.mean(dim=1, keepdim=True), dim=1)\n"
                             "return z + self.d2(x)",
                   "self.fc = nn.Linear(16, 32)\nself.d1 = nn.Dropout(0.3)\nself.d2 = nn.Dropout(0.5)")
    stage = graph_stage.run(capture(str(path)))
    targets = [n["target"] for n in stage["captured"]["graphs"][0]["nodes"]]
    assert "torch.ones_like" in targets and "d1" in targets and "fc" in targets, targets


def test_a_module_updating_its_buffers_is_never_dropped(tmp_path):
    """A training-mode BatchNorm updates its running statistics: the output no longer needs it, but
    the update must still happen, so it (and what feeds it) stays."""
    path = _module(tmp_path, "h = self.bn(self.fc(x))\nreturn torch.softmax(h.mean(dim=1, keepdim=True), dim=1)",
                   "self.fc = nn.Linear(16, 32)\nself.bn = nn.BatchNorm1d(32)")
    stage = graph_stage.run(capture(str(path)))
    targets = [n["target"] for n in stage["captured"]["graphs"][0]["nodes"]]
    assert "new_ones" in targets and "bn" in targets and "fc" in targets, targets
    _, _, new, _, _ = _both(tmp_path / path.name, path.read_text(), stage["captured"])
    ref = torch.nn.BatchNorm1d(32)
    assert not torch.equal(new.bn.running_mean, ref.running_mean), "the running statistics were not updated"


def test_a_graph_without_rewrites_is_left_as_captured(tmp_path):
    cap = capture(str(_module(tmp_path, "return torch.relu(x) * 2.0")))
    stage = graph_stage.run(cap)
    assert stage["captured"] is cap and not stage["applied"]
    assert stage["decisions"][-1]["action"]["kind"] == "stop"


def test_a_why_question_about_a_rewrite_is_answered_from_the_module_records():
    from mtmc.ui.followup import interpret
    from mtmc.ui.module_view import fusion_answer
    follow = interpret("why did you rewrite the sum?", None)
    assert follow.kind == "why" and follow.fusion
    assert interpret("why was the batchnorm not folded?", None).fusion
    record = {"rule": "fold_batchnorm", "node": "bn", "graph": "", "ops": ["Conv2d conv", "BatchNorm2d bn"],
              "status": "refused", "reason": "training-mode BatchNorm uses batch statistics ..."}
    summary = {"file": "m.py", "groups": [], "torch_ops": [], "rewrites": {"applied": [], "refused": [record]}}
    answer = fusion_answer("why was the batchnorm not folded?", summary)
    assert "fold_batchnorm" in answer and "training-mode BatchNorm uses batch statistics" in answer


@pytest.mark.parametrize("forward, init, made, gone", CONSTANT_CASES, ids=["x-x", "softmax1"])
def test_a_constant_made_from_the_recorded_shapes_follows_another_batch(tmp_path, forward, init, made, gone):
    """The fill is made in the recorded call's shape (4, 1): a batch of 8 got a (4, 1) result
    (KernelBench L2 66 and 80 held-out replicas). ModelNew now runs Model's forward there."""
    path = _module(tmp_path, forward, init)
    stage = graph_stage.run(capture(str(path)))
    model, new, module, inputs, _ = _both(tmp_path / path.name, path.read_text(), stage["captured"])
    _close(model, new)
    bigger = torch.rand(8, 16)
    with torch.no_grad():
        torch.manual_seed(1)
        expect = m_out = module(bigger)   # ModelNew on another batch ...
        torch.manual_seed(1)
        expect = super(type(module), module).forward(bigger)   # ... is Model's forward on it
    assert m_out.shape == expect.shape == (8, 1)
    _close(expect, m_out)


# -- dead code ------------------------------------------------------------------------------------

def test_a_value_nothing_reads_is_removed_with_what_only_fed_it(tmp_path):
    """KernelBench's LSTMHn computes fc(out[:, -1, :]) and returns the LSTM's state: the GEMM ran
    as a Triton group whose result ModelNew threw away."""
    path = _module(tmp_path, "unused = torch.relu(self.fc(x[:, :8]))\nreturn self.fc2(x) * 2.0",
                   "self.fc = nn.Linear(8, 32)\nself.fc2 = nn.Linear(16, 16)")
    cap, c = _one(path, "dead_code")
    assert c.legal and c.before.flops > 0 and len(c.ops) == 3, c.ops
    stage = graph_stage.run(cap)
    targets = [n["target"] for n in stage["captured"]["graphs"][0]["nodes"]]
    assert "fc" not in targets and "torch.relu" not in targets and "fc2" in targets, targets
    *_, part = _matches(tmp_path, path, stage["captured"])
    assert [g.family for g in part.groups] == ["matmul"]


@pytest.mark.parametrize("forward, init, why", [
    ("unused = self.bn(x)\nreturn x * 2.0", "self.bn = nn.BatchNorm1d(16)", "changes state"),
    ("unused = self.d1(x)\nreturn self.d2(x) + 1.0", "self.d1 = nn.Dropout(0.3)\nself.d2 = nn.Dropout(0.5)",
     "would change the numbers"),
])
def test_dead_code_that_changes_state_or_random_draws_stays(tmp_path, forward, init, why):
    path = _module(tmp_path, forward, init)
    cap, c = _one(path, "dead_code")
    assert not c.legal and why in c.reason, c.reason
    assert not [a for a in graph_stage.run(cap)["applied"] if a["rule"] == "dead_code"]
