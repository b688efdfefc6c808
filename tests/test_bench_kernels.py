"""bench.kernels without a GPU: every benchmark request of every list parses to a spec that its
family validates and renders at the default config (a request that no longer parses would only
show up as an error row on the device), and the table renders what a GPU run records."""
from __future__ import annotations

import pytest

from bench.kernels import table
from bench.run import TASKS
from mtmc.kernels import catalog
from mtmc.request.parse import parse_request
from mtmc.tools.hardware import PROFILES

REQUESTS = [(name, text) for name, texts in TASKS.items() for text in texts]


@pytest.mark.parametrize("name,text", REQUESTS)
def test_every_benchmark_request_parses_and_renders(name, text):
    parsed = parse_request(text)
    assert parsed.ok, f"{name}: {text!r}: {parsed.message}"
    fam = catalog.family_of(parsed.spec)
    fam.validate(parsed.spec)
    assert "def launch(" in fam.render(parsed.spec, fam.default_config(parsed.spec, PROFILES["h200"]))


def test_table_shows_measured_and_failed_rows():
    rows = [{"request": "relu of x", "family": "elementwise", "correct": True, "ours_ms": 1.0, "eager_ms": 1.5,
             "compiled_ms": None, "vs_eager": 1.5, "vs_compiled": None, "gbs": 4100.0, "of_copy": 0.93, "tflops": 0.1},
            {"request": "bad", "error": "RuntimeError: boom"}]
    text = table(rows)
    assert "| relu of x | elementwise | True | 1.000 | 1.500 | - | 1.50 | - | 4100 | 93% | 0.1 |  |" in text
    assert "RuntimeError: boom" in text


@pytest.mark.gpu
def test_compiled_baseline_stays_compiled_after_many_references():
    """On the H200 a bench process that compiled ten or so references got eager times back as
    'torch.compile' (softmax over dim 1: 4.37 ms 'compiled' = eager; 0.60 ms once dynamo was
    reset per baseline).  Every baseline must compile a fresh graph."""
    import torch
    from torch._dynamo.utils import counters

    from mtmc.tools.loader import load_source
    from mtmc.tools.timing import compiled_ms
    x = torch.randn(64, 256, 32, device="cuda")
    for i in range(14):
        ref = load_source(f"import torch\ndef reference(x):\n    return torch.softmax(x * {i + 1}.0, dim=1)\n",
                          "ref").reference
        before = counters["stats"]["unique_graphs"]
        result = compiled_ms(ref, [x])
        assert result["ms"] is not None, result["note"]
        assert counters["stats"]["unique_graphs"] > before, f"reference {i} ran uncompiled"
