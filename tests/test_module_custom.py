"""Ops outside the catalog inside an uploaded module (issue 18): with a model configured, each run
of them becomes a custom group whose PyTorch reference the coder role gets; its kernel passes the
guard against that reference, then the whole-module guard with the rest of ModelNew.  Scripted
replies of the loopback `chat_server`, through the real ChatOpenAI client."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtmc.agents.context import Context
from mtmc.agents.module_flow import optimize_module
from mtmc.module.capture import capture
from mtmc.module.custom_groups import custom_groups
from mtmc.module.fusion import partition
from mtmc.tools import llm as chat_model

MODULE = Path(__file__).parent / "modules" / "llm" / "flip_tail.py"

FLIP = '''```python
import torch
import triton
import triton.language as tl


@triton.jit
def flip_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    v = tl.load(x_ptr + row * n_cols + (n_cols - 1 - cols), mask=mask, other=0.0)
    tl.store(y_ptr + row * n_cols + cols, v, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.shape[-1]
        flip_rows[(x.numel() // n,)](x, y, n, BLOCK=triton.next_power_of_2(n))
        return y
```'''

WRONG = FLIP.replace("(n_cols - 1 - cols)", "cols")   # a copy, not a flip


def test_a_run_of_ops_outside_the_catalog_becomes_one_custom_group():
    cap = capture(str(MODULE))
    part = partition(cap)
    assert [t["node"] for t in part.torch_ops] == ["flip"]
    (g,) = custom_groups(cap, part, first_id=len(part.groups))
    assert g.id == len(part.groups) and g.family == "custom" and g.nodes == ["flip"] and g.args == [{"node": "mul"}]
    ns = {"torch": torch}
    exec(g.spec["params"]["reference"], ns)
    x = torch.randn(3, 5)
    assert torch.equal(ns["reference"](x), torch.flip(x, [-1]))
    assert g.spec["params"]["inputs"] == [{"shape": [8, 48], "dtype": "float32"}]


def test_without_a_model_the_op_stays_pytorch(tmp_path):
    summary = optimize_module(str(MODULE), Context(target="h200", max_steps=0), str(tmp_path / "new.py"))
    assert summary["check"]["status"] == "passed"
    assert [t["node"] for t in summary["torch_ops"]] == ["flip"]
    assert all(g["family"] != "custom" for g in summary["groups"])


@pytest.mark.slow
def test_the_model_writes_the_flip_and_the_whole_module_passes_the_guard(tmp_path, chat_server):
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=20)
    # a wrong draft (a copy) is refused by the guard and fixed; the later moves get no code and roll back
    chat_server.script = [("ok", WRONG), ("ok", FLIP)]
    out = tmp_path / "new.py"
    summary = optimize_module(str(MODULE), Context(target="h200", max_steps=0, llm=llm), str(out))
    assert summary["check"]["status"] == "passed", summary["check"]
    custom = [g for g in summary["groups"] if g["family"] == "custom"]
    assert len(custom) == 1 and custom[0]["status"] == "kernel", custom
    assert summary["torch_ops"] == []
    assert "The verifier rejected that draft" in chat_server.prompt(1)
    text = out.read_text()
    assert "_flip_rows[" in text and "kernel written by the model" in text
    ns: dict = {}
    exec(compile(text, str(out), "exec"), ns)
    model, new = ns["Model"](), ns["ModelNew"]()
    x = torch.randn(4, 48)
    torch.testing.assert_close(new(x), model(x))
