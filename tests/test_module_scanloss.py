"""Scans and losses in uploaded modules: which nodes become scan and loss groups, why some stay
PyTorch, and that ModelNew with the template kernels computes what Model does (in the interpreter,
at the modules' small sizes)."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_module_conv import assert_model_new_matches

from mtmc.module.capture import capture
from mtmc.module.fusion import partition

MODULES = Path(__file__).parent / "modules"
# more loss modules: their groups and ModelNew are checked here; hinge_loss.py, in tests/modules,
# also goes through test_module_optimize's whole-module guard like every module there
LOSS_MODULES = MODULES / "losses"
LEVEL1 = Path(__file__).resolve().parents[2] / "shared" / "kernelbench-dev" / "level1"


GROUPS = {  # module -> (family, op, params that must be set) of each group, in graph order
    "cumsum_forms": [("scan", "cumsum", {"epilogue": [{"op": "relu"}]}), ("scan", "cumsum", {"reverse": True}),
                     ("scan", "cumprod", {}), ("scan", "cumsum", {"masked": True}),
                     ("scan", "cumsum", {"exclusive": True}), ("scan", "cumsum", {"inner": 100}),
                     ("scan", "cumsum", {"exclusive": True})],
    "mse_loss": [("loss", "total", {"reduction": "mean", "prologue": [{"op": "sub"}, {"op": "square"}]})],
    "huber_loss": [("loss", "smooth_l1", {"beta": 1.0}), ("loss", "huber", {"delta": 0.5})],
    "kl_loss": [("loss", "kl_div", {"reduction": "batchmean", "log_input": True})],
    "hinge_loss": [("loss", "total", {"reduction": "mean"})],
    "ce_smoothing": [("loss", "cross_entropy", {"label_smoothing": 0.1, "ignore_index": 2}),
                     ("loss", "cross_entropy", {"label_smoothing": 0.25, "reduction": "sum"})],
    "cosine_loss": [("loss", "cosine_similarity", {"reduction": "mean"}),
                    ("loss", "cosine_embedding", {"reduction": "sum", "margin": 0.1})],
}


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_module_groups_and_model_new(tmp_path, name):
    path = (MODULES if (MODULES / f"{name}.py").exists() else LOSS_MODULES) / f"{name}.py"
    cap = capture(str(path))
    part = partition(cap)
    got = [(g.family, g.spec["op"], g.spec["params"]) for g in part.groups]
    assert len(got) == len(GROUPS[name]), got
    for (fam, op, params), (gfam, gop, gparams) in zip(GROUPS[name], got):
        assert (gfam, gop) == (fam, op) and all(gparams.get(k) == v for k, v in params.items()), got
    assert name != "cumsum_forms" or part.torch_ops == []   # the shifted form's cat and zeros go too
    assert_model_new_matches(tmp_path, path.read_text(), cap, part)


@pytest.mark.parametrize("task, op", [("89_cumsum", "cumsum"), ("91_cumsum_reverse", "cumsum"),
                                      ("93_masked_cumsum", "cumsum"), ("95_CrossEntropyLoss", "cross_entropy"),
                                      ("99_TripletMarginLoss", "triplet_margin")])
def test_kernelbench_dev_tasks_get_groups(task, op):
    path = LEVEL1 / f"{task}.py"
    if not path.exists():
        pytest.skip("the KernelBench dev files are not here")
    part = partition(capture(str(path)))
    assert [g.spec["op"] for g in part.groups] == [op] and part.torch_ops == []


NEAR_MISSES = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ce = nn.CrossEntropyLoss(weight=torch.rand(5) + 0.5)

    def forward(self, x, t, p, w):
        a = self.ce(x, t)
        b = F.cross_entropy(x, p)                      # probabilities as the target
        c = F.mse_loss(x, w)                           # a broadcast target
        d = torch.cumsum(x, dim=1, dtype=torch.float64)
        e = F.cosine_similarity(x, p, dim=0)
        return a, b, c, d, e


def get_inputs():
    return [torch.randn(8, 5), torch.randint(0, 5, (8,)), torch.rand(8, 5).softmax(-1), torch.randn(5)]


def get_init_inputs():
    return []
'''


def test_near_misses_stay_pytorch_with_the_reason(tmp_path):
    path = tmp_path / "near.py"
    path.write_text(NEAR_MISSES)
    part = partition(capture(str(path)))
    assert part.groups == []
    why = {t["node"]: t["why"] for t in part.torch_ops}
    assert "weights" in why["ce"]
    assert "int64 class indices" in why["cross_entropy"]
    assert "broadcast" in why["mse_loss"]
    assert "dtype" in why["cumsum"]
    assert "not the last dim" in why["cosine_similarity"]


# KernelBench's exclusive cumsum as upstream writes it since its fix (KernelBench issue #72, PR
# #109): the inclusive scan of x's first n - 1 elements, a zero slice put in front by torch.cat
ZERO_PREPENDED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        cumsum = torch.cumsum(x.narrow(dim=self.dim, start=0, length=x.size(self.dim)-1), dim=self.dim)
        return torch.cat((torch.zeros_like(x.select(self.dim, 0).unsqueeze(self.dim)), cumsum), dim=self.dim)


def get_inputs():
    return [torch.rand(SHAPE)]


def get_init_inputs():
    return [DIM]
'''


@pytest.mark.parametrize("shape, dim", [((12, 100), 1), ((3, 40, 5), 1), ((6, 50), -1)])
def test_exclusive_cumsum_with_a_zero_put_in_front_is_one_scan(tmp_path, shape, dim):
    """One exclusive scan of x: not a copy of x's first n - 1 elements, a scan of them, then a
    zero fill and a torch.cat copying the whole result again."""
    source = ZERO_PREPENDED.replace("SHAPE", repr(shape)).replace("DIM", str(dim))
    path = tmp_path / "exclusive.py"
    path.write_text(source)
    cap = capture(str(path))
    part = partition(cap)
    assert [(g.family, g.spec["op"], g.spec["params"].get("exclusive")) for g in part.groups] == \
        [("scan", "cumsum", True)], part.to_dict()
    assert part.torch_ops == []
    assert part.groups[0].spec["dims"]["N"] == shape[dim]   # x's whole length, not n - 1
    assert_model_new_matches(tmp_path, source, cap, part)
