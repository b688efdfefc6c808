"""One verifier path: a draft of the loop that passes the cheap checks (target compile, a quick
check against the float64 reference) goes through the guard of `mtmc verify` before it can
become a step's result; one that cannot become the result (slower than the best) is not."""
from __future__ import annotations

from mtmc.kernels.catalog import family_of
from mtmc.kernels.drafts import verify_draft
from mtmc.request.parse import parse_request
from mtmc.tools.hardware import resolve

HW = resolve("h200")


def _relu():
    spec = parse_request("relu on a 64x64 fp32 tensor").spec
    config = family_of(spec).default_config(spec, HW)
    return spec, config, family_of(spec).render(spec, config)


def test_an_honest_draft_passes_the_guard():
    spec, config, source = _relu()
    v = verify_draft(spec, source, config, HW, gpu=False)
    assert v["ok"] and v["guard"]["accepted"] and v["guard"]["checks"] >= 10, v


def test_a_draft_that_lets_pytorch_do_the_work_passes_the_quick_check_but_not_the_guard():
    spec, config, source = _relu()
    cheat = source.rstrip() + "\n    out.copy_(torch.relu(x))  # the kernel runs, then PyTorch writes the answer\n"
    v = verify_draft(spec, cheat, config, HW, gpu=False)
    assert not v["ok"] and v["stage"] == "guard" and v["kind"] == "guard_rejected", v
    assert (v["correctness"] or {}).get("ok"), "the quick check alone would have passed it"
    assert "own_kernels" in [f["name"] for f in v["guard"]["failed"]], v["guard"]


def test_a_draft_slower_than_the_best_skips_the_guard():
    spec, config, source = _relu()
    v = verify_draft(spec, source, config, HW, gpu=False, best_ms=1e-9)
    assert v["ok"] and "skipped" in v["guard"]


def test_a_huge_draft_on_the_gpu_is_guarded_at_small_dims_and_checked_once_at_full_size():
    """A KernelBench-size input (1.6e9 elements) made every draft's guard compute float64
    truths at full size per variant, and modules ran out of time on the H200."""
    from mtmc.kernels.drafts import GUARD_FULL_NUMEL, build_job
    spec = parse_request("relu of a 4096x393216 fp32 tensor").spec
    fam = family_of(spec)
    config = fam.default_config(spec, HW)
    job = build_job(spec, "", config, HW, gpu=True, baselines=False)
    assert job["dims"] == spec.dims and job["trials"] == 1
    assert job["guard_dims"] == fam.check_dims(spec, config) != spec.dims
    small = parse_request("relu of a 1024x1024 fp32 tensor").spec
    job = build_job(small, "", config, HW, gpu=True, baselines=False)
    assert 2 * 1024 * 1024 <= GUARD_FULL_NUMEL and job["guard_dims"] == small.dims and job["trials"] == 2
