"""How much memory this machine has free: host (MemAvailable, capped by the cgroup's limit) and
GPU (nvidia-smi), read without creating a CUDA context in the calling process.

Limits on what an upload may use are derived from these numbers, not from constants, so the
same code refuses less on a 128 GiB GPU host than on a small laptop.

MTMC_GPU_FREE_MB (environment): the free GPU memory to assume, in MiB, instead of asking
nvidia-smi (to reserve memory for something else, or to test the size check without a GPU).
"""
from __future__ import annotations

import os
import resource
import shutil
import subprocess

CAPTURE_SHARE = 0.5        # of free host memory, for the capture child (it may fall back to real tensors)
CAPTURE_FLOOR_MB = 2048    # address space torch itself needs in a child, whatever is free
GPU_FREE_ENV = "MTMC_GPU_FREE_MB"
MIB = 2**20


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def meminfo_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes."""
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _number(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None   # "max" (v2) means no limit


def cgroup_free() -> int | None:
    """Limit minus usage of this process's memory cgroup (v2, else v1), in bytes; None when no
    limit is set."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit = _number(_read(limit_file))
        # v1 reports "no limit" as a huge page-rounded number
        if limit is not None and limit < 2**60:
            return max(0, limit - (_number(_read(usage_file)) or 0))
    return None


def host_free_bytes() -> int | None:
    """Host memory a new process can use: MemAvailable, or less when the cgroup says so."""
    known = [b for b in (meminfo_available(), cgroup_free()) if b is not None]
    return min(known) if known else None


def capture_memory_mb() -> int:
    """The capture child's address-space cap: a share of free host memory, at least the floor."""
    free = host_free_bytes()
    share = int(free * CAPTURE_SHARE) // MIB if free else 0
    return max(CAPTURE_FLOOR_MB, share)


def address_space_left() -> int | None:
    """Bytes this process may still map under its RLIMIT_AS (None: no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = 0
    for line in (_read("/proc/self/status") or "").splitlines():
        if line.startswith("VmSize:"):
            used = int(line.split()[1]) * 1024
    return max(0, soft - used)


def _visible_gpu() -> str | None:
    """nvidia-smi's id of the first GPU CUDA would use (CUDA_VISIBLE_DEVICES), None for the first."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first or None


def gpu_memory() -> tuple[int, int] | None:
    """(free, total) bytes of the GPU CUDA would use, or None without one.  nvidia-smi, not
    torch.cuda: a CUDA context in this process would hold memory and could not be forked."""
    override = os.environ.get(GPU_FREE_ENV)
    if override:
        free = int(float(override) * MIB)
        return free, free
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    cmd = [exe, "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits"]
    if _visible_gpu():
        cmd += ["-i", _visible_gpu()]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
        free, total = (int(float(v)) * MIB for v in out.strip().splitlines()[0].split(","))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return free, total


def gib(n: int | float) -> str:
    """Bytes in words for messages: '37.3 GiB', '512.0 MiB'."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / MIB:.1f} MiB"
