"""Instruments that watch code run in a guard child process.  They only observe and record;
the parent (guard.checks) judges what they saw, so a candidate cannot talk its way past a check
by returning a different verdict from its own process.

  OpCounter        PyTorch compute ops (aten level) run while active, not counting the ones
                   Triton's interpreter runs to move a kernel's arguments
  LaunchCounter    Triton kernel launches (JITFunction.run / the interpreter's run)
  Snapshot         identity of the timing functions and of the helpers the checks rely on
  ThreadWatch      Python and native threads that appeared since a baseline
  StreamWatch      CUDA streams created, and the current stream left behind (GPU only)
  poison_*         make memory a candidate forgets to write read as NaN / huge values
  aliases, format_problems   how an output relates to the inputs and what it is
"""
from __future__ import annotations

import ctypes
import importlib
import inspect
import os
import threading
from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that allocate, view, move or cast data (or compare whole tensors for control flow):
# they do none of a module's arithmetic, so they do not count as "doing the work in PyTorch".
# Names are overload packets without a trailing "_" (in-place forms count as their op).
NON_COMPUTE_OPS = frozenset("""
    empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones
    ones_like new_ones full full_like new_full scalar_tensor arange fill zero copy _copy_from
    _copy_from_and_resize clone _to_copy to contiguous lift_fresh lift detach alias set resize
    view _unsafe_view reshape _reshape_alias as_strided permute transpose t expand expand_as
    squeeze unsqueeze slice select narrow split split_with_sizes chunk unbind flatten unflatten
    movedim diagonal view_as_real view_as_complex cat stack _local_scalar_dense is_same_size
    unfold equal
""".split())

TIMING_FUNCTIONS = (
    "time.perf_counter", "time.perf_counter_ns", "time.time", "time.monotonic", "time.process_time",
    "triton.testing.do_bench", "torch.cuda.synchronize", "torch.cuda.Event",
    "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time", "torch.cuda.Event.synchronize",
)
# What the candidate child itself uses to observe and to hand results back (the candidate module
# adds its own share / receive: named here, they would make this module depend on it).
VERIFIER_HOOKS = (
    "threading.enumerate", "os.listdir", "torch.save", "torch.load", "torch.equal", "torch.Tensor.untyped_storage",
    "torch.Tensor.data_ptr", "torch.Tensor.clone", "torch.Tensor.cpu", "torch.Tensor.to",
    "torch.Tensor.detach", "torch.cuda.current_stream", "torch.cuda.Stream.__new__",
    "triton.runtime.jit.JITFunction.run", "triton.runtime.interpreter.InterpretedFunction.run",
    "torch.utils._python_dispatch.TorchDispatchMode.__enter__",
)


def _resolve(path: str):
    """The object at a dotted path: the longest importable module prefix, then attributes read
    statically (a class's function itself, not a fresh bound object)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = inspect.getattr_static(obj, name)
        return obj
    raise ImportError(path)


class Snapshot:
    """The objects at some dotted paths now, to tell later which were replaced."""

    def __init__(self, paths):
        self.objects = {}
        for p in paths:
            try:
                self.objects[p] = _resolve(p)
            except (ImportError, AttributeError):  # absent here (e.g. an older triton)
                pass

    def changed(self) -> list[str]:
        out = []
        for p, obj in self.objects.items():
            try:
                same = _resolve(p) is obj
            except (ImportError, AttributeError):
                same = False
            if not same:
                out.append(p)
        return out


class LaunchCounter:
    """Counts Triton launches by wrapping the run method of Triton's kernel classes (the
    autotuner launches through it too).  `depth` > 0 while a launch runs.  A CUDA graph's replay
    counts the Triton launches recorded while it was captured (a capture runs nothing; each replay
    runs them all), so a ModelNew replaying its forward as a graph (module.graph_replay) is seen
    doing its work in its kernels."""

    def __init__(self):
        self.names: Counter = Counter()
        self.depth = 0
        self._capturing: list[Counter] = []   # launches recorded by the graph being captured

    @property
    def count(self) -> int:
        return sum(self.names.values())

    def install(self) -> None:
        from triton.runtime.jit import JITFunction
        classes = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            cls.run = self._wrap(cls.run)
        self._install_graphs()

    def _install_graphs(self) -> None:
        import torch
        graph_cls = getattr(torch.cuda, "CUDAGraph", None)
        if graph_cls is None or not torch.cuda.is_available():
            return
        counter = self
        begin, end, replay = graph_cls.capture_begin, graph_cls.capture_end, graph_cls.replay

        def capture_begin(graph, *args, **kwargs):
            counter.begin_capture(graph)
            return begin(graph, *args, **kwargs)

        def capture_end(graph, *args, **kwargs):
            try:
                return end(graph, *args, **kwargs)
            finally:
                counter.end_capture(graph)

        def replayed(graph, *args, **kwargs):
            counter.replayed(graph)
            return replay(graph, *args, **kwargs)
        graph_cls.capture_begin, graph_cls.capture_end, graph_cls.replay = capture_begin, capture_end, replayed

    def begin_capture(self, graph) -> None:
        self._capturing.append(Counter())

    def end_capture(self, graph) -> None:
        if self._capturing:
            graph._mtmc_launches = self._capturing.pop()

    def replayed(self, graph) -> None:
        self.names.update(getattr(graph, "_mtmc_launches", Counter()))

    def _wrap(self, original):
        counter = self

        def run(kernel, *args, **kwargs):
            if kwargs.get("warmup"):
                return original(kernel, *args, **kwargs)
            name = getattr(getattr(kernel, "fn", None), "__name__", "?")
            (counter._capturing[-1] if counter._capturing else counter.names)[name] += 1
            counter.depth += 1
            try:
                return original(kernel, *args, **kwargs)
            finally:
                counter.depth -= 1
        return run


class OpCounter(TorchDispatchMode):
    """Counts aten compute ops while active; ops inside a Triton launch are the interpreter's own
    argument copies and are skipped."""

    def __init__(self, launches: LaunchCounter | None = None):
        super().__init__()
        self.ops: Counter = Counter()
        self._launches = launches

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._launches is None or self._launches.depth == 0:
            name = func.overloadpacket.__name__
            base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
            if base not in NON_COMPUTE_OPS:
                self.ops[base] += 1
        return func(*args, **(kwargs or {}))


_enumerate = threading.enumerate


def native_thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


class ThreadWatch:
    """Threads alive now that were not alive at the baseline."""

    def __init__(self):
        self.python = {t.ident for t in _enumerate()}
        self.native = native_thread_count()

    def new_python(self) -> list[str]:
        return [t.name for t in _enumerate() if t.ident not in self.python and t.is_alive()]

    def new_native(self) -> int:
        n = native_thread_count()
        return max(0, n - self.native) if n >= 0 and self.native >= 0 else 0


class StreamWatch:
    """CUDA streams created after install, and whether the current stream is still the one the
    caller had.  Inert without CUDA."""

    def __init__(self):
        self.created = 0
        self._start = None

    def install(self) -> None:
        import torch
        if not torch.cuda.is_available():
            return
        self._start = torch.cuda.current_stream()
        original = torch.cuda.Stream.__new__
        watch = self

        def counting_new(cls, *args, **kwargs):
            # current_stream() and friends wrap an existing stream (stream_id=...): not a new one
            if "stream_id" not in kwargs:
                watch.created += 1
            return original(cls, *args, **kwargs)
        torch.cuda.Stream.__new__ = staticmethod(counting_new)

    def current_changed(self) -> bool:
        import torch
        return self._start is not None and torch.cuda.current_stream() != self._start


# glibc mallopt parameters
_M_PERTURB, _M_MMAP_THRESHOLD = -6, -3
POISON_BYTE = 0x7F   # 0x7F7F...: NaN in fp16, about 3.4e38 in fp32 and bf16


def poison_host_allocations() -> str:
    """From now on every malloc'd byte starts as POISON_BYTE (glibc's M_PERTURB fills new
    allocations with its value xor 0xFF), and allocations up to 32 MiB come from the heap, where
    that applies, instead of fresh zeroed pages: an output the candidate forgets to write holds
    garbage, not zeros or a stale result."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 * 2**20) and libc.mallopt(_M_PERTURB, POISON_BYTE ^ 0xFF)
    except (OSError, AttributeError):
        ok = False
    return "host allocations poisoned (glibc M_PERTURB)" if ok else "host allocations not poisoned (no glibc)"


def poison_cuda_cache(nbytes: int) -> None:
    """Fill blocks of PyTorch's CUDA caching allocator with NaN and free them, so the next
    allocations (the candidate's outputs) start as NaN: a large block and a page of small ones."""
    import torch
    big = torch.empty(max(nbytes, 1 << 20) // 4, dtype=torch.float32, device="cuda").fill_(float("nan"))
    small = [torch.empty(1 << 16, dtype=torch.float32, device="cuda").fill_(float("nan")) for _ in range(32)]
    torch.cuda.synchronize()
    del big, small


def profile_kernels(fn) -> list[dict]:
    """The GPU kernels `fn` ran, from torch.profiler: name, device microseconds and stream
    (kineto's resource id); copies and memsets left out."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = []
    for ev in prof.events():
        if ev.device_type != DeviceType.CUDA or ev.name.startswith(("Memcpy", "Memset")):
            continue
        kernels.append({"name": ev.name, "us": float(ev.time_range.elapsed_us()),
                        "stream": getattr(ev, "device_resource_id", None)})
    return kernels


def aliases(outputs: list, inputs: list) -> list[str]:
    """Outputs whose memory overlaps an input's."""
    import torch
    found = []
    for i, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor) or out.numel() == 0:
            continue
        a = out.untyped_storage()
        for j, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor) or x.numel() == 0 or x.device != out.device:
                continue
            b = x.untyped_storage()
            if a.data_ptr() < b.data_ptr() + b.nbytes() and b.data_ptr() < a.data_ptr() + a.nbytes():
                found.append(f"output {i} shares memory with input {j}")
    return found


def format_problems(outputs: list, device_type: str) -> list[str]:
    """What makes an output something other than a plain, dense tensor on the task's device."""
    import torch
    problems = []
    for i, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            problems.append(f"output {i} is a {type(out).__name__}, not a tensor")
        elif type(out) is not torch.Tensor:
            problems.append(f"output {i} is a {type(out).__name__} (a torch.Tensor subclass), not a plain tensor")
        elif out.layout != torch.strided:
            problems.append(f"output {i} has layout {out.layout}, not a dense tensor")
        elif out.device.type != device_type:
            problems.append(f"output {i} is on {out.device}, not {device_type}")
    return problems
