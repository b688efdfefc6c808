"""Compile a candidate for a GPU that is not here and read what it would use.

The candidate's `launch(*inputs, out)` runs on CPU tensors of the requested dims while
`JITFunction.run` is intercepted: every kernel launch is compiled for the target instead of
run, with the signature, constexprs and specialization Triton's own launcher would derive
from the same arguments.  The cubin's registers and spills come from the `cuobjdump` shipped
inside Triton; shared memory from the compiled metadata.  Nothing here needs a GPU.

Run it in the verifier's child process (tools.worker) for untrusted source: it imports the
candidate.  Triton versions: the ASTSource(fn, signature, constexprs, attrs) / GPUTarget /
compile(src, target=, options=) API is the same from 3.3 through 3.9, so 3.6 (GPU machine)
and 3.9 (here) take one code path.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field

from mtmc.tools.hardware import HardwareProfile

# Triton's type names for tensor element types, keyed by str(torch.dtype).
_PTR_TYPES = {
    "torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float64": "fp64",
    "torch.int64": "i64", "torch.int32": "i32", "torch.int16": "i16", "torch.int8": "i8",
    "torch.uint8": "u8", "torch.bool": "i1",
    "torch.float8_e4m3fn": "fp8e4nv", "torch.float8_e5m2": "fp8e5",
}
# Launch keywords that are compile options, not kernel arguments.
_DEFAULT_OPTIONS = {"num_warps": 4, "num_stages": 3}
_REG_ALLOC_UNIT = 256        # registers are allocated per warp in chunks of 256
_SMEM_RESERVED_PER_BLOCK = 1024   # sm_80+ reserve 1 KB of shared memory per resident block
_MAX_BLOCKS_PER_SM = 32


# -- occupancy ------------------------------------------------------------------------------
def blocks_per_sm(profile: HardwareProfile, threads: int, regs_per_thread: int | None,
                  smem_bytes: int) -> int:
    """Resident blocks per SM allowed by threads, registers and shared memory (0: cannot launch)."""
    if threads <= 0 or threads > 1024:
        return 0
    limits = [profile.max_threads_per_sm // threads, _MAX_BLOCKS_PER_SM]
    if regs_per_thread:
        warps = math.ceil(threads / profile.warp_size)
        per_warp = math.ceil(regs_per_thread * profile.warp_size / _REG_ALLOC_UNIT) * _REG_ALLOC_UNIT
        limits.append((profile.regs_per_sm // per_warp) // warps)
    if smem_bytes > profile.smem_per_block:
        return 0
    if smem_bytes > 0:
        limits.append(profile.smem_per_sm // (smem_bytes + _SMEM_RESERVED_PER_BLOCK))
    return max(0, min(limits))


def occupancy(profile: HardwareProfile, threads: int, regs_per_thread: int | None, smem_bytes: int) -> float:
    """Fraction of the SM's thread slots that resident blocks fill."""
    return blocks_per_sm(profile, threads, regs_per_thread, smem_bytes) * threads / profile.max_threads_per_sm


# -- the report -----------------------------------------------------------------------------
@dataclass
class KernelResources:
    name: str
    num_warps: int
    num_stages: int
    regs: int | None = None          # registers per thread (None: cuobjdump unavailable)
    spill_bytes: int = 0             # STACK + LOCAL per thread
    stack_bytes: int = 0
    local_bytes: int = 0
    shared_bytes: int = 0            # shared memory per block that Triton requests at launch
    static_shared_bytes: int = 0     # cuobjdump's SHARED: on sm_80+ the 1 KB the system reserves
    blocks_per_sm: int = 0
    occupancy: float = 0.0
    launches: int = 0
    grid: list[int] = field(default_factory=list)   # of the first launch
    constexprs: dict = field(default_factory=dict)
    signature: dict = field(default_factory=dict)
    violations: list[dict] = field(default_factory=list)
    error: str | None = None


@dataclass
class ResourceReport:
    target: str
    arch: int
    dims: dict
    kernels: list[KernelResources] = field(default_factory=list)

    @property
    def violations(self) -> list[dict]:
        return [{"kernel": k.name, **v} for k in self.kernels for v in k.violations]

    @property
    def ok(self) -> bool:
        return bool(self.kernels) and not self.violations

    def to_dict(self) -> dict:
        d = asdict(self)
        d["violations"] = self.violations
        d["ok"] = self.ok
        return d


def judge(k: KernelResources, profile: HardwareProfile) -> list[dict]:
    """The hardware limits kernel k breaks on `profile`."""
    out = []
    threads = k.num_warps * profile.warp_size
    if k.shared_bytes > profile.smem_per_block:
        out.append({"kind": "smem_overflow", "shared_bytes": k.shared_bytes, "limit_bytes": profile.smem_per_block,
                    "detail": f"needs {k.shared_bytes} B of shared memory per block; "
                              f"{profile.name} allows {profile.smem_per_block} B"})
    if k.spill_bytes > 0:
        out.append({"kind": "register_spills", "spill_bytes": k.spill_bytes, "regs": k.regs,
                    "detail": f"spills {k.spill_bytes} B per thread to local memory "
                              f"(stack {k.stack_bytes} B, local {k.local_bytes} B) at {k.regs} registers"})
    if k.regs is not None and k.regs * threads > profile.regs_per_sm:
        out.append({"kind": "too_many_regs", "regs": k.regs, "threads": threads, "limit": profile.regs_per_sm,
                    "detail": f"{k.regs} registers x {threads} threads > {profile.regs_per_sm} per SM"})
    return out


# -- reading the cubin ----------------------------------------------------------------------
def cuobjdump_path() -> str | None:
    import triton
    candidates = [os.environ.get("TRITON_CUOBJDUMP_PATH"),
                  os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"),
                  shutil.which("cuobjdump")]
    return next((p for p in candidates if p and os.path.isfile(p)), None)


_USAGE_RE = re.compile(r"(REG|STACK|SHARED|LOCAL):(\d+)")


def parse_resource_usage(text: str, name: str | None = None) -> dict[str, int]:
    """REG / STACK / SHARED / LOCAL of one function from `cuobjdump --dump-resource-usage`
    (the named one, else the first)."""
    blocks = re.split(r"^\s*Function ([\w$.]+):", text, flags=re.M)
    found = {fn: dict((k, int(v)) for k, v in _USAGE_RE.findall(body)) for fn, body in zip(blocks[1::2], blocks[2::2])}
    if not found:
        raise ValueError(f"no function in cuobjdump output: {text[:300]!r}")
    return found.get(name) or next(iter(found.values()))


def cubin_usage(cubin: bytes, name: str | None = None) -> dict[str, int] | None:
    tool = cuobjdump_path()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {res.stderr.strip()[:500]}")
    return parse_resource_usage(res.stdout, name)


# -- compiling one launch -------------------------------------------------------------------
def arg_type(value) -> str:
    """Triton signature type of one runtime argument, as its launcher derives it."""
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        try:
            return "*" + _PTR_TYPES[str(value.dtype)]
        except KeyError:
            raise TypeError(f"unsupported tensor dtype {value.dtype} for a kernel argument") from None
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        if -2**31 <= value < 2**31:
            return "i32"
        return "i64" if -2**63 <= value < 2**63 else "u64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"unsupported kernel argument {type(value).__name__}: {value!r}")


def _divisible_by_16(value) -> bool:
    if hasattr(value, "data_ptr"):
        return value.data_ptr() % 16 == 0
    return isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0


def bind(fn, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """(kernel arguments by name, defaults applied; compile options) of one launch."""
    import inspect
    names = {p.name for p in fn.params}
    bound = inspect.signature(fn.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    return dict(bound.arguments), {**_DEFAULT_OPTIONS, **{k: v for k, v in kwargs.items() if k not in names}}


def specialize(fn, args: tuple, kwargs: dict):
    """(signature, constexprs, attrs, options) of one launch, mirroring Triton's launcher:
    ints equal to 1 become constexprs, pointers and ints divisible by 16 get tt.divisibility
    (unless the kernel opts out with do_not_specialize)."""
    arguments, options = bind(fn, args, kwargs)
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        value = arguments[p.name]
        if hasattr(value, "value") and type(value).__name__ == "constexpr":
            value = value.value
        specializable = not getattr(p, "do_not_specialize", False)
        if p.is_constexpr or value is None or (specializable and type(value) is int and value == 1):
            signature[p.name] = "constexpr"
            constexprs[p.name] = value
            continue
        signature[p.name] = arg_type(value)
        if specializable and _divisible_by_16(value) and not getattr(p, "do_not_specialize_on_alignment", False):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs, options


def compile_for(fn, signature: dict, constexprs: dict, attrs: dict, options: dict, profile: HardwareProfile):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    src = ASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", profile.arch, profile.warp_size), options=options)


def _kernel_name(fn) -> str:
    return getattr(fn, "__name__", None) or fn.fn.__name__


def resources_of(compiled, profile: HardwareProfile) -> KernelResources:
    md = compiled.metadata
    k = KernelResources(name=md.name, num_warps=md.num_warps, num_stages=md.num_stages,
                        shared_bytes=int(md.shared))
    usage = cubin_usage(compiled.asm["cubin"], md.name)
    if usage is not None:
        k.regs = usage.get("REG", 0)
        k.stack_bytes, k.local_bytes = usage.get("STACK", 0), usage.get("LOCAL", 0)
        k.spill_bytes = k.stack_bytes + k.local_bytes
        # not added to shared_bytes: the per-block limits already exclude the system's reserve
        k.static_shared_bytes = usage.get("SHARED", 0)
    threads = k.num_warps * profile.warp_size
    k.blocks_per_sm = blocks_per_sm(profile, threads, k.regs, k.shared_bytes)
    k.occupancy = k.blocks_per_sm * threads / profile.max_threads_per_sm
    return k


def _jsonable(v):
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


def _grid(grid, fn, args: tuple, kwargs: dict) -> list[int]:
    """The launch grid as a list of 3 ints (a callable grid gets the bound arguments)."""
    if callable(grid):
        grid = grid(bind(fn, args, kwargs)[0])
    dims = [int(g) for g in grid] + [1, 1, 1]
    return dims[:3]


class _Interceptor:
    """Replaces kernel launches with target compiles; one compile per distinct specialization."""

    def __init__(self, profile: HardwareProfile):
        self.profile = profile
        self.by_key: dict = {}
        self.kernels: list[KernelResources] = []

    def launch(self, fn, args: tuple, grid, kwargs: dict):
        name = _kernel_name(fn)
        try:
            signature, constexprs, attrs, options = specialize(fn, args, kwargs)
            key = (id(fn), tuple(signature.items()), repr(sorted(constexprs.items())),
                   repr(sorted(attrs.items())), repr(sorted(options.items())))
        except Exception as e:  # a launch the real binder would reject too
            self.kernels.append(self._failed(name, kwargs, e))
            return None
        k = self.by_key.get(key)
        if k is None:
            k = self._compile(fn, name, signature, constexprs, attrs, options)
            self.by_key[key] = k
            self.kernels.append(k)
        if k.launches == 0:
            with contextlib.suppress(Exception):
                k.grid = _grid(grid, fn, args, kwargs)
        k.launches += 1
        return None

    def _compile(self, fn, name, signature, constexprs, attrs, options) -> KernelResources:
        try:
            compiled = compile_for(fn, signature, constexprs, attrs, options, self.profile)
            k = resources_of(compiled, self.profile)
        except Exception as e:  # CompilationError, OutOfResources, ptxas failures: a verdict
            k = self._failed(name, options, e)
        k.signature = signature
        k.constexprs = {n: _jsonable(v) for n, v in constexprs.items()}
        if k.error is None:
            k.violations = judge(k, self.profile)
        return k

    @staticmethod
    def _failed(name: str, options: dict, e: Exception) -> KernelResources:
        msg = f"{type(e).__name__}: {e}".strip()
        return KernelResources(name=name, num_warps=int(options.get("num_warps", 4)),
                               num_stages=int(options.get("num_stages", 3)), error=msg,
                               violations=[{"kind": "compile_error", "error_type": type(e).__name__,
                                            "detail": msg[-4000:]}])


@contextlib.contextmanager
def intercept_launches(profile: HardwareProfile):
    """Within the block, `kernel[grid](...)` compiles for `profile` instead of running; yields the
    interceptor whose `.kernels` collects the results."""
    from triton.runtime.jit import JITFunction
    icpt = _Interceptor(profile)
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        return icpt.launch(self, args, grid, kwargs)

    JITFunction.run = run
    try:
        yield icpt
    finally:
        JITFunction.run = original


@contextlib.contextmanager
def compiled_mode():
    """Triton decides at @jit time whether a kernel is interpreted: import with it unset."""
    old = os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield
    finally:
        if old is not None:
            os.environ["TRITON_INTERPRET"] = old


def compile_resources(source: str, task: dict, dims: dict | None, profile: HardwareProfile) -> ResourceReport:
    """Compile every kernel `launch` would run at `dims` (default: the task's; a task is plain
    data, see tools.correctness) for `profile` and judge its resources, in this process.

    Compile failures become "compile_error" violations; an exception raised by the source's own
    Python (import or the launch wrapper) propagates.  A process whose Triton the interpreter has
    spoiled (tools.triton_state) cannot compile: tools.worker.compile_resources then compiles in a
    fresh child."""
    import torch

    from mtmc.tools.correctness import concrete_shape
    from mtmc.tools.loader import load_source, torch_dtype
    dims = dict(dims or task["dims"])
    with compiled_mode():
        module = load_source(source, "candidate")
    if not hasattr(module, "launch"):
        raise AttributeError("the kernel source defines no launch(*inputs, out)")
    # Values are never read (nothing runs): uninitialized tensors cost no time at any size.
    def placeholder(arg):
        return torch.empty(concrete_shape(arg["shape"], dims, arg.get("groups", 1)), dtype=torch_dtype(arg["dtype"]))
    inputs, out = [placeholder(a) for a in task["inputs"]], placeholder(task["output"])
    with intercept_launches(profile) as icpt:
        module.launch(*inputs, out=out)
    return ResourceReport(target=profile.name, arch=profile.arch, dims=dims, kernels=icpt.kernels)


def report_from_dict(d: dict) -> ResourceReport:
    kernels = [KernelResources(**k) for k in d["kernels"]]
    return ResourceReport(target=d["target"], arch=d["arch"], dims=d["dims"], kernels=kernels)
