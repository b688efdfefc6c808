"""Values a trace may take as constants: the sizes, dims, dtypes and devices of the recorded call.

torch.fx traces with proxies, so `assert L == H * W`, `if x.size(1) != C:` or
`for t in range(x.size(0)):` stop a trace ("control flow on a traced value"), although the
capture is of one call whose shapes are known.  `ShapeFacts.value(node)` evaluates a traced
value from the recorded call's arguments when it depends on nothing but their metadata (shape,
size(), dim(), numel(), ndim, dtype, device, and Python arithmetic on those, of the inputs or
of tensors computed from them, on fake copies, which have shapes and no data); the trace then
takes the branch that call took, as torch.export specializes on static shapes.  A value that
depends on tensor data raises DataDependent, and the trace is refused as before.
"""
from __future__ import annotations

import builtins
import contextlib
import inspect
import operator

META_ATTRS = {"shape", "ndim", "dtype", "device", "is_cuda", "is_floating_point"}
META_METHODS = {"size", "dim", "numel", "is_floating_point", "is_contiguous"}
_PURE = {getattr(operator, n) for n in ("add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "neg", "eq",
                                        "ne", "lt", "le", "gt", "ge", "not_", "and_", "or_", "getitem", "index")}
_PURE |= {builtins.len, builtins.int, builtins.float, builtins.min, builtins.max, builtins.abs}


class DataDependent(Exception):
    """The value depends on tensor data (or on something this module does not evaluate)."""


class ShapeFacts:
    def __init__(self, root, args: list):
        self.root = root
        names = [p.name for p in inspect.signature(root.forward).parameters.values()
                 if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        self.placeholders = dict(zip(names, args))
        self._memo: dict = {}
        self.quiet = contextlib.nullcontext   # the tracer's: submodules run as plain calls meanwhile

    def value(self, node):
        """The node's (non-tensor) value in the recorded call, or DataDependent."""
        import torch
        v = self._value(node)
        if isinstance(v, torch.Tensor):
            raise DataDependent(node.name)
        return v

    def _value(self, node):
        if node not in self._memo:
            try:
                with self.quiet():
                    self._memo[node] = self._evaluate(node)
            except DataDependent:
                raise
            except Exception as e:   # an op that needs data (fake tensors refuse), or fails here
                raise DataDependent(f"{node.name}: {type(e).__name__}") from None
        return self._memo[node]

    def _arg(self, a):
        import torch.fx as fx
        if isinstance(a, fx.Node):
            return self._value(a)
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        if isinstance(a, slice):
            return slice(self._arg(a.start), self._arg(a.stop), self._arg(a.step))
        return a

    def _evaluate(self, node):
        import torch
        if node.op == "placeholder":
            if node.target not in self.placeholders:
                raise DataDependent(node.name)
            return self.placeholders[node.target]
        if node.op == "get_attr":   # read without getattr: while tracing, fx hands out proxies for these
            prefix, _, name = node.target.rpartition(".")
            owner = self.root.get_submodule(prefix) if prefix else self.root
            for table in (owner._parameters, owner._buffers, vars(owner)):
                if table.get(name) is not None:
                    return table[name]
            raise DataDependent(node.name)
        args = [self._arg(a) for a in node.args]
        kwargs = {k: self._arg(v) for k, v in node.kwargs.items()}
        if node.op == "call_function" and node.target is builtins.getattr and len(args) == 2 \
                and args[1] in META_ATTRS and isinstance(args[0], torch.Tensor):
            return getattr(args[0], args[1])
        if node.op == "call_method" and node.target in META_METHODS and isinstance(args[0], torch.Tensor):
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        from torch.utils._pytree import tree_leaves, tree_map
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]   # torch.cat((a, b))
        if node.op == "call_function" and node.target in _PURE and not tensors:
            return node.target(*args, **kwargs)
        mode = _fake_mode(tensors)
        if mode is not None and node.op in ("call_function", "call_method", "call_module"):
            # on fake copies only: no data goes into the value, and an in-place op (a BatchNorm's
            # running statistics) changes no real tensor of the model
            fake = lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) and not _fake(t) else t  # noqa: E731
            args, kwargs = tree_map(fake, (args, kwargs))
            if node.op == "call_function":
                return node.target(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            sub = self.root.get_submodule(node.target)
            state = {n: fake(t) for n, t in [*sub.named_parameters(), *sub.named_buffers()]}
            return torch.func.functional_call(sub, state, tuple(args), kwargs)
        raise DataDependent(node.name)


def _fake_mode(tensors: list):
    """The FakeTensorMode of the capture (none when it runs on real tensors: then nothing is run)."""
    from torch._guards import detect_fake_mode
    return next((t.fake_mode for t in tensors if _fake(t)), None) or detect_fake_mode()


def _fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor)
