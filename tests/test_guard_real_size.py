"""The guard at real size: float64 truth in chunks when it does not fit the device, and
comparisons that walk multi-GB outputs a chunk at a time with the same answers."""
import copy
import math

import pytest
import torch
import torch.nn as nn

from mtmc.tools.guard import numeric
from mtmc.tools.guard import reference as R


class _TooBig:
    """_forward64 that runs out of "device" memory (here the CPU) on more than `rows` samples;
    the host fallback (R.HOST, renamed "host") never does."""

    def __init__(self, rows: int):
        self.rows, self.calls, self.original = rows, [], R._forward64

    def __call__(self, model64, inputs, where):
        n = inputs[0].shape[0]
        self.calls.append((where, n))
        if where != "host" and n > self.rows:
            raise torch.cuda.OutOfMemoryError("fake: does not fit")
        return self.original(model64, inputs, "cpu")


def _truth_of(model, x, monkeypatch, rows):
    fake = _TooBig(rows)
    monkeypatch.setattr(R, "_forward64", fake)
    monkeypatch.setattr(R, "HOST", "host")
    model64 = copy.deepcopy(model).to(torch.float64)
    eager, _ = R._eager(model, [x])
    truth, how = R._float64(model, model64, [x], eager, "cpu")
    return truth, how, fake.calls


def test_float64_truth_in_chunks_of_the_batch_when_it_does_not_fit(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    x = torch.randn(40, 16)
    truth, how, calls = _truth_of(model, x, monkeypatch, rows=10)
    assert how == "on the device, in chunks of the batch"
    assert all(n <= 10 for where, n in calls[2:]) and ("host", 40) not in calls
    exact = copy.deepcopy(model).to(torch.float64)(x.double())
    assert torch.allclose(truth[0], exact, rtol=0, atol=1e-12)


def test_float64_truth_is_not_chunked_when_samples_depend_on_each_other(monkeypatch):
    model = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16))   # training mode: batch statistics
    x = torch.randn(40, 16)
    truth, how, calls = _truth_of(model, x, monkeypatch, rows=10)
    assert how == "on the CPU (it does not fit the device)" and ("host", 40) in calls
    assert truth is not None and truth[0].shape == (40, 16)


@pytest.mark.parametrize("chunk", [7, 1000, 1 << 24])
def test_chunked_comparison_gives_the_same_verdict(monkeypatch, chunk):
    monkeypatch.setattr(numeric, "CHUNK", chunk)
    x = torch.randn(123, 45, dtype=torch.float64) * 3
    ref = torch.sigmoid(x) * x
    eager = (torch.sigmoid(x.float()) * x.float())
    good, bad = numeric.compare(eager, ref, eager), numeric.compare(eager + 1e-2, ref, eager)
    assert good["ok"] and not bad["ok"] and bad["reason"].startswith(f"{123 * 45} of {123 * 45}")
    assert math.isclose(bad["max_abs_err"], 1e-2, rel_tol=1e-3)   # plus fp32 rounding of eager
    nan = eager.clone()
    nan[5, 7] = float("nan")
    assert "1 output elements are NaN or inf" in numeric.compare(nan, ref, eager)["reason"]
    assert not numeric.compare(0.0, ref, eager)["ok"]   # a constant output, never materialized
    fp = numeric.fingerprint(eager)
    assert math.isclose(fp[0], float(eager.double().sum()), rel_tol=1e-9)


def test_tensors_are_staged_through_the_file_where_cuda_ipc_is_refused(tmp_path, monkeypatch):
    """On the H200 host a process in bubblewrap that dropped to its own uid gets "invalid argument"
    from cudaIpcGetMemHandle: the guard must still judge, with the tensors staged on the host."""
    import torch

    import mtmc.tools.guard.exchange as ex

    class OnGpu(torch.Tensor):   # stands in for a CUDA tensor on this CPU-only machine
        @property
        def is_cuda(self):
            return True

        def cpu(self):
            return self.as_subclass(torch.Tensor).clone()

    def refuse(_):
        raise RuntimeError("CUDA error: invalid argument")
    monkeypatch.setattr(ex, "_ipc_handles", refuse)
    payload = ex.share({"outputs": [torch.arange(6.0).as_subclass(OnGpu)], "n": 3}, tmp_path, "outputs0")
    assert payload["staged"] and "ipc" not in payload
    moved = []
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self: moved.append(self.shape) or self)
    got = ex.receive(payload, limit_bytes=1 << 20)
    assert torch.equal(got["outputs"][0], torch.arange(6.0)) and got["n"] == 3 and moved == [torch.Size([6])]
