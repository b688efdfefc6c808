"""The draft check (tools.correctness) at sizes where a float64 truth and a copy of the inputs do
not fit the GPU beside the other sessions: L1 35_GroupNorm (1.9e9 elements) spent 96 s of its
step on the host's float64 fallback and timed out (H100, 2026-12-06)."""
from __future__ import annotations

import pytest
import torch

from mtmc.kernels.families import softmax
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import task_of
from mtmc.tools import correctness

HONEST = "import torch\n\ndef launch(x, out):\n    out.copy_(torch.softmax(x.double(), -1))\n"
WRITES_INPUT = HONEST + "    x.view(-1)[7] += 1.0\n"


@pytest.fixture
def task():
    return task_of(KernelSpec(family="softmax", op="softmax", dtype="float32", dims={"M": 6, "N": 50},
                              params={}))


@pytest.mark.parametrize("limit", [correctness.CLONE_LIMIT_BYTES, 0], ids=["copied", "checksummed"])
def test_a_kernel_that_writes_its_input_is_rejected_either_way(task, monkeypatch, limit):
    monkeypatch.setattr(correctness, "CLONE_LIMIT_BYTES", limit)
    assert correctness.check(task, HONEST).ok
    bad = correctness.check(task, WRITES_INPUT)
    assert not bad.ok and bad.reason == "input 0 was modified by the kernel"


def test_bits_checksum_sees_a_swap_of_two_values():
    x = torch.randn(1000)
    y = x.clone()
    y[[3, 500]] = y[[500, 3]]
    assert correctness._bits_checksum(x) == correctness._bits_checksum(x.clone())
    assert correctness._bits_checksum(x) != correctness._bits_checksum(y)   # the weighted sum


def _oom_until(allowed):
    real = correctness.truth_judge

    def fake(ns, task, inputs, where, precision="float64"):
        if (str(where), precision) not in allowed:
            raise torch.cuda.OutOfMemoryError("out of memory (simulated)")
        return real(ns, task, inputs, "cpu", precision)
    return fake


@pytest.mark.parametrize("allowed, words", [
    ({("meta", "float32")}, "float32 reference on the GPU"),
    ({("cpu", "float64")}, "float64 reference on the host"),
])
def test_the_truth_falls_back_to_fp32_on_the_gpu_before_the_host(task, monkeypatch, allowed, words):
    monkeypatch.setattr(correctness, "truth_judge", _oom_until(allowed))
    x = torch.randn(6, 50)
    out = torch.softmax(x, -1)

    class OnTheDevice(torch.Tensor):   # out's device reads as a GPU's; its data stays on the CPU
        @property
        def device(self):
            return torch.device("meta")
    ok, _, _, _, fallback = correctness._reference_verdict(correctness.reference_namespace(task),
                                                          task, out.as_subclass(OnTheDevice), [x])
    assert ok and words in fallback and "does not fit the GPU" in fallback


def test_the_fp32_reference_still_rejects_a_wrong_output(task):
    x = torch.randn(6, 50)
    judge = correctness.truth_judge(correctness.reference_namespace(task), task, [x], "cpu", "float32")
    assert judge(torch.softmax(x, -1))[0]
    assert not judge(torch.softmax(x, -1) * 1.01)[0]


def test_the_fp32_reference_runs_without_tf32(task):
    # cuDNN's default TF32 fp32 convs are ~10x the fp32 tolerance off: an fp32 reference made so
    # rejected a correct conv kernel on an H100.  The flags are read inside the reference call.
    seen = []
    ns = correctness.reference_namespace(task)
    real = ns["reference"]

    def reference(*xs):
        seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        return real(*xs)
    ns["reference"] = reference
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    try:
        x = torch.randn(6, 50)
        assert correctness.truth_judge(ns, task, [x], "cpu", "float32")(torch.softmax(x, -1))[0]
        assert seen == [(False, False)]
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32   # restored
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
