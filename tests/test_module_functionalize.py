"""Statement-form in-place ops (`h.relu_()` then a read of h) become values at capture, where
nobody else can see the storage; elsewhere they stay PyTorch with the reason."""
from __future__ import annotations

import pytest

import torch

from mtmc.tools.loader import load_file
from tests.test_module_conv import assert_model_new_matches, captured_source

HEAD = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 24)

    def forward(self, x):
{body}

def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
"""


def _source(body: str) -> str:
    return HEAD.format(body="".join(f"        {line}\n" for line in body.splitlines()))



STATEMENTS = [
    # chain of in-place methods on a fresh value: one matmul group with its epilogue
    "h = self.fc(x)\nh.relu_()\nh.mul_(0.5)\nh.add_(1.0)\nreturn h.sum(-1)",
    # torch.* in-place functions and inplace=True, read after the change
    "h = self.fc(x)\ntorch.sigmoid_(h)\nF.relu(h, inplace=True)\nreturn h * 3.0",
    # a copy (clone) changed in place, the original still read
    "h = x * 2.0\ny = h.clone()\ny.clamp_(-0.5, 0.5)\nreturn y + h",
    # the value before the change is read before it, the value after after it
    "h = self.fc(x)\ns = h.sum(-1, keepdim=True)\nh.tanh_()\nreturn h * s",
]


@pytest.mark.parametrize("body", STATEMENTS)
def test_in_place_statements_on_fresh_values_fuse(tmp_path, body):
    source = _source(body)
    cap, part = captured_source(tmp_path, source)
    assert not [t for t in part.torch_ops if "in-place" in t["why"] or "in place" in t["why"]], part.torch_ops
    names = [n["target"] for g in cap["graphs"] for n in g["nodes"] if n["op"].startswith("call_")]
    assert not [t for t in names if isinstance(t, str) and t.rsplit(".", 1)[-1].endswith("_")
                and not t.rsplit(".", 1)[-1].startswith("_")], names
    assert part.groups
    assert_model_new_matches(tmp_path, source, cap, part)


SEEN_ELSEWHERE = [
    # the caller's input changed in place: the caller sees it
    ("x.relu_()\nreturn x * 2.0", "input"),
    # a view of a fresh value changed in place changes the value too
    ("h = self.fc(x)\nv = h[:, :8]\nv.mul_(2.0)\nreturn h.sum(-1)", ""),
]


@pytest.mark.parametrize("body, why", SEEN_ELSEWHERE)
def test_in_place_on_shared_storage_is_kept(tmp_path, body, why):
    source = _source(body)
    cap, part = captured_source(tmp_path, source)
    names = [n["target"] for g in cap["graphs"] for n in g["nodes"] if n["op"] == "call_method"]
    assert any(t.endswith("_") for t in names), names
    assert_model_new_matches(tmp_path, source, cap, part)
    if why:
        assert any(why in t["why"] for t in part.torch_ops), part.torch_ops


CLASSIFIER = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True))
        self.classifier = nn.Sequential(nn.Linear(4 * 6 * 6, 32), nn.ReLU(inplace=True), nn.Dropout(p=0.0),
                                        nn.Linear(32, 16), nn.ReLU(inplace=True), nn.Dropout(p=0.0),
                                        nn.Linear(16, 5))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return []
"""


def test_in_place_relu_read_through_a_dropout_fuses(tmp_path):
    # VGG's and AlexNet's classifiers: the dropout after ReLU(inplace=True) views the changed value,
    # which is what every later reader wants; it was refused as "in-place op on a view"
    cap, part = captured_source(tmp_path, CLASSIFIER)
    assert not [t for t in part.torch_ops if "in-place" in t["why"]], part.torch_ops
    assert_model_new_matches(tmp_path, CLASSIFIER, cap, part)


DEAD_CALLS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4)
        self.idn = nn.Identity()
        self.conv = nn.Conv2d(4, 4, 1)
        self.fc = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        y = self.conv(torch.relu(self.idn(self.bn(x))))
        z = y.flatten(2)
        return z + self.drop(self.fc(z))


def get_inputs():
    return [torch.rand(2, 4, 4, 4) * 3 + 1]


def get_init_inputs():
    return []
"""


def test_submodule_calls_a_group_replaced_do_not_stay_in_the_forward(tmp_path):
    # Found on held-out CViT / Swin uploads: a layer read past an identity (Dropout(0), nn.Identity)
    # stayed in ModelNew's forward, its output unused: the work ran twice, and a training-mode
    # BatchNorm moved its running statistics twice (num_batches_tracked 2 against Model's 1)
    cap, part = captured_source(tmp_path, DEAD_CALLS)
    assert {g.family for g in part.groups} >= {"norm", "matmul"}, part.groups
    assert_model_new_matches(tmp_path, DEAD_CALLS, cap, part)
    m = load_file(tmp_path / "new_model.py", "dead_calls_new")
    source = (tmp_path / "new_model.py").read_text().split("class ModelNew")[1]
    for call in ("self.bn(", "self.idn(", "self.fc(", "self.drop("):
        assert call not in source, call
    torch.manual_seed(0)
    model, new = m.Model(), m.ModelNew()
    new.load_state_dict(model.state_dict())
    x = m.get_inputs()[0]
    with torch.no_grad():
        model(x), new(x)
    for name, buf in model.named_buffers():
        torch.testing.assert_close(dict(new.named_buffers())[name], buf, rtol=1e-5, atol=1e-6, msg=name)
