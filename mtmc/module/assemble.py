"""Write the optimized module file: the upload kept verbatim, the chosen kernels, and ModelNew.

Layout of the file (it needs only torch and triton):
  1. the user's source, unchanged (so Model, get_inputs and get_init_inputs stay as they were);
  2. the interpreter switch (TRITON_INTERPRET=1 when there is no GPU, set before any kernel is
     decorated), then each group's Triton source with its top-level names prefixed per group so
     that two kernels of one family do not clash, and a wrapper per group that views the graph's
     values into the kernel's layout, allocates the output, launches, and views it back;
  3. `class ModelNew(Model)`: the same constructor, parameters and buffers (Model's state_dict
     loads into it), whose forward is torch.fx's own code for the captured graph with every
     group that got a kernel replaced by a call to its wrapper.  Submodules captured on their
     own (when the module above them could not be traced) get their new forward bound to the
     instance in __init__.
"""
from __future__ import annotations

import ast
import io
import keyword
import re
import textwrap
import tokenize

import torch.fx as fx
from torch.fx.node import _get_qualified_name

from mtmc.kernels.catalog import describe, family_of
from mtmc.module import attention_fusion, view_fusion
from mtmc.module.graph_replay import REPLAY_HELPER, forward_source as replay_forward
from mtmc.module.conv_fusion import out_shape_source
from mtmc.module.pool_fusion import out_shape_source as pool_out_shape_source
from mtmc.kernels.spec import CUSTOM_FAMILY, KernelSpec
from mtmc.module.fusion import Group
from mtmc.module.fxjson import rebuild_graph

MARKER = "# ==== MTMC Kernel Agent: generated code below; everything above is the original file ===="

_PRELUDE = '''
import os as _mtmc_os
import types as _mtmc_types

import torch

if not torch.cuda.is_available():  # no GPU: kernels run in Triton's interpreter (set before @jit)
    _mtmc_os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def _mtmc_reduced_shape(shape, dim, keepdim):
    """The shape a reduction over `dim` (an int, a list of dims, None: every dim) leaves."""
    if dim is None:
        return (1,) * len(shape) if keepdim else ()
    dims = dim if isinstance(dim, list) else [dim]
    return tuple(1 if i in dims else s for i, s in enumerate(shape) if keepdim or i not in dims)
''' + view_fusion.SHAPE_HELPER


# -- kernel sources ---------------------------------------------------------------------------

def top_level_names(source: str) -> list[str]:
    """Functions, classes and variables a kernel source defines at module level."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def prefix_names(source: str, prefix: str) -> str:
    """Rename the source's top-level names to prefix + name: every use of them as a name (not
    attributes, keyword arguments, strings or comments), keeping the layout Triton reads."""
    names = set(top_level_names(source))
    lines = source.splitlines(keepends=True)
    edits: dict[int, list[tuple[int, int]]] = {}
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(toks):
        if tok.type != tokenize.NAME or tok.string not in names:
            continue
        prev = toks[i - 1].string if i else ""
        nxt = toks[i + 1].string if i + 1 < len(toks) else ""
        if prev == "." or (nxt == "=" and _in_call(toks, i)):
            continue
        edits.setdefault(tok.start[0], []).append((tok.start[1], tok.end[1]))
    for row, spans in edits.items():
        line = lines[row - 1]
        for start, end in sorted(spans, reverse=True):
            line = line[:start] + prefix + line[start:end] + line[end:]
        lines[row - 1] = line
    return "".join(lines)


def _in_call(toks, i) -> bool:
    """Whether the NAME at i sits inside parentheses (a keyword argument, not an assignment)."""
    depth = 0
    for tok in reversed(toks[:i]):
        if tok.type == tokenize.OP and tok.string in ")]}":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in "([{":
            if depth == 0:
                return True
            depth -= 1
        elif tok.type == tokenize.NEWLINE and depth == 0:
            return False
    return False


_PRELUDE_IMPORTS = {"import torch", "import triton", "import triton.language as tl"}


def _without_prelude_imports(source: str) -> str:
    """A kernel source without the imports the prelude already made (once is enough)."""
    return "".join(line for line in source.splitlines(keepends=True) if line.strip() not in _PRELUDE_IMPORTS)


# -- one wrapper per group ----------------------------------------------------------------------

def _view(v: str, view: dict) -> str:
    kind = view["view"]
    if kind == "rows":
        code = f"{v}.reshape(-1, {v}.shape[-1])"
    elif kind == "strided":  # the kernel reads the [outer, dim, inner] buffer as it lies
        d = view["dim"]   # one dim, or a run of neighbouring dims reduced as one
        size = f"{v}.shape[{d[0]}:{d[-1] + 1}].numel()" if isinstance(d, list) else f"{v}.shape[{d}]"
        code = f"{v}.contiguous().reshape(-1, {size})"
    elif kind == "flat":
        code = f"{v}.reshape(1, -1)"
    elif kind == "channels":  # [N, C, *spatial] as [N, C, S]
        code = f"{v}.reshape({v}.shape[0], {v}.shape[1], -1)"
    elif kind == "trailing":  # the last view["dims"] dims as the rows' one
        code = f"{v}.flatten(-{view['dims']}).flatten(0, -2)"
    elif kind == "periodic":  # a broadcast operand, flat in its own row-major order
        code = f"{v}.contiguous().reshape(-1)"
    elif kind == "vector":
        code = f"{v}.reshape(-1)"
    elif kind == "scalar":   # one value (a 0-d parameter) as [1]: a view, so the kernel reads it live
        code = f"{v}.reshape(1)"
    elif kind == "batched":
        code = f"{v}.reshape(-1, {v}.shape[-2], {v}.shape[-1])"
    elif kind == "as_is":
        code = v
    else:
        raise ValueError(f"unknown view {kind!r}")
    return code + (".contiguous()" if view.get("contiguous") else "")


def wrapper_source(group: Group, launch: str, name: str) -> str:
    """def name(v0, v1, ...): the group's values in, its result (in the node's shape) out."""
    spec = KernelSpec.from_dict(group.spec)
    out_arg = family_of(spec).output(spec)
    out_dtype = f"torch.{out_arg.dtype}" if out_arg.dtype else "v0.dtype"
    params = [f"v{i}" for i in range(len(group.args))]
    body = []
    for g in group.guards:
        body += [f"if v{g['arg']} != {g['value']!r}:",
                 f"    raise ValueError('group {group.id} was built for a value of {g['value']!r} here, got ' + str(v{g['arg']}))"]
    main = group.inputs[0]
    late = []
    base = "v0"   # the main input in the kernel's shape
    if group.out.get("in_view"):   # read before a view (module.view_fusion): viewed to the kernel's shape
        then, to = group.out["in_view"]
        body.append(f"g0 = v0.reshape(_mtmc_view_shape(v0.shape, {tuple(then)!r}, {tuple(to)!r}))")
        base = "g0"
    for k, inp in enumerate(group.inputs):
        v = base if k == 0 else f"v{inp['arg']}"
        if inp["view"] != "like":
            body.append(f"k{k} = {_view(v, inp)}")
        elif inp["of"] == "main" and inp.get("space"):   # met in another shape: there, then the kernel's
            kshape, there = (tuple(s) for s in inp["space"])
            full = f"{v}.expand(_mtmc_view_shape({base}.shape, {kshape!r}, {there!r})).reshape({base}.shape)"
            body.append(f"k{k} = {_view(full, main)}")
        elif inp["of"] == "main":
            body.append(f"k{k} = {_view(f'{v}.expand({base}.shape)', main)}")
        else:
            late.append(f"k{k} = {v}.expand(shape).reshape(out.shape)")
    kind = group.out["kind"]
    alloc = "dtype={}, device=k0.device".format(out_dtype)
    if kind == "same":
        body += [f"shape = {base}.shape", f"out = torch.empty(k0.shape, {alloc})"]
    elif kind == "reduced":
        body += [f"shape = _mtmc_reduced_shape({base}.shape, {group.out['dim']!r}, {group.out['keepdim']!r})",
                 f"out = torch.empty(k0.shape[0], {alloc})"]
    elif kind in ("matmul", "bmm"):
        n = "k1.shape[-2]" if group.out["b_nk"] else "k1.shape[-1]"
        body += [f"shape = (*v0.shape[:-1], {n})"]
        lead = "k0.shape[0]" if kind == "matmul" else "k0.shape[0], k0.shape[1]"
        body += [f"out = torch.empty(({lead}, shape[-1]), {alloc})"]
    elif kind == "scalar":   # a loss's mean or sum
        body += ["shape = ()", f"out = torch.empty((), {alloc})"]
    elif kind == "conv":
        body += [f"shape = {out_shape_source(group.out, 'k0')}", f"out = torch.empty(shape, {alloc})"]
    elif kind == "pool":
        body += [f"shape = {pool_out_shape_source(group.out, 'k0')}", f"out = torch.empty(shape, {alloc})"]
    elif kind == "attention":
        body += attention_fusion.out_lines(group.out, alloc)
    else:
        raise ValueError(f"unknown output kind {kind!r}")
    body += late
    if group.out.get("view"):   # a pure view after the op, before the tail's steps (module.view_fusion)
        then, to = group.out["view"]
        body.append(f"shape = _mtmc_view_shape(shape, {tuple(then)!r}, {tuple(to)!r})")
    # buffers the kernel updates in place (batch norm's running statistics), as keywords
    kwargs = "".join(f", {k}=v{i}" for k, i in group.out.get("kwargs", {}).items())
    body += [f"{launch}({', '.join(f'k{k}' for k in range(len(group.inputs)))}, out=out{kwargs})",
             "return out.view(shape)"]
    doc = f'"""Group {group.id}: {" -> ".join(group.ops)}."""'
    return f"def {name}({', '.join(params)}):\n" + textwrap.indent("\n".join([doc, *body]), "    ") + "\n"


def custom_wrapper_source(group: Group, prefix: str, name: str) -> str:
    """A custom group's call: the model's ModelNew (made once; its __init__ takes nothing) on the
    group's tensors, as its kernel file defines it (module.custom_groups)."""
    params = ", ".join(f"v{i}" for i in range(len(group.args)))
    return (f"{prefix}impl = {prefix}ModelNew()\n\n\n"
            f"def {name}({params}):\n"
            f'    """Group {group.id}: {" -> ".join(group.ops)} (kernel written by the model)."""\n'
            f"    return {prefix}impl({params})\n")


# -- the rewritten forward ------------------------------------------------------------------------

def _placeholder(group_id: int):
    """A stand-in callable fx can name in the generated code (aliased to the wrapper later)."""
    def stand_in(*args):
        raise RuntimeError("stand-in for a generated wrapper")
    stand_in.__module__ = "mtmc_groups"
    stand_in.__name__ = stand_in.__qualname__ = f"group_{group_id}"
    return stand_in


def rewrite(desc: dict, groups: list[Group]) -> tuple[fx.Graph, dict[str, int]]:
    """The captured graph with each group's nodes replaced by one call; returns the graph and
    {stand-in name: group id}."""
    graph, nodes = rebuild_graph(desc["nodes"])
    had_users = {n.name for n in graph.nodes if n.users}
    stand_ins = {}
    erased: set[str] = set()
    for group in groups:
        # once each: a value read twice by the group (leaky_relu(x) + leaky_relu(x)) is listed twice
        live = list(dict.fromkeys(nodes[n] for n in group.nodes if n not in erased))
        last = max(live, key=_position(graph))
        with graph.inserting_before(last):
            args = [nodes[a["node"]] if "node" in a else graph.get_attr(a["attr"]) for a in group.args]
            fn = _placeholder(group.id)
            call = graph.call_function(fn, tuple(args))
        stand_ins[fn] = group.id
        for r in group.replaces:
            nodes[r].replace_all_uses_with(call)
        for n in sorted(live, key=_position(graph), reverse=True):
            if n.users and n.name not in group.replaces:
                _read_metadata_from(graph, n, call, had_users, desc, group.replaces)
            if not n.users:  # a producer shared with a later group stays until that one
                graph.erase_node(n)
                erased.add(n.name)
        for r in group.replaces:  # later groups that read this value read the call
            nodes[r] = call
    _drop_dead(graph, had_users)
    graph.lint()
    return graph, stand_ins


def _tensor_meta(desc: dict, names: list[str]) -> list[dict]:
    values = {d["name"]: d.get("value") for d in desc["nodes"]}
    return [((values.get(n) or {}).get("tensor") or {}) for n in names]


def _read_metadata_from(graph: fx.Graph, n: fx.Node, call: fx.Node, had_users: set[str], desc: dict,
                        replaced: list[str]) -> None:
    """A group's inner value read only for its metadata (`x.device`, `x.size(0)`: fx_ops.Graph does
    not count those readers as users) stays in the graph while they do, which would run the
    group's ops in PyTorch too: readers left dead by the group go, and the rest read the group's
    output where it has the same metadata they read (the device always; the dtype; the shape),
    moved after it where nothing before that reads them.  A value read for its data stays."""
    from mtmc.module.fx_ops import metadata_reader
    if not all(metadata_reader(m) for m in n.users):
        return
    order = _position(graph)
    for m in sorted({r for r in n.users} | {d for r in n.users for d in _downstream(r)}, key=order, reverse=True):
        if not m.users and m.name in had_users:   # fed only what the group replaced
            graph.erase_node(m)
    readers = list(n.users)
    if not readers:
        return
    inner, *outs = _tensor_meta(desc, [n.name, *replaced])
    if not outs or not inner:
        return
    for m in readers:
        what = metadata_reader(m)
        keys = {"device": (), "is_cuda": (), "dtype": ("dtype",), "is_floating_point": ("dtype",)}.get(
            what, ("shape", "dtype"))
        if any(o.get(k) != inner.get(k) for o in outs for k in keys):
            return
        if order(m) < order(call) and any(order(u) < order(call) for u in _downstream(m)):
            return
    for m in sorted(readers, key=order, reverse=True):
        if order(m) < order(call):
            call.append(m)
        m.replace_input_with(n, call)


def _downstream(n: fx.Node) -> set[fx.Node]:
    seen, todo = set(), list(n.users)
    while todo:
        u = todo.pop()
        if u not in seen:
            seen.add(u)
            todo += list(u.users)
    return seen


def _position(graph: fx.Graph):
    order = {n: i for i, n in enumerate(graph.nodes)}
    return lambda n: order[n]


def _drop_dead(graph: fx.Graph, had_users: set[str]) -> None:
    """Remove what only fed the replaced nodes (sizes, views, parameter reads, and submodule calls:
    an identity a group read past, the layer whose output then fed nothing); nodes that were
    unused in the original stay, so nothing the user wrote changes its side effects.  A submodule
    call left in place ran twice: once in PyTorch for nothing, once in the group's kernel (a
    training-mode BatchNorm then moved its running statistics twice)."""
    changed = True
    while changed:
        changed = False
        for n in reversed(list(graph.nodes)):
            if n.op in ("call_function", "call_method", "get_attr", "call_module") and not n.users \
                    and n.name in had_users:
                graph.erase_node(n)
                changed = True


def _global_lines(used: dict[str, object], stand_ins: dict, wrapper_names: dict[int, str]) -> list[str]:
    """Module-level definitions for the names fx's generated code refers to."""
    lines = []
    for name, obj in used.items():
        if obj in stand_ins:
            lines.append(f"{name} = {wrapper_names[stand_ins[obj]]}")
        elif name in ("torch",):
            continue
        elif name in ("inf", "nan"):
            lines.append(f"from math import {name}")
        elif name == "NoneType":
            lines.append("NoneType = type(None)")
        elif name == "device":
            lines.append("device = torch.device")
        elif name == "fx_pytree":
            lines.append("import torch.fx._pytree as fx_pytree")
        elif name == "pytree":
            lines.append("import torch.utils._pytree as pytree")
        else:
            qual = _get_qualified_name(obj)
            root = qual.split(".")[0]
            lines += ([f"import {root}"] if "." in qual else []) + [f"{name} = {qual}"]
    return lines


def forward_source(graph: fx.Graph, fn_name: str) -> tuple[str, dict]:
    """(`def fn_name(self, ...)` from torch.fx's code generation, the globals it uses)."""
    code = graph.python_code(root_module="self")
    src = code.src[code.src.index("def forward("):]
    src = src.replace("def forward(", f"def {fn_name}(", 1).rstrip() + "\n"
    used = {k: v for k, v in code.globals.items() if re.search(rf"\b{re.escape(k)}\b", src)}
    return src, used


def shape_guard(src: str, desc: dict, original: str) -> str:
    """`src` (an fx forward) that runs `original` (the module's own forward) unless its tensor inputs
    have the shapes of the recorded call: the graph stage made a value from those shapes (a
    constant fill), which inputs of other shapes (another batch) would not match."""
    holders = [n for n in desc["nodes"] if n["op"] == "placeholder"]
    if not holders or any(not str(n["target"]).isidentifier() for n in holders):
        return src
    tensors = [(n["target"], n["value"]["tensor"]["shape"]) for n in holders
               if isinstance(n.get("value"), dict) and "tensor" in n["value"]]
    if not tensors:
        return src
    lines = src.splitlines()
    end = next(i for i, line in enumerate(lines) if line.rstrip().endswith(":"))   # the def's last line
    test = " or ".join(f"tuple({name}.shape) != {tuple(shape)!r}" for name, shape in tensors)
    call = ", ".join(["self", *(n["target"] for n in holders)])
    guard = [f"    if {test}:  # a value below was made for the recorded shapes",
             f"        return {original}({call})"]
    return "\n".join(lines[:end + 1] + guard + lines[end + 1:]) + "\n"


def _ident(path: str) -> str:
    s = re.sub(r"\W", "_", path)
    return s if s.isidentifier() and not keyword.iskeyword(s) else f"m_{s}"


# -- the whole file ---------------------------------------------------------------------------

def assemble(user_source: str, captured: dict, groups: list[Group], kernels: dict[int, dict],
             replay: bool = False) -> str:
    """NEW.py's text.  kernels: group id -> {"source": Triton source with launch(), "config",
    "summary": words for the header comment}; groups without one stay PyTorch.  replay: ModelNew's
    whole forward runs as a replayed CUDA graph on a GPU (module.graph_replay)."""
    chosen = [g for g in groups if g.id in kernels]
    parts = [user_source.rstrip() + "\n", "", MARKER, _PRELUDE + (REPLAY_HELPER if replay else "")]
    wrapper_names = {}
    for g in chosen:
        k = kernels[g.id]
        prefix = f"_mtmc_g{g.id}_"
        header = [f"# ---- group {g.id}: {' -> '.join(g.ops)}", f"# {describe(KernelSpec.from_dict(g.spec))}"]
        if k.get("summary"):
            header += [f"# {line}" for line in k["summary"].splitlines()]
        header += [f"# note: {n}" for n in g.notes]
        parts += ["\n".join(header), prefix_names(_without_prelude_imports(k["source"]), prefix)]
        wrapper_names[g.id] = f"_mtmc_group_{g.id}"
        parts.append(custom_wrapper_source(g, prefix, wrapper_names[g.id]) if g.family == CUSTOM_FAMILY
                     else wrapper_source(g, prefix + "launch", wrapper_names[g.id]))
    used_globals: dict[str, object] = {}
    stand_ins: dict = {}
    forwards, bound, root_forward, replayed = [], [], None, None
    for desc in captured["graphs"]:
        path = desc.get("path", "")
        mine = [g for g in chosen if g.graph == path]
        if not mine and not desc.get("rewritten"):   # a graph the graph stage rewrote is written even without kernels
            continue
        graph, made = rewrite(desc, mine)
        stand_ins.update(made)
        fn = f"_mtmc_forward_{_ident(path)}" if path else ("_mtmc_forward_root" if replay else "forward")
        src, used = forward_source(graph, fn)
        if desc.get("shapes_fixed"):
            src = shape_guard(src, desc, "Model.forward" if not path else "type(self).forward")
        for name, obj in used.items():
            used_globals.setdefault(name, obj)
        if path:
            forwards.append(src)
            bound.append((path, fn))
        elif replay:   # a module-level function the replaying forward calls
            forwards.append(src)
            replayed = fn
        else:
            root_forward = src
    if replay:
        root_forward = replay_forward(replayed if replayed else "Model.forward")
    parts += ["\n".join(_global_lines(used_globals, stand_ins, wrapper_names)), *forwards]
    parts.append(_model_new(root_forward, bound, len(chosen)))
    return "\n\n\n".join(p.strip("\n") for p in parts if p.strip()) + "\n"


def _model_new(root_forward: str | None, bound: list[tuple[str, str]], n_kernels: int) -> str:
    lines = ["class ModelNew(Model):",
             f'    """Model with {n_kernels} fused Triton kernel(s) in its forward (MTMC Kernel Agent).',
             "",
             "    Same constructor, parameters and buffers as Model, so Model's state_dict loads into it.",
             '    Inference only: the kernels have no backward."""']
    if bound:
        lines += ["", "    def __init__(self, *args, **kwargs):",
                  "        super().__init__(*args, **kwargs)",
                  "        # submodules captured on their own run their new forward in place of the old"]
        for path, fn in bound:
            lines += [f"        _mtmc_sub = self.get_submodule({path!r})",
                      f"        _mtmc_sub.forward = _mtmc_types.MethodType({fn}, _mtmc_sub)"]
    if root_forward:
        lines += ["", textwrap.indent(root_forward.rstrip(), "    ")]
    if not bound and not root_forward:
        lines += ["", "    pass"]
    return "\n".join(lines) + "\n"
