"""The draft loop's costs at real size, checked without a GPU: what is not re-done per draft.

On the H200 (2026-12-04) a KernelBench task spent ~20 s per guarded draft opening a new full-size
guard reference, and a module whose every group fell back still paid a minute for the
whole-module guard check of Model's own code."""
from pathlib import Path

from mtmc.agents import module_steps
from mtmc.kernels import drafts
from mtmc.kernels.spec import KernelSpec
from mtmc.module.capture import capture
from mtmc.module.fusion import partition

MODULES = Path(__file__).parent / "modules"


class _Ref:
    """Stands in for PairChecker: counts how often a full-size reference would be opened."""
    opened: list = []

    def __init__(self, spec, dims, device, timeout_s):
        self.key, self.lent, self.closed = (spec.key(), device), 0, False
        _Ref.opened.append(self)

    @property
    def alive(self):
        return not self.closed

    def close(self):
        self.closed = True


def _spec(m: int) -> KernelSpec:
    return KernelSpec.from_dict({"op": "softmax", "family": "softmax", "dtype": "float32",
                                 "dims": {"M": m, "N": 256}, "params": {}})


def test_gpu_guard_reference_is_reused_by_the_next_draft_and_closed_for_another_spec(monkeypatch):
    monkeypatch.setattr(drafts, "PairChecker", _Ref)
    _Ref.opened = []
    drafts.close_checkers()
    a, b = _spec(4096), _spec(8192)
    for _ in range(3):   # three guarded drafts of one group: one reference
        with drafts._checker(a, a.dims, "cuda", 60) as ref:
            assert ref.lent == 1
    assert len(_Ref.opened) == 1 and not _Ref.opened[0].closed
    with drafts._checker(b, b.dims, "cuda", 60):
        # the idle reference of the other spec was closed before this one opened (GPU memory)
        assert _Ref.opened[0].closed
    assert len(_Ref.opened) == 2
    drafts.close_checkers()
    assert all(r.closed for r in _Ref.opened)


def test_a_gpu_reference_in_use_is_not_closed_under_another_group(monkeypatch):
    monkeypatch.setattr(drafts, "PairChecker", _Ref)
    _Ref.opened = []
    drafts.close_checkers()
    a, b = _spec(4096), _spec(8192)
    with drafts._checker(a, a.dims, "cuda", 60):
        with drafts._checker(b, b.dims, "cuda", 60):
            assert not _Ref.opened[0].closed   # lent to a check under way
    drafts.close_checkers()


def test_all_pytorch_model_new_skips_the_whole_module_check(tmp_path, monkeypatch):
    def no_reference(*a, **k):
        raise AssertionError("a ModelNew without kernels needs no reference run")
    monkeypatch.setattr(module_steps, "reference_run", no_reference)
    path = MODULES / "elementwise_chain.py"
    cap = capture(str(path))
    groups = partition(cap).groups
    outcomes = {g.id: {"status": "fallback", "reason": "slower than eager"} for g in groups}
    out = tmp_path / "new.py"
    events = []
    check = module_steps.assemble_checked(str(path), cap, groups, outcomes, out, gpu=True, timeout_s=60,
                                          on_event=events.append)
    assert check["status"] == "passed" and check["reason"] == module_steps.NOTHING_TO_CHECK
    assert "class ModelNew" in out.read_text()
    assert events and events[0]["event"] == "module_check"


def test_the_module_checks_gpu_reference_first_closes_the_groups_idle_ones(monkeypatch):
    """Only idle GPU references: a CPU one (reused across chat runs) and one in use stay open."""
    monkeypatch.setattr(drafts, "PairChecker", _Ref)
    monkeypatch.setattr(module_steps, "run_reference", lambda *a, **k: "the module's reference")
    _Ref.opened = []
    drafts.close_checkers()
    a, b = _spec(4096), _spec(8192)
    with drafts._checker(b, b.dims, "cuda", 60):        # a group's check under way
        with drafts._checker(a, a.dims, "cuda", 60):
            pass
        with drafts._checker(a, a.dims, "cpu", 60):
            pass
        gpu_lent, gpu_idle, cpu_idle = _Ref.opened
        assert not gpu_idle.closed
        assert module_steps.reference_run("model.py", gpu=True, timeout_s=60) == "the module's reference"
        assert gpu_idle.closed and not cpu_idle.closed and not gpu_lent.closed
    drafts.close_checkers()
