"""The library-anchor decision: a conv group whose Triton kernel beat PyTorch eager may still lose
to cuDNN's conv followed by the group's tail fused on its own (one pass), which is what
torch.compile runs around an extern conv.

Measured on the H100 (bench/results/kernelbench-dev-h100.md, 2026-12-06): L2 57 (conv, relu,
hardswish) ran our fp32-accurate conv with the tail in 1.22 ms against eager's 2.99 ms, so the
group kept it, while torch.compile (cuDNN's conv, then one fused kernel) ran 0.80 ms.  cuDNN runs
most fp32 convs in TF32 by default (PyTorch's own precision for the Model), which our kernel does
not, so the library conv is often the faster anchor even where our kernel wins against eager's
unfused tail.

The decision uses the library conv's time measured on this GPU (tools.layout_probe, as given),
the tail's groups as the partitioner makes them with the conv pinned, each at its family's
default config by the roofline model (mtmc.kernels.estimate: memory-bound tails are what it
predicts best), and our group's measured time.  regroup applies it; the tail groups then run
the kernel loop like any group, and the report gives the numbers.
"""
from __future__ import annotations

MARGIN = 0.9    # cuDNN plus the tail must be predicted at least 10 % faster than our fused group


def tail_ms(tail_specs: list, hw) -> float | None:
    """Estimated ms of the tail's groups (KernelSpecs) at their default configs; None when one
    cannot be estimated (the decision is then not taken)."""
    from mtmc.kernels.catalog import family_of
    from mtmc.kernels.estimate import estimate_time
    total = 0.0
    for spec in tail_specs:
        est = estimate_time(spec, family_of(spec).default_config(spec, hw), hw)
        if not est.get("feasible") or est.get("ms") is None:
            return None
        total += est["ms"]
    return total


def judge(ours_ms: float, library_ms: float, tail: float) -> tuple[bool, str]:
    """Whether cuDNN's conv plus the fused tail pays against our fused group, and why in words."""
    numbers = (f"cuDNN's conv {library_ms:.3f} ms (measured) + its tail fused on its own {tail:.3f} ms "
               f"(estimated) against our conv with the tail {ours_ms:.3f} ms (measured)")
    if library_ms + tail < MARGIN * ours_ms:
        return True, f"the library conv with a fused tail is faster: {numbers}"
    return False, f"our conv kernel stays: {numbers}"
