"""Capture an uploaded module's forward graph.  Runs ONLY in a sandboxed child (worker job
"capture"): it imports the user's file and runs its code.

The file follows the common kernel-benchmark format: `class Model(nn.Module)`, `get_inputs()`
(the forward inputs) and `get_init_inputs()` (the constructor arguments).  The module is built,
run once eagerly on get_inputs() (so the real shapes and dtypes are known and a forward that
raises is reported as such), and traced with torch.fx; a ShapeProp run records what every node
produced.

A forward torch.fx cannot trace (a Python `if` on a tensor value, for example) is not the end:
the submodule whose code failed is kept as one opaque call and the rest is traced around it;
when the failing code is the traced module's own forward, each submodule it called is captured
on its own instead (with the arguments it got in the eager run).  Every such part is reported
with the file line that stopped the tracer.

Result (JSON): {"graphs": [{"path", "nodes", "modules", "line_of"}], "problems": [{"path",
"where", "reason"}], "inputs", "params", "training"}.  A bad upload raises UploadError with a
plain-words message; the worker turns it into an error result.
"""
from __future__ import annotations

import inspect
import os
import re
import sys
import traceback

MAX_LEAVES = 32          # untraceable submodules tolerated per traced module
MAX_GRAPHS = 64          # separately captured submodules, all told
PHASE_MARK = "mtmc-capture-phase:"
# What each phase does, in words, for timeouts and crashes reported by the parent.
PHASES = {
    "import": "importing the file",
    "init": "building Model(*get_init_inputs())",
    "inputs": "running get_inputs()",
    "forward": "running Model.forward on get_inputs()",
    "trace": "tracing the forward with torch.fx",
}


class UploadError(Exception):
    """The upload cannot be used; the message says why in plain words."""


class Untraceable(Exception):
    def __init__(self, where: str, reason: str):
        super().__init__(reason)
        self.where, self.reason = where, reason


def phase(name: str) -> None:
    """Mark the phase on stderr: a parent whose child hangs or dies can say where."""
    print(f"{PHASE_MARK} {name}", file=sys.stderr, flush=True)


def last_phase(stderr: str) -> str | None:
    marks = [line.split(PHASE_MARK, 1)[1].strip() for line in stderr.splitlines() if PHASE_MARK in line]
    return marks[-1] if marks else None


# -- where in the user's file -----------------------------------------------------------------

def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def where(exc: BaseException, path: str) -> str:
    """`file line N, in func: code` of the deepest frame of the user's file in a traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _same(f.filename, path)]
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f"{os.path.basename(path)} line {exc.lineno}: {(exc.text or '').strip()}"
    if not frames:
        return ""
    f = frames[-1]
    return f"{os.path.basename(path)} line {f.lineno}, in {f.name}: {(f.line or '').strip()}"


def _line_of(stack_trace: str | None, path: str) -> int | None:
    if not stack_trace:
        return None
    hits = re.findall(r'File "([^"]+)", line (\d+)', stack_trace)
    lines = [int(n) for f, n in hits if _same(f, path)]
    return lines[-1] if lines else None


def _reason(exc: BaseException) -> str:
    import torch.fx
    if isinstance(exc, torch.fx.proxy.TraceError):
        return ("Python control flow on a tensor's value (an if, while or bool() on data) "
                "cannot be captured as a graph")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:300]}"


def out_of_memory(exc: BaseException) -> bool:
    """MemoryError, or torch's allocator failing under the sandbox's memory limit."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "can't allocate memory" in text or "out of memory" in text


def memory_limit_mb() -> int | None:
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft // 2**20


def _failure(what: str, exc: BaseException, path: str) -> UploadError:
    at = where(exc, path)
    if out_of_memory(exc):
        limit = memory_limit_mb()
        return UploadError(f"{what} ran out of memory" + (f" (the limit is {limit} MB)" if limit else "")
                           + (f"\n  at {at}" if at else ""))
    return UploadError(f"{what} raised {type(exc).__name__}: {str(exc).strip()[:600]}"
                       + (f"\n  at {at}" if at else ""))


# -- loading and running --------------------------------------------------------------------

def load_upload(path: str):
    """Import the file and check the format; returns the module."""
    from mtmc.kernels.loader import load_file
    name = os.path.basename(path)
    phase("import")
    try:
        module = load_file(path, "mtmc_upload")
    except SyntaxError as e:
        raise UploadError(f"{name} has a syntax error at line {e.lineno}: {e.msg}"
                          + (f"\n  {e.text.strip()}" if e.text else "")) from None
    except BaseException as e:  # SystemExit, KeyboardInterrupt and MemoryError from an upload too
        raise _failure(f"importing {name}", e, path) from None
    import torch.nn as nn
    missing = [n for n in ("get_inputs", "get_init_inputs") if not callable(getattr(module, n, None))]
    model_cls = getattr(module, "Model", None)
    if not (isinstance(model_cls, type) and issubclass(model_cls, nn.Module)):
        missing.insert(0, "class Model(nn.Module)")
    if missing:
        raise UploadError(f"{name} does not define {', '.join(missing)}; a module file needs "
                          "class Model(nn.Module), get_inputs() returning the forward inputs and "
                          "get_init_inputs() returning the constructor arguments")
    return module


def build(module, path: str):
    """(model, inputs) from the file's own get_init_inputs() / get_inputs()."""
    name = os.path.basename(path)
    phase("init")
    try:
        init = list(module.get_init_inputs())
        model = module.Model(*init)
    except BaseException as e:
        raise _failure(f"building Model(*get_init_inputs()) from {name}", e, path) from None
    phase("inputs")
    try:
        inputs = module.get_inputs()
    except BaseException as e:
        raise _failure(f"get_inputs() in {name}", e, path) from None
    if not isinstance(inputs, (list, tuple)):
        # Model(*get_inputs()) would unpack a tensor along its first dim (the verifier and the
        # benchmark harness both call it so): say so rather than capture something else
        raise UploadError(f"get_inputs() in {name} returned a {type(inputs).__name__}, not a list of the "
                          "forward's inputs; the format calls Model(*get_inputs()), which would split it. "
                          "Return a list, e.g. [x].")
    return model, list(inputs)


def run_recording_calls(model, inputs, path: str):
    """One eager forward; returns (output, {submodule path: (args, kwargs) of its first call})."""
    import torch
    calls: dict[str, tuple] = {}
    names = {id(m): p for p, m in model.named_modules() if p}
    hooks = []

    def record(mod, args, kwargs):
        calls.setdefault(names[id(mod)], (args, kwargs))

    for p, m in model.named_modules():
        if p:
            hooks.append(m.register_forward_pre_hook(record, with_kwargs=True))
    phase("forward")
    try:
        with torch.no_grad():
            out = model(*inputs)
    except BaseException as e:
        raise _failure(f"Model.forward on get_inputs() from {os.path.basename(path)}", e, path) from None
    finally:
        for h in hooks:
            h.remove()
    return out, calls


# -- tracing ----------------------------------------------------------------------------------

def _tracer(leaves: set[str]):
    import torch.fx as fx

    class Tracer(fx.Tracer):
        """fx's tracer that keeps `leaves` opaque and tags a failure with the innermost
        submodule whose forward raised it."""

        def is_leaf_module(self, m, qualname):
            return qualname in leaves or super().is_leaf_module(m, qualname)

        def call_module(self, m, forward, args, kwargs):
            try:
                return super().call_module(m, forward, args, kwargs)
            except Exception as e:
                if getattr(e, "mtmc_path", None) is None:
                    e.mtmc_path = self.path_of_module(m)
                raise

    t = Tracer()
    t.record_stack_traces = True  # each node's line in the user's file, for reports
    return t


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if prefix and path else prefix or path


def _positional(mod, args: tuple, kwargs: dict) -> list:
    """The recorded call as positional arguments in forward's order (fx placeholders)."""
    if not kwargs:
        return list(args)
    sig = inspect.signature(mod.forward)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        raise Untraceable("", "its forward takes *args or **kwargs")
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return list(bound.arguments.values())


def _module_info(mod) -> dict:
    """A submodule kept as a call: its class and its plain settings (for fusion)."""
    import torch
    attrs = {}
    for k, v in vars(mod).items():
        if k.startswith("_"):
            continue
        if isinstance(v, (bool, int, float, str)) or v is None:
            attrs[k] = v
        elif isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v):
            attrs[k] = list(v)
    params = {n: {"shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch.")}
              for n, p in mod.named_parameters(recurse=False)}
    params.update({n: {"shape": list(b.shape), "dtype": str(b.dtype).removeprefix("torch.")}
                   for n, b in mod.named_buffers(recurse=False) if isinstance(b, torch.Tensor)})
    cls = type(mod)
    return {"type": f"{cls.__module__}.{cls.__qualname__}", "attrs": attrs, "params": params}


def trace_module(prefix: str, mod, args: list, path: str) -> tuple[dict, list[dict]]:
    """The graph of `mod` (at `prefix` in the model) and the submodules kept opaque."""
    import torch
    import torch.fx as fx
    from torch.fx.passes.shape_prop import ShapeProp

    from mtmc.kernels.fxjson import Unreproducible, describe_value, encode_node

    leaves: dict[str, dict] = {}
    for _ in range(MAX_LEAVES + 1):
        try:
            graph = _tracer(set(leaves)).trace(mod)
            break
        except Exception as e:
            sub = getattr(e, "mtmc_path", None)
            if not sub or sub in leaves:
                raise Untraceable(where(e, path), _reason(e)) from None
            leaves[sub] = {"path": _join(prefix, sub), "where": where(e, path), "reason": _reason(e)}
    else:
        raise Untraceable("", f"more than {MAX_LEAVES} submodules cannot be traced")
    for n in graph.nodes:
        if n.op == "get_attr" and n.target.startswith("_tensor_constant"):
            line = _line_of(n.stack_trace, path)
            raise Untraceable(f"{os.path.basename(path)} line {line}" if line else "",
                              "the forward builds a tensor constant while it runs")
    gm = fx.GraphModule(mod, graph)
    values: dict[str, dict] = {}

    class Recorder(ShapeProp):
        def run_node(self, n):
            # keep only what each node produced in words (shape, dtype, small values): holding
            # every intermediate tensor ran a full-size module out of memory in the capture child
            result = super().run_node(n)
            values[n.name] = describe_value(result)
            return result

    with torch.no_grad():
        Recorder(gm).propagate(*args)
    nodes, modules, line_of = [], {}, {}
    for n in graph.nodes:
        try:
            nodes.append(encode_node(n, values.get(n.name)))
        except Unreproducible as e:
            line = _line_of(n.stack_trace, path)
            raise Untraceable(f"{os.path.basename(path)} line {line}" if line else "",
                              f"node {n.name} has {e}") from None
        if n.op == "call_module":
            modules[n.target] = _module_info(mod.get_submodule(n.target))
        line = _line_of(n.stack_trace, path)
        if line:
            line_of[n.name] = line
    return {"path": prefix, "nodes": nodes, "modules": modules, "line_of": line_of}, list(leaves.values())


def capture_graphs(model, inputs: list, calls: dict, path: str) -> tuple[list[dict], list[dict]]:
    """Graphs of everything that can be traced, and the parts that could not (see module doc)."""
    graphs, problems = [], []
    queue = [("", model, list(inputs))]

    def children(prefix: str, mod):
        for name, child in mod.named_children():
            p = _join(prefix, name)
            if p in calls:  # only what the eager forward actually called
                queue.append((p, child, calls[p]))

    while queue and len(graphs) < MAX_GRAPHS:
        prefix, mod, call = queue.pop(0)
        try:
            args = call if isinstance(call, list) else _positional(mod, *call)
            graph, leaves = trace_module(prefix, mod, args, path)
        except Untraceable as e:
            problems.append({"path": prefix, "where": e.where, "reason": e.reason})
            children(prefix, mod)
            continue
        graphs.append(graph)
        for leaf in leaves:
            problems.append(leaf)
            children(leaf["path"], model.get_submodule(leaf["path"]))
    return graphs, problems


def _tensor_info(t) -> dict:
    import torch
    if isinstance(t, torch.Tensor):
        return {"kind": "tensor", "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
    return {"kind": "value", "type": type(t).__name__, "repr": repr(t)[:80]}


def capture(path: str) -> dict:
    """Import, build, run and trace the module in `path` (see the module doc for the result)."""
    from mtmc.tools.offline import block_network
    block_network()
    path = os.path.abspath(path)
    module = load_upload(path)
    model, inputs = build(module, path)
    _, calls = run_recording_calls(model, inputs, path)
    phase("trace")
    graphs, problems = capture_graphs(model, inputs, calls, path)
    return {
        "file": os.path.basename(path),
        "graphs": graphs, "problems": problems,
        "inputs": [_tensor_info(x) for x in inputs],
        "params": {n: _tensor_info(p) for n, p in [*model.named_parameters(), *model.named_buffers()]},
        "training": bool(model.training),
    }


def capture_job(job: dict) -> dict:
    """Worker handler: {"kind": "capture", "path": FILE} -> capture(FILE), or an upload error
    as {"upload_error": message} (a verdict on the file, not a crash of the job)."""
    try:
        return capture(job["path"])
    except UploadError as e:
        return {"upload_error": str(e)}
