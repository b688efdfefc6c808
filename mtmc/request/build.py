"""From what was read to a KernelSpec: which op the request is, the sizes each family needs, and
one builder per family."""
from __future__ import annotations

import math

from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels import pointwise
from mtmc.kernels.spec import KernelSpec
from mtmc.request.reading import (
    DEFAULT_BMM, DEFAULT_SIZE, _AFTER, _BOUNDARY, _Ctx, _Fail, _Item, _SEQ, _SIZE_NAMES, _rx,
)
from mtmc.request.words import GATE, _check_axis, _did_you_mean, _unread_words, symbolic_axis


# -- choosing the op --------------------------------------------------------------------------

def _decide(ctx: _Ctx) -> tuple[str, str]:
    cores = [it for it in ctx.items if it.is_core]
    if not cores:
        if any(not it.is_core for it in ctx.items):
            return "elementwise", "chain"
        raise _Fail("I found no kernel op in this request." + _did_you_mean(_unread_words(ctx.s)))
    families = sorted({c.family for c in cores})
    if len(families) > 1:
        named = ", ".join(sorted({f"'{c.words}' ({c.family})" for c in cores}))
        raise _Fail(f"the request names ops of different kinds: {named}. I write one kernel per request; "
                    "ask for them one at a time.")
    family = families[0]
    ops = {c.op for c in cores if c.op}
    if family == "matmul":
        return family, "bmm" if "bmm" in ops else "matmul"
    if not ops:
        raise _Fail(f"which {family}? I can write: {', '.join(FAMILY_OPS[family])}.")
    if len(ops) > 1:
        raise _Fail(f"the request names {' and '.join(sorted(ops))}; one kernel computes one of them.")
    return family, ops.pop()


def _ordered(ctx: _Ctx) -> list[_Item]:
    """Items in the order they apply: text order, except that "A after B" and "A of (the) B" put
    B first ("sqrt of the sum of squares": squares, sum, sqrt).  Clauses are cut at "then",
    commas, ...; a run of "after" clauses is reversed."""
    items = sorted(ctx.items, key=lambda it: it.pos)
    marks = sorted([(m.start(), "after") for m in _rx(_AFTER).finditer(ctx.norm)]
                   + [(m.start(), "seq") for m in _rx(_BOUNDARY).finditer(ctx.norm)]
                   + [(m.start(), "after") for it in items
                      if (m := _rx(_OF_ITEM).search(ctx.norm[:int(it.pos)])) is not None])
    clauses: list[tuple[str, list[_Item]]] = [("seq", [])]
    k = 0
    for item in items:
        while k < len(marks) and marks[k][0] <= item.pos:
            if clauses[-1][1]:
                clauses.append((marks[k][1], []))
            else:   # no item since the last mark: the latest mark says how the next clause joins
                clauses[-1] = (marks[k][1] if len(clauses) > 1 else "seq", [])
            k += 1
        clauses[-1][1].append(item)
    out, run = [], []
    for kind, clause in clauses:
        if kind != "after" and run:
            out.extend(it for c in reversed(run) for it in c)
            run = []
        run.append(clause)
    out.extend(it for c in reversed(run) for it in c)
    return out


_OF_ITEM = r"\bof\s+(?:the\s+|an?\s+|its\s+)?$"   # "A of the B": B's words start right after


def _around_core(ctx: _Ctx) -> tuple[_Item, list[_Item], list[_Item]]:
    """The core item, the steps applied before it and the steps applied after it."""
    order = _ordered(ctx)
    core_at = next(i for i, it in enumerate(order) if it.is_core)
    steps = [(i, it) for i, it in enumerate(order) if not it.is_core]
    pre = [it for i, it in steps if i < core_at or it.pre]
    post = [it for i, it in steps if i > core_at and not it.pre]
    return order[core_at], pre, post


def _binds_to_input(ctx: _Ctx, core: _Item, step: _Item) -> bool:
    """"layernorm of x plus a residual", "sum of squares": a step said right after the core,
    with no "then"/"followed by" between, describes the core's input."""
    if step.formula or step.pos < core.pos:   # "sqrt of the sum": said before the core, applied after it
        return False
    return not _rx(_SEQ).search(ctx.norm[core.end:int(step.pos)])


# -- sizes for each family --------------------------------------------------------------------

def _use(ctx: _Ctx, *keys: str) -> None:
    ctx.flags.update(f"used_{k}" for k in keys)


def _check_sizes_used(ctx: _Ctx, family: str) -> None:
    unused = [k for k in ctx.sizes if f"used_{k}" not in ctx.flags]
    if unused:
        found = ", ".join(f"{_SIZE_NAMES[k]} {ctx.sizes[k]}" for k in unused)
        raise _Fail(f"I found {found}, which a {family} kernel has no use for.")


def _row_words(ctx: _Ctx) -> int | None:
    """Rows from words: "8192 rows", or batch x sequence length."""
    parts = [ctx.sizes[k] for k in ("rows", "batch", "seq") if k in ctx.sizes]
    _use(ctx, "rows", "batch", "seq")
    if len(parts) > 1:
        ctx.note("context", "rows = " + " x ".join(map(str, parts)))
    return math.prod(parts) if parts else None


def _one_shape(ctx: _Ctx) -> list[int] | None:
    """The shape of a one-tensor op; a second shape may only repeat it, or be the [N] of a bias
    or of a norm's weight."""
    if not ctx.shapes:
        return None
    main = max(ctx.shapes, key=len)
    vector_ok = _has_vector(ctx) or ctx.understood.get("family") == "norm"
    for s in ctx.shapes:
        if s != main and not (vector_ok and s == main[-1:]):
            raise _Fail(f"I found several shapes ({', '.join(map(_x, ctx.shapes))}); this kernel works on "
                        "one shape (only a bias [N] may accompany an [..., N] tensor).")
    return main


def _has_vector(ctx: _Ctx) -> bool:
    return any(it.step and it.step["op"] == "bias" for it in ctx.items)


def _row_dims(ctx: _Ctx) -> tuple[int, int, list[int]]:
    """(M, N, shape) of a row op or elementwise chain: leading dims multiply into M."""
    shape = _one_shape(ctx)
    batch_only = "batch" in ctx.sizes and not {"rows", "seq"} & set(ctx.sizes)
    rows, cols = _row_words(ctx), ctx.sizes.get("cols")
    if shape and batch_only and rows != math.prod(shape[:-1]):
        # "relu on a batch of 8 64x64 matrices": the batch is a leading dim of the shape said
        # (it was taken as the row count and refused against the shape's 64 rows)
        ctx.assume(f"batch {rows} read as a leading dim: {_x([rows, *shape])}")
        shape = [rows, *shape]
        rows = math.prod(shape[:-1])
    rows = _agree(ctx, "M", rows, "the number of rows")
    cols = _agree(ctx, "N", cols, "the row width")
    _use(ctx, "cols", "M", "N")
    if shape:
        m, n = math.prod(shape[:-1]), shape[-1]
        for given, got, what in ((rows, m, "rows"), (cols, n, "width")):
            if given is not None and given != got:
                raise _Fail(f"the shape {_x(shape)} has {got} {what}, but the request also says {given}.")
        if len(shape) > 2:
            ctx.note("context", f"leading dims {'x'.join(map(str, shape[:-1]))} flattened into M={m} rows")
        return m, n, shape
    if rows is None and cols is None:
        ctx.assume(f"no shape given: using {DEFAULT_SIZE}x{DEFAULT_SIZE}")
    elif rows is None:
        ctx.assume(f"no row count given: using M={DEFAULT_SIZE} rows")
    elif cols is None:
        ctx.assume(f"no row width given: using N={DEFAULT_SIZE} columns")
    m, n = rows or DEFAULT_SIZE, cols or DEFAULT_SIZE
    return m, n, [m, n]


def _agree(ctx: _Ctx, named: str, value: int | None, what: str) -> int | None:
    other = ctx.sizes.get(named)
    if value is not None and other is not None and value != other:
        raise _Fail(f"{what} is given twice: {named}={other} and {value}.")
    return value if value is not None else other


def _dtype(ctx: _Ctx) -> str:
    if ctx.dtype is None:
        ctx.assume("no dtype given: using float32")
        return "float32"
    return ctx.dtype


def _values(ctx: _Ctx, family: str, *allowed: str) -> dict[str, float]:
    extra = sorted(set(ctx.values) - set(allowed))
    if extra:
        owner = "layernorm/rmsnorm" if extra[0] == "eps" else "softmax"
        raise _Fail(f"{extra[0]} is not a parameter of a {family} kernel (it belongs to {owner}).")
    return {k: ctx.values[k] for k in allowed if k in ctx.values}


# -- the families -----------------------------------------------------------------------------

def _row_spec(ctx: _Ctx, family: str, op: str, params: dict) -> KernelSpec:
    m, n, shape = _row_dims(ctx)
    k = _trailing_run(ctx, len(shape)) if family in ("norm", "softmax") else None
    if k:   # a norm or softmax over the last k dims is one over them flattened into a row
        m, n = math.prod(shape[:-k]), math.prod(shape[-k:])
        ctx.assume(f"{op} over the last {k} dims ({_x(shape[-k:])}) computed over each row of N={n}, "
                   "those dims flattened")
    else:
        _check_axis(ctx, len(shape), op)
    return KernelSpec(family, op, {"M": m, "N": n}, _dtype(ctx), params)


def _trailing_run(ctx: _Ctx, ndim: int) -> int | None:
    """k when the request's axis is the last k >= 2 dims ("the last two dims", "dims 2 and 3" of a 4-d)."""
    d = symbolic_axis(ctx, ndim)
    if isinstance(d, list) and len(d) >= 2 and d == list(range(ndim - len(d), ndim)):
        return len(d)
    return None


def _steps(items: list[_Item], gate_ok: bool = False) -> list[dict]:
    """The items' steps; "multiply by the input" makes the steps said before it one fork step
    x * f(x) (an elementwise chain of the input only: `gate_ok`)."""
    steps = [dict(it.step) for it in items]
    gates = [i for i, st in enumerate(steps) if st["op"] == GATE]
    if not gates:
        return steps
    i = gates[0]
    if not gate_ok:
        raise _Fail("'multiply by the input' (x * f(x)) gates an elementwise chain of the input only; here "
                    "the value before it is not the input. Write the formula, e.g. 'y * gelu(y)'.")
    if len(gates) > 1 or i == 0 or pointwise.operands(steps[:i]):
        raise _Fail("'multiply by the input' takes one run of steps on the input alone before it "
                    "(e.g. 'sigmoid then multiply by the input', x * sigmoid(x)); write the formula otherwise.")
    return [{"op": "fork", "binop": "mul", "left": [], "right": steps[:i]}] + steps[i + 1:]


def _build_softmax(ctx: _Ctx, op: str) -> KernelSpec:
    core, pre, post = _around_core(ctx)
    values = _values(ctx, "softmax", "temperature")
    # "softmax of x scaled by 0.125": a scale said right after the softmax scales its input.
    bound = [it for it in post if it.step["op"] == "scale" and _binds_to_input(ctx, core, it)]
    post = [it for it in post if it not in bound]
    pre = pre + bound
    scales = [it.step["value"] for it in pre if it.step["op"] == "scale"]
    if "temperature" in values:
        if values["temperature"] == 0:
            raise _Fail("a temperature of 0 divides by zero.")
        scales.append(1.0 / values["temperature"])
    params: dict = {}
    if len(scales) > 1:
        raise _Fail(f"the request gives more than one scale ({', '.join(f'{v:g}' for v in scales)}); say one.")
    if scales and len(pre) == len(scales) - ("temperature" in values):
        params["scale"] = scales[0]           # "scaled softmax with scale 0.125", "softmax(x / 8)"
    elif pre:
        if "temperature" in values:
            raise _Fail("a temperature together with other ops before the softmax is ambiguous; write the "
                        "ops as a formula, e.g. 'softmax(relu(x) * 0.5)'.")
        params["prologue"] = _steps(pre)      # "softmax(relu(x) * 0.5)"
    if "scaled_softmax" in ctx.flags and "scale" not in params:
        raise _Fail("'scaled softmax' needs the scale, e.g. 'scaled softmax with scale 0.125'.")
    if post:
        params["epilogue"] = _steps(post)
    return _row_spec(ctx, "softmax", op, params)


def _build_reduction(ctx: _Ctx, op: str) -> KernelSpec:
    core, pre, post = _around_core(ctx)
    _values(ctx, "reduction")
    loose = [it for it in post if not _binds_to_input(ctx, core, it)]
    epilogue = _steps(loose)   # after the result: steps without another tensor ("then scale by 0.5")
    if any(pointwise.operand_kind(s) for s in epilogue) or (epilogue and op in ("argmax", "argmin")):
        raise _Fail(f"a reduction kernel takes only steps without another tensor after it ('{loose[0].words}' "
                    f"comes after the {op}), and none after an index; ops on its input are fine, e.g. 'sum of squares'.")
    chain = _steps([it for it in pre + post if it not in loose])
    if ctx.reduce_dim is None:
        ctx.assume(f"no axis given: {op} over the last dim (one result per row), not over all elements")
    params = {**({"prologue": chain} if chain else {}), **({"epilogue": epilogue} if epilogue else {}),
              **variance_params(ctx, op)}
    return _row_spec(ctx, "reduction", op, params)


def variance_params(ctx: _Ctx, op: str) -> dict:
    """A var's correction where the words say "population" (torch's default, 1, needs none)."""
    return {"correction": 0} if op == "var" and "population" in ctx.flags else {}


def _build_norm(ctx: _Ctx, op: str) -> KernelSpec:
    core, pre, post = _around_core(ctx)
    params: dict = _values(ctx, "norm", "eps")
    # "layernorm of x plus a residual": an add right after the norm words is its input.
    bound = [it for it in post if it.step["op"] in ("residual", "add") and _binds_to_input(ctx, core, it)]
    prologue = _steps(pre + bound)
    epilogue = _steps([it for it in post if it not in bound])
    if "eps" in params and params["eps"] <= 0:
        raise _Fail(f"eps must be positive, got {params['eps']:g}.")
    if prologue:
        params["prologue"] = prologue
    if epilogue:
        params["epilogue"] = epilogue
    if "no_affine" in ctx.flags:
        params["affine"] = False
    if op == "layernorm" and "no_bias" in ctx.flags and "no_affine" not in ctx.flags:
        params["bias"] = False               # the weight stays: nn.LayerNorm(N, bias=False)
    if op == "rmsnorm" and "norm_bias" in ctx.flags:
        raise _Fail("there is no bias in rmsnorm, only a weight; for a bias added after it, say "
                    "'rmsnorm then add a bias'.")
    return _row_spec(ctx, "norm", op, params)


def _build_elementwise(ctx: _Ctx, op: str) -> KernelSpec:
    _values(ctx, "elementwise")
    chain = _steps(_ordered(ctx), gate_ok=True)
    _image_batch(ctx)
    m, n, shape = _row_dims(ctx)
    params: dict = {"chain": chain}
    if len(shape) != 2:
        params["shape"] = shape
    return KernelSpec("elementwise", "chain", {"M": m, "N": n}, _dtype(ctx), params)


def _image_batch(ctx: _Ctx) -> None:
    """"batch 16, 64 channels, 128x128 images": one N x C x spatial tensor said in words (the batch
    was read as rows and refused against the image shape)."""
    if not ("batch" in ctx.sizes and "channels" in ctx.sizes and len(ctx.shapes) == 1 and len(ctx.shapes[0]) <= 3):
        return
    b, c, x = ctx.sizes.pop("batch"), ctx.sizes.pop("channels"), ctx.shapes[0]
    ctx.shapes = [[b, *x] if x[0] == c and len(x) > 1 else [b, c, *x]]


def _build_matmul(ctx: _Ctx, op: str) -> KernelSpec:
    _values(ctx, "matmul")
    nk = "nk" in ctx.flags
    dims = _matmul_dims(ctx, op, nk)
    _use(ctx, "M", "N", "K", "B")
    params: dict = {}
    epilogue = _steps([it for it in _ordered(ctx) if not it.is_core])
    if epilogue:
        params["epilogue"] = epilogue
    if nk:
        params["b_layout"] = "nk"
    return KernelSpec("matmul", "bmm" if "B" in dims else "matmul", dims, _dtype(ctx), params)


def _matmul_dims(ctx: _Ctx, op: str, nk: bool) -> dict[str, int]:
    if "outer" in ctx.flags:
        return _outer_dims(ctx)
    named = {k: ctx.sizes[k] for k in ("B", "M", "N", "K") if k in ctx.sizes}
    if named:
        if not {"M", "N", "K"} <= set(named):
            missing = ", ".join(k for k in "MNK" if k not in named)
            raise _Fail(f"the matmul sizes are incomplete: {missing} missing (give M, N and K).")
        if ctx.shapes:
            _same(_shape_dims(ctx, op, nk), named)
        return _with_batch(ctx, op, named)
    if "in_features" in ctx.sizes or "out_features" in ctx.sizes:
        return _linear_dims(ctx)
    if ctx.shapes:
        return _with_batch(ctx, op, _shape_dims(ctx, op, nk))
    _use(ctx, "rows", "batch", "seq", "cols")
    if ctx.sizes:
        raise _Fail("I could not get the matmul sizes from this; give both shapes ('4096x4096 by 4096x1024') "
                    "or M=.. N=.. K=..")
    default = dict(DEFAULT_BMM) if op == "bmm" else {"M": DEFAULT_SIZE, "N": DEFAULT_SIZE, "K": DEFAULT_SIZE}
    ctx.assume("no shape given: using " + ", ".join(f"{k}={v}" for k, v in default.items()))
    return default


def _outer_dims(ctx: _Ctx) -> dict[str, int]:
    """An outer product of vectors a [M] and b [N]: the matmul [M, 1] x [1, N] ("two vectors of
    length 1024": both 1024)."""
    vectors = [s for s in ctx.shapes if len(s) == 1]
    if len(vectors) != len(ctx.shapes) or len(vectors) not in (1, 2):
        raise _Fail("an outer product takes two vectors: give their lengths ('of a 1024 vector and a 512 vector', "
                    "'of two vectors of length 1024').")
    m, n = vectors[0][0], vectors[-1][0]
    ctx.note("context", f"outer product: [{m} x 1] times [1 x {n}]")
    return {"M": m, "N": n, "K": 1}


def _same(from_shapes: dict, named: dict) -> None:
    for k, v in named.items():
        if k in from_shapes and from_shapes[k] != v:
            raise _Fail(f"the shapes give {k}={from_shapes[k]} but the request also says {k}={v}.")


def _with_batch(ctx: _Ctx, op: str, dims: dict) -> dict:
    """A bmm asked for in words takes its batch from "batch 32"; else a stated default."""
    if op != "bmm" and "batch" in ctx.sizes and len(ctx.shapes) == 2 and all(len(s) == 2 for s in ctx.shapes) \
            and ctx.sizes["batch"] != dims["M"]:   # (a batch equal to M counts x's rows)
        op = "bmm"   # "matrix multiply 8 batches of 64x128 by 128x32": the batch count makes it batched
    if op != "bmm" or "B" in dims:
        return dims
    if "batch" in ctx.sizes:
        _use(ctx, "batch")
        return {"B": ctx.sizes["batch"], **dims}
    ctx.assume(f"no batch size given for the batched matmul: using B={DEFAULT_BMM['B']}")
    return {"B": DEFAULT_BMM["B"], **dims}


def _shape_dims(ctx: _Ctx, op: str, nk: bool) -> dict[str, int]:
    shapes = [s for s in ctx.shapes if len(s) > 1]
    vectors = [s for s in ctx.shapes if len(s) == 1]     # a bias [N]
    if not shapes:
        raise _Fail(f"a matmul needs its operand shapes; I found only {', '.join(map(_x, vectors))}.")
    if len(shapes) == 1 and len(vectors) == 1 and len(shapes[0]) == 2 and not _has_vector(ctx):
        shapes, vectors = _matrix_vector(ctx, shapes[0], vectors[0]), []
    if len(shapes) == 1:
        shapes = _single_matmul_shape(ctx, shapes[0])
    a, b = shapes[0], shapes[1]
    if len(a) < 2 or len(b) < 2 or len(b) > 3:
        raise _Fail(f"a matmul needs 2-d (or batched 3-d) operands; got {_x(a)} and {_x(b)}.")
    dims = _pair_dims(ctx, a, b, nk)
    if vectors and not _has_vector(ctx):
        raise _Fail(f"I found a vector of size {vectors[0][0]} beside two matrices, and there is no bias to give "
                    "it to.")
    if any(v != [dims["N"]] for v in vectors):
        raise _Fail(f"a bias of size {vectors[0][0]} does not fit the matmul output width N={dims['N']}.")
    out = [*([dims["B"]] if "B" in dims else []), dims["M"], dims["N"]]
    for extra in shapes[2:]:
        if extra != out and extra != a[:-1] + [dims["N"]]:
            raise _Fail(f"I found a third shape {_x(extra)} that is not the result {_x(out)}; give the two "
                        "operand shapes.")
    return dims


def _matrix_vector(ctx: _Ctx, matrix: list[int], vector: list[int]) -> list[list[int]]:
    """A matrix and a vector with no bias to be: the vector as the one-column matrix it fits
    (M x K times K), else as a one-row one (K times K x N), as torch.matmul treats it."""
    if vector == matrix[-1:]:
        ctx.assume(f"the vector of {vector[0]} read as a {vector[0]}x1 matrix (a matrix-vector product, N=1)")
        return [matrix, [vector[0], 1]]
    if vector == matrix[:1]:
        ctx.assume(f"the vector of {vector[0]} read as a 1x{vector[0]} matrix (a vector-matrix product, M=1)")
        return [[1, vector[0]], matrix]
    raise _Fail(f"a vector of {vector[0]} fits neither side of the {_x(matrix)} matrix.")


def _single_matmul_shape(ctx: _Ctx, shape: list[int]) -> list[list[int]]:
    """One shape for a matmul: only a square one (or "two NxN matrices", "4096x4096x4096") says
    both operands."""
    if "matvec" in ctx.flags and len(shape) == 2:
        ctx.assume(f"a matrix-vector product: {_x(shape)} times a vector of {shape[1]} (N=1)")
        return [shape, [shape[1], 1]]
    if len(shape) == 3 and len(set(shape)) == 1:
        ctx.assume(f"{_x(shape)} read as M=N=K={shape[0]}")
        return [shape[:2], shape[:2]]
    if len(shape) == 2 and (shape[0] == shape[1] or "square" in ctx.flags):
        if shape[0] != shape[1]:
            raise _Fail(f"a 'square' matmul with the non-square shape {_x(shape)} is contradictory.")
        ctx.assume(f"one shape {_x(shape)} given: multiplying two {_x(shape)} matrices")
        return [shape, shape]
    raise _Fail(f"I found one shape ({_x(shape)}) but a matmul needs both operands: say e.g. "
                f"'{_x(shape)} by {shape[-1]}x1024', or M=.. N=.. K=..")


def _pair_dims(ctx: _Ctx, a: list[int], b: list[int], nk: bool) -> dict[str, int]:
    batch = {}
    if len(b) == 3:
        if len(a) != 3 or a[0] != b[0]:
            raise _Fail(f"the batched operands {_x(a)} and {_x(b)} must have the same batch size.")
        batch = {"B": a[0]}
        a, b = a[1:], b[1:]
    elif len(a) > 2:
        ctx.note("context", f"leading dims {_x(a[:-1])} of {_x(a)} flattened into M={math.prod(a[:-1])}")
    m, k = math.prod(a[:-1]), a[-1]
    if nk and b[1] == k:
        n = b[0]                                   # W is [N, K], as nn.Linear stores it
    elif b[0] == k:
        n = b[1]
        if nk and b[1] != k:
            ctx.assume(f"the second shape {_x(b)} is read as K x N (its first dim matches K={k})")
    else:
        want = "last (or first)" if nk else "first"
        raise _Fail(f"the inner dimensions do not agree: {_x(a)} times {_x(b)} needs the {want} dim of the "
                    f"second operand to equal {k}.")
    return {**batch, "M": m, "N": n, "K": k}


def _linear_dims(ctx: _Ctx) -> dict[str, int]:
    """A linear layer: K in, N out; M from the input shape, the token count or a default."""
    k, n = ctx.sizes.get("in_features"), ctx.sizes.get("out_features")
    _use(ctx, "in_features", "out_features")
    if k is None or n is None:
        raise _Fail("a linear layer needs both its input and output features "
                    "('with 4096 inputs and 11008 outputs', nn.Linear(4096, 11008)).")
    rows = _row_words(ctx)
    if sum(len(s) > 1 for s in ctx.shapes) > 1:     # the input and the weight
        dims = _shape_dims(ctx, "matmul", True)
        if (dims["K"], dims["N"]) != (k, n):
            raise _Fail(f"the shapes give K={dims['K']}, N={dims['N']} but the layer is {k} -> {n} features.")
        return dims
    if ctx.shapes:
        x = _one_shape(ctx)
        if x[-1] != k:
            raise _Fail(f"the input {_x(x)} has last dim {x[-1]} but the layer takes {k} input features.")
        m = math.prod(x[:-1])
        if rows is not None and rows != m:
            raise _Fail(f"the input {_x(x)} has {m} rows but the request also says {rows}.")
        return {"M": m, "N": n, "K": k}
    if rows is None:
        ctx.assume(f"no token count given: using M={DEFAULT_SIZE} rows")
    return {"M": rows or DEFAULT_SIZE, "N": n, "K": k}


def _x(shape: list[int]) -> str:
    return "x".join(map(str, shape))


_BUILDERS = {"softmax": _build_softmax, "reduction": _build_reduction, "norm": _build_norm,
             "elementwise": _build_elementwise, "matmul": _build_matmul}
