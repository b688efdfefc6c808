"""Capture an uploaded module's forward graph.  Runs ONLY in a sandboxed child (worker job
"capture"): it imports the user's file and runs its code.

The file follows the common kernel-benchmark format: `class Model(nn.Module)`, `get_inputs()`
(the forward inputs) and `get_init_inputs()` (the constructor arguments).  The module is built,
run once eagerly on get_inputs() (so the shapes and dtypes are known and a forward that raises
is reported as such), and traced with torch.fx; a ShapeProp run records what every node
produced.  All of it runs under torch's FakeTensorMode: every tensor has a shape, a dtype and
no data, so inputs of 1e10 elements cost nothing.  When fake tensors cannot run the module (it
reads a value: .item(), bool() on a tensor, an output size that depends on the data), it is run
again on real tensors, but only when the sizes learned so far fit this process's memory; else
the upload is refused with those numbers.

A forward torch.fx cannot trace (a Python `if` on a tensor value, for example) is not the end:
the submodule whose code failed is kept as one opaque call and the rest is traced around it;
when the failing code is the traced module's own forward, each submodule it called is captured
on its own instead (with the arguments it got in the eager run).  Every such part is reported
with the file line that stopped the tracer.

Result (JSON): {"graphs": [{"path", "nodes", "modules", "line_of"}], "problems": [{"path",
"where", "reason"}], "inputs", "params", "outputs", "training", "tensors": "fake" | "real"
(the forward's), "fake_failure" (when present: what fake tensors could not run)}.  A bad upload raises UploadError with a
plain-words message; the worker turns it into an error result.
"""
from __future__ import annotations

import contextlib
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
    """The upload cannot be used; the message says why in plain words.  `cause`: the exception
    the upload's code raised, when it raised one."""

    def __init__(self, message: str, cause: BaseException | None = None):
        super().__init__(message)
        self.cause = cause


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
        return ("Python control flow on a traced value (an if, while, assert or bool() on a tensor, "
                "its shape or its device) cannot be captured as a graph")
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


# What fake tensors raise when the code needs the data itself (torch's own exception names).
NEEDS_DATA = {"DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException",
              "UnsupportedFakeTensorException", "GuardOnDataDependentSymNode"}


def _failure(what: str, exc: BaseException, path: str) -> UploadError:
    at = where(exc, path)
    if out_of_memory(exc):
        limit = memory_limit_mb()
        return UploadError(f"{what} ran out of memory" + (f" (the limit is {limit} MB)" if limit else "")
                           + (f"\n  at {at}" if at else ""), exc)
    hint = (" (it reads the tensors' values: .item(), bool() or an output size that depends on the data, "
            "which shapes alone cannot give)" if type(exc).__name__ in NEEDS_DATA else "")
    return UploadError(f"{what} raised {type(exc).__name__}: {str(exc).strip()[:600]}{hint}"
                       + (f"\n  at {at}" if at else ""), exc)


# -- loading and running --------------------------------------------------------------------

def load_upload(path: str):
    """Import the file and check the format; returns the module."""
    from mtmc.tools.loader import load_file
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


def _construct(module, init: list, fake: bool, notes: dict):
    """Model(*init).  A constructor fake tensors cannot run (it reads data: `[x.item() for x in
    torch.linspace(...)]`, or converts itself: `self.half()`) builds the model on real tensors
    instead, under the child's memory cap; the forward still runs on fake ones."""
    try:
        return module.Model(*init)
    except Exception as e:
        if not fake:
            raise
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        notes["fake_failure"] = (f"building Model(*get_init_inputs()) on fake tensors raised {type(e).__name__}: "
                                 f"{str(e).strip()[:300]}; it was built on real tensors")
        with unset_fake_temporarily():
            return module.Model(*init)


def build(module, path: str, learned: dict, fake: bool = False, notes: dict | None = None):
    """(model, inputs) from the file's own get_init_inputs() / get_inputs(); their bytes go
    into `learned` as soon as they are known, and what could not run on fake tensors into `notes`."""
    import torch
    name = os.path.basename(path)
    phase("init")
    try:
        init = list(module.get_init_inputs())
        model = _construct(module, init, fake, {} if notes is None else notes)
    except BaseException as e:
        raise _failure(f"building Model(*get_init_inputs()) from {name}", e, path) from None
    learned["parameters"] = info_bytes(params_info(model).values())
    phase("inputs")
    try:
        inputs = module.get_inputs()
    except BaseException as e:
        raise _failure(f"get_inputs() in {name}", e, path) from None
    if not isinstance(inputs, (list, tuple)):
        # Model(*get_inputs()) would unpack a tensor along its first dim (the verifier and the
        # benchmark harness both call it so): say so rather than capture something else
        kind = "Tensor" if isinstance(inputs, torch.Tensor) else type(inputs).__name__  # not FakeTensor
        raise UploadError(f"get_inputs() in {name} returned a {kind}, not a list of the "
                          "forward's inputs; the format calls Model(*get_inputs()), which would split it. "
                          "Return a list, e.g. [x].")
    learned["inputs"] = info_bytes(_tensor_info(x) for x in inputs)
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

def _tracer(leaves: set[str], expand: frozenset = frozenset(), facts=None):
    import torch.fx as fx

    from mtmc.module.attention_capture import expanded_forward
    from mtmc.module.shape_facts import DataDependent

    class SizedProxy(fx.Proxy):
        """A proxy that a size of the recorded call may stand in for where Python needs an int
        (range(x.size(0)), a list's length): module.shape_facts."""

        def _fact(self, kinds: tuple):
            try:
                v = facts.value(self.node) if facts else None
            except DataDependent:
                v = None
            if isinstance(v, bool) or not isinstance(v, kinds):
                raise TypeError("'Proxy' object cannot be interpreted as an integer")
            return v

        def __index__(self):
            return self._fact((int,))

        def __int__(self):   # Swin's B = int(windows.shape[0] / (H * W / ws / ws))
            return int(self._fact((int, float)))

        def __float__(self):
            return float(self._fact((int, float)))

    class Tracer(fx.Tracer):
        """fx's tracer that keeps `leaves` opaque, traces the MultiheadAttention calls in
        `expand` as their parts (module.attention_capture), and tags a failure with the innermost
        submodule whose forward raised it."""
        evaluating = 0   # > 0 while shape_facts runs a submodule (untraced)

        def proxy(self, node):
            return SizedProxy(node, self)

        def to_bool(self, obj):
            """An if / assert on the recorded call's shapes takes that call's branch."""
            try:
                if facts is not None:
                    return bool(facts.value(obj.node))
            except DataDependent:
                pass
            return super().to_bool(obj)

        def is_leaf_module(self, m, qualname):
            if qualname in expand:
                return False
            return qualname in leaves or super().is_leaf_module(m, qualname)

        def trace(self, root, concrete_args=None):
            with _factories_recorded():
                return super().trace(root, concrete_args)

        @contextlib.contextmanager
        def untraced(self):
            """While shape_facts runs a submodule on fake tensors: plain calls, no proxies."""
            self.evaluating += 1
            try:
                yield
            finally:
                self.evaluating -= 1

        def getattr(self, attr, attr_val, parameter_proxy_cache):
            if self.evaluating:
                return attr_val
            return super().getattr(attr, attr_val, parameter_proxy_cache)

        def call_module(self, m, forward, args, kwargs):
            if self.evaluating:
                return forward(*args, **kwargs)
            if expand and self.path_of_module(m) in expand:
                forward = expanded_forward(m)
            try:
                return super().call_module(m, forward, args, kwargs)
            except Exception as e:
                if getattr(e, "mtmc_path", None) is None:
                    e.mtmc_path = self.path_of_module(m)
                raise

    t = Tracer(autowrap_modules=_opaque_libraries())
    if facts is not None:
        facts.quiet = t.untraced
    t.record_stack_traces = True  # each node's line in the user's file, for reports
    t.proxy_buffer_attributes = True  # self.mask[:, :, :T, :T] slices a buffer by a traced size
    return t


def _opaque_libraries() -> tuple:
    """fxjson.OPAQUE_LIBRARIES the upload imported (einops: "Tensor type unknown to einops" on an fx
    proxy): their functions are recorded as calls, like math's, run by the library itself on fake
    tensors for shapes and in ModelNew (KernelBench's Mamba2 tasks rearrange with einops)."""
    import math

    from mtmc.module.fxjson import OPAQUE_LIBRARIES
    return (math, *(sys.modules[name] for name in OPAQUE_LIBRARIES if name in sys.modules))


# Factories take no tensor, so torch never shows fx a call with a traced size or device in it
# (Mamba2's torch.ones(T, T, device=x.device)): the C++ argument parser refuses the proxy instead.
# While tracing, a call to one of these with a proxy among its arguments is recorded as a node.
FACTORIES = ("ones", "zeros", "full", "empty", "arange", "eye", "rand", "randn", "randint", "linspace")


@contextlib.contextmanager
def _factories_recorded():
    import torch
    import torch.fx as fx
    from torch.utils._pytree import tree_leaves
    python_dtypes = {bool: torch.bool, int: torch.int64, float: torch.get_default_dtype()}

    def recording(fn):
        def call(*args, **kwargs):
            proxy = next((a for a in tree_leaves((args, kwargs)) if isinstance(a, fx.Proxy)), None)
            if proxy is None:
                return fn(*args, **kwargs)
            if kwargs.get("dtype") in python_dtypes:   # dtype=bool: a Python type is no graph argument
                kwargs = {**kwargs, "dtype": python_dtypes[kwargs["dtype"]]}
            return proxy.tracer.create_proxy("call_function", fn, args, kwargs)
        return call

    originals = {name: getattr(torch, name) for name in FACTORIES}
    try:
        for name, fn in originals.items():
            setattr(torch, name, recording(fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if prefix and path else prefix or path


def _call_args(mod, call) -> tuple[list, dict]:
    """The recorded call (a list, or (args, kwargs)) as positional arguments in forward's order
    (fx placeholders), and the parameters it left at plain default values: traced as those
    constants, so `if h0 is None:` takes the branch the call took (and so do Nones it passed)."""
    args, kwargs = (call, {}) if isinstance(call, list) else call
    sig = inspect.signature(mod.forward)
    params = list(sig.parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        if kwargs:
            raise Untraceable("", "its forward takes *args or **kwargs")
        return list(args), {}
    bound = sig.bind(*args, **kwargs)
    left = {p.name: p.default for p in params if p.name not in bound.arguments
            and (p.default is None or isinstance(p.default, (bool, int, float, str)))}
    # a None passed explicitly is as constant as a default one (Swin's attn(x, mask=None))
    left.update({k: None for k, v in bound.arguments.items() if v is None})
    bound.apply_defaults()
    return list(bound.arguments.values()), left


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


def _trace_keeping_state(tracer, mod, defaults: dict):
    """(graph, attributes the forward assigned).  A forward that sets `self.hidden = ...` would
    leave fx proxies in the module while tracing: the attributes are put back as they were."""
    before = {(m, k): v for m in mod.modules() for k, v in vars(m).items() if not k.startswith("_")}
    names = {m: n for n, m in mod.named_modules()}
    try:
        graph = tracer.trace(mod, concrete_args=defaults or None)
    finally:
        after = {(m, k): v for m in mod.modules() for k, v in vars(m).items() if not k.startswith("_")}
        assigned = sorted({"self." + _join(names.get(m, "?"), k) for (m, k), v in after.items()
                           if (m, k) not in before or before[(m, k)] is not v})
        for (m, k) in after.keys() - before.keys():
            del m.__dict__[k]
        for (m, k), v in before.items():
            m.__dict__[k] = v
    return graph, assigned


# A tensor the forward builds from Python numbers (torch.tensor(self.constant_value), KernelBench
# L2 31) up to this many elements is kept in the graph as that call; a larger one is refused.
MAX_CONSTANT_ELEMENTS = 64


def _constant_as_call(graph, node, t, path: str) -> None:
    """Replace fx's `_tensor_constant` attribute (a tensor made while tracing) by the torch.tensor
    call that makes it, so the graph stays plain data; refused unless it is a few numbers."""
    import torch
    values = None
    if type(t).__name__ == "FakeTensor":   # made under fake tensors: a 0-d one keeps its value
        t = getattr(t, "constant", None)
    if isinstance(t, torch.Tensor) and type(t) is torch.Tensor and not t.requires_grad \
            and t.numel() <= MAX_CONSTANT_ELEMENTS and t.device.type == "cpu":
        values = t.tolist()
    if values is None:
        line = _line_of(node.stack_trace, path)
        raise Untraceable(f"{os.path.basename(path)} line {line}" if line else "",
                          "the forward builds a tensor constant of more than a few numbers while it runs")
    with graph.inserting_before(node):
        made = graph.call_function(torch.tensor, (values,), {"dtype": t.dtype})
    made.stack_trace = node.stack_trace
    node.replace_all_uses_with(made)
    graph.erase_node(node)


def trace_module(prefix: str, mod, call, path: str) -> tuple[dict, list[dict]]:
    """The graph of `mod` (at `prefix` in the model) for its recorded `call`, and the
    submodules kept opaque."""
    import torch
    import torch.fx as fx
    from torch.fx.passes.shape_prop import ShapeProp

    from mtmc.module import attention_capture
    from mtmc.module.decompose import decompose
    from mtmc.module.functionalize import functionalize
    from mtmc.module.fxjson import Unreproducible, describe_value, encode_node
    from mtmc.module.shape_facts import ShapeFacts

    args, defaults = _call_args(mod, call)
    leaves: dict[str, dict] = {}
    for _ in range(MAX_LEAVES + 1):
        try:
            graph, assigned = _trace_keeping_state(_tracer(set(leaves), facts=ShapeFacts(mod, args)), mod, defaults)
            break
        except Exception as e:
            sub = getattr(e, "mtmc_path", None)
            if not sub or sub in leaves:
                raise Untraceable(where(e, path), _reason(e)) from None
            leaves[sub] = {"path": _join(prefix, sub), "where": where(e, path), "reason": _reason(e)}
    else:
        raise Untraceable("", f"more than {MAX_LEAVES} submodules cannot be traced")
    if assigned:
        raise Untraceable("", f"the forward assigns {', '.join(assigned)}: state it changes as it runs "
                              "cannot be captured as a graph")
    for n in list(graph.nodes):
        if n.op == "get_attr" and n.target.startswith("_tensor_constant"):
            _constant_as_call(graph, n, mod.__dict__.pop(n.target, None), path)
    functionalize(graph, mod)   # h.relu_() then h: a value, where no one else sees the storage
    decompose(graph, mod)       # baddbmm, glu, addcmul ...: the plain ops the catalog fuses
    def shapes(graph) -> dict[str, dict]:
        values: dict[str, dict] = {}

        class Recorder(ShapeProp):
            def run_node(self, n):
                # keep only what each node produced in words (shape, dtype, small values): holding
                # every intermediate tensor ran a full-size module out of memory in the capture child
                result = super().run_node(n)
                values[n.name] = describe_value(result)
                return result

        with torch.no_grad():
            Recorder(fx.GraphModule(mod, graph)).propagate(*args)
        return values

    try:
        values = shapes(graph)
    except Exception as e:   # the traced graph does not run on the recorded call: its parts are tried
        if _needs_data(e):   # ... unless fake tensors are the reason: the capture runs again on real ones
            raise
        raise Untraceable(where(e, path), _reason(e)) from None
    expand = attention_capture.expandable(graph, mod, values)
    if expand:   # nn.MultiheadAttention calls traced again as their parts; kept whole if that fails
        try:
            expanded, _ = _trace_keeping_state(_tracer(set(leaves), frozenset(expand), ShapeFacts(mod, args)), mod,
                                               defaults)
            graph, values = expanded, shapes(expanded)
        except Exception:
            pass
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


def _needs_data(e: BaseException | None) -> bool:
    """Fake tensors' own failure (NEEDS_DATA), here or as the cause of a ShapeProp error."""
    while e is not None:
        if type(e).__name__ in NEEDS_DATA:
            return True
        e = e.__cause__ or e.__context__
    return False


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
            graph, leaves = trace_module(prefix, mod, call, path)
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


def params_info(model) -> dict:
    """Shape and dtype of every parameter and buffer (never their values)."""
    return {n: _tensor_info(p) for n, p in [*model.named_parameters(), *model.named_buffers()]}


def info_bytes(infos) -> int:
    """Bytes of the tensors among _tensor_info() descriptions."""
    import math

    import torch
    return sum(math.prod(i["shape"]) * getattr(torch, i["dtype"]).itemsize for i in infos if i.get("kind") == "tensor")


def fake_tensors():
    """torch's FakeTensorMode: every tensor made under it has a shape and a dtype but no data."""
    import logging

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.hub import tqdm
    # an upload's own error is reported once, by us, not with torch's traceback of it on stderr
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    # fx's Interpreter makes a (disabled) tqdm bar, whose monitor thread alone would map ~70 MB
    # of the child's capped address space
    tqdm.monitor_interval = 0
    # no fallback kernels: for an op without a shape-only implementation they run the real op on
    # zero-filled full-size tensors.  A real tensor made some other way (torch.from_numpy) is
    # turned fake where it is used.
    return FakeTensorMode(allow_fallback_kernels=False, allow_non_fake_inputs=True)


def recurrent_layer_shapes(rnn):
    """A forward for nn.RNN / nn.LSTM / nn.GRU that makes outputs of the documented shapes only.
    Why: fake tensors run a recurrent layer as one op per time step and layer (a 6-layer
    bidirectional GRU over 512 steps took 20 s, twice per capture); shapes are all we need."""
    import torch.nn as nn
    full = type(rnn).forward

    def forward(input, hx=None):
        if not hasattr(input, "dim"):  # a PackedSequence: the layer's own forward
            return full(rnn, input, hx)
        batched, d = input.dim() == 3, 2 if rnn.bidirectional else 1
        steps, batch = (input.shape[1], input.shape[0]) if rnn.batch_first and batched else (
            input.shape[0], input.shape[1] if batched else None)
        h_out = getattr(rnn, "proj_size", 0) or rnn.hidden_size

        def make(*shape):
            return input.new_empty([n for n in shape if n is not None])
        out = make(batch, steps, d * h_out) if rnn.batch_first and batched else make(steps, batch, d * h_out)
        h = make(d * rnn.num_layers, batch, h_out)
        if isinstance(rnn, nn.LSTM):
            return out, (h, make(d * rnn.num_layers, batch, rnn.hidden_size))
        return out, h
    return forward


def run_and_trace(module, path: str, learned: dict, fake: bool) -> dict:
    """Build, run once and trace; the result without "file" and "tensors"."""
    import torch.nn as nn
    import torch.utils._pytree as pytree
    notes: dict = {}
    model, inputs = build(module, path, learned, fake, notes)
    for m in model.modules() if fake else ():
        if isinstance(m, nn.RNNBase):
            m.forward = recurrent_layer_shapes(m)
    out, calls = run_recording_calls(model, inputs, path)
    outputs = [_tensor_info(t) for t in pytree.tree_leaves(out)]
    learned["outputs"] = info_bytes(outputs)
    phase("trace")
    try:
        graphs, problems = capture_graphs(model, inputs, calls, path)
    except Exception as e:
        if not fake:  # it ran for real: a failure here is the capture's own
            raise
        raise _failure(f"the shape pass over {os.path.basename(path)}'s graph", e, path) from None
    return {"graphs": graphs, "problems": problems, "inputs": [_tensor_info(x) for x in inputs],
            "params": params_info(model), "outputs": outputs, "training": bool(model.training), **notes}


def _refuse_if_too_big(failure: UploadError, learned: dict) -> None:
    """Before running for real what fake tensors could not: refuse, with the numbers, when the
    inputs and parameters learned so far do not fit this process's memory."""
    from mtmc.tools.machine import address_space_left, gib, host_free_bytes
    budget = min((b for b in (address_space_left(), host_free_bytes()) if b is not None), default=None)
    needed = sum(learned.values())
    if budget is None or needed <= budget:
        return
    parts = ", ".join(f"{k} {gib(v)}" for k, v in learned.items())
    raise UploadError(f"{failure}\n  This was found on fake tensors (shapes, no data). Running it on real "
                      f"tensors needs at least {gib(needed)} ({needed} bytes: {parts}), more than the "
                      f"{gib(budget)} ({budget} bytes) of memory the capture may use.", failure.cause)


def capture(path: str) -> dict:
    """Import, build, run and trace the module in `path` (see the module doc for the result)."""
    path = os.path.abspath(path)
    module = load_upload(path)
    learned: dict[str, int] = {}
    try:
        with fake_tensors():
            result = {**run_and_trace(module, path, learned, fake=True), "tensors": "fake"}
    except UploadError as e:
        if e.cause is None or out_of_memory(e.cause):  # a verdict on the file, whatever the tensors
            raise
        _refuse_if_too_big(e, learned)
        result = {**run_and_trace(module, path, {}, fake=False), "tensors": "real", "fake_failure": str(e)}
    return {"file": os.path.basename(path), **result}


def capture_job(job: dict) -> dict:
    """Worker handler: {"kind": "capture", "path": FILE} -> capture(FILE), or an upload error
    as {"upload_error": message} (a verdict on the file, not a crash of the job).  The child
    loses the network first (here, not in capture(): a trusted caller keeps its own)."""
    from mtmc.tools.offline import block_network
    block_network()
    try:
        return capture(job["path"])
    except UploadError as e:
        return {"upload_error": str(e)}
