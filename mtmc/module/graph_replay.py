"""ModelNew's forward replayed as one CUDA graph: the launch-overhead macro action (issue 16).

A level-3 network at KernelBench's batch runs hundreds of small kernels, and a launch costs the
host a few microseconds each: the GPU waits on Python.  Replaying the whole forward as a CUDA
graph launches it once.  The helper below goes into ModelNew's file (assemble's prelude); the
module flow writes a ModelNew that uses it only where the GPU measures it faster and the guard
passes it (agents.module_flow's `replay` node).

Per call: the inputs are copied into the graph's static buffers (the copy is part of the time)
and the outputs cloned out of the graph's pool (a caller may keep them across calls).  A graph is
captured per input signature (shapes, dtypes, strides, device), mode and parameter storage (a
`.to()` or a swapped parameter captures anew); the warm-up calls a capture needs run on a side
stream and the buffers they moved (a training-mode BatchNorm's running statistics) are put back,
so every call moves the state exactly once, as Model's forward does.  Anything the capture cannot
take (a host sync, a CPU tensor, keyword arguments, no GPU) runs the plain forward instead.
Forwards that draw random numbers are never replayed (the flow refuses them): a graph's draws
would not follow Model's generator stream.
"""
from __future__ import annotations

REPLAY_HELPER = '''
def _mtmc_capture(mod, fn, args):
    """(graph, static inputs, static outputs) for fn(mod, *args), or False when it cannot be captured."""
    saved = [b.detach().clone() for b in mod.buffers()]
    static_in = [a.clone() for a in args]
    entry = False
    try:
        # the warm-up on the stream captures use (torch.cuda.graph's own): no stream made here
        if torch.cuda.graph.default_capture_stream is None:
            torch.cuda.graph.default_capture_stream = torch.cuda.Stream()
        side = torch.cuda.graph.default_capture_stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):   # compiles kernels, sets up the libraries' workspaces
                fn(mod, *static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_out = fn(mod, *static_in)
        entry = (graph, static_in, static_out)
    except Exception:   # a host sync or anything else capture refuses: the plain forward
        torch.cuda.synchronize()
    finally:
        with torch.no_grad():   # the warm-up calls' state changes undone
            for b, v in zip(mod.buffers(), saved):
                b.copy_(v)
    return entry


def _mtmc_replay(mod, fn, args, capture=None):
    """fn(mod, *args) as a replayed CUDA graph where one can be captured, else as it is."""
    from torch.utils._pytree import tree_map
    tensors = all(isinstance(a, torch.Tensor) for a in args)
    if capture is None and (not (args and tensors and all(a.is_cuda for a in args))
                            or torch.cuda.is_current_stream_capturing()):   # inside a caller's own graph
        return fn(mod, *args)
    state = [*mod.parameters(), *mod.buffers()]
    key = (tuple((tuple(a.shape), a.dtype, a.stride(), str(a.device)) for a in args), mod.training,
           tuple(t.data_ptr() for t in state))
    graphs = mod.__dict__.setdefault("_mtmc_graphs", {})
    if key not in graphs:
        graphs[key] = (capture or _mtmc_capture)(mod, fn, args)
    entry = graphs[key]
    if entry is False:
        return fn(mod, *args)
    graph, static_in, static_out = entry
    with torch.no_grad():
        for s, a in zip(static_in, args):
            s.copy_(a)
        graph.replay()
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, static_out)
'''

_ns: dict = {}
exec("import torch\n" + REPLAY_HELPER, _ns)
replay = _ns["_mtmc_replay"]   # the same function, callable here (the tests drive it with a fake capture)


def forward_source(target: str) -> str:
    """ModelNew's forward method replaying `target(self, *args)` (a module-level function or
    Model.forward); keyword arguments run it plainly."""
    return ("def forward(self, *args, **kwargs):\n"
            "    # the whole forward replayed as one CUDA graph (module.graph_replay): one launch, not hundreds\n"
            "    if kwargs:\n"
            f"        return {target}(self, *args, **kwargs)\n"
            f"    return _mtmc_replay(self, {target}, args)\n")
