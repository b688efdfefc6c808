"""The standalone kernel file: kernel, host wrapper, reference, self-check and benchmark.

The file needs only torch and triton.  `python FILE` checks the kernel against the PyTorch
reference on fresh random inputs (in Triton's interpreter on small shapes when there is no GPU)
and, on a GPU, times it against eager and torch.compile.  The checking and input code is the
verifier's own (embedded with inspect), so the file checks exactly what the product checked.
"""
from __future__ import annotations

import inspect
import json
import textwrap

from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.tools import correctness
from mtmc.tools.loader import concrete_init, random_tensor

_HEADER = '''#!/usr/bin/env python3
"""{title}

Written by MTMC Kernel Agent.
{summary}
Run `python {{this file}}`: checks the kernel against PyTorch on fresh random inputs (in Triton's
interpreter on small shapes when no GPU is present) and, on a GPU, times it against PyTorch eager
and torch.compile.  Use it from code as `forward(*inputs)` or `launch(*inputs, out=out)`.
"""
import math
import os

import torch

if not torch.cuda.is_available():  # must be decided before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
'''

_DRIVER = '''
# ---- checking and timing --------------------------------------------------------------------
SPEC = json.loads({spec_json!r})
CONFIG = json.loads({config_json!r})
DIMS = json.loads({dims_json!r})
CHECK_DIMS = json.loads({check_dims_json!r})  # small shapes for Triton's interpreter
INPUTS = json.loads({inputs_json!r})  # name, shape (dim names), dtype, init
OUTPUT = json.loads({output_json!r})
RTOL = {rtol!r}
ATOL_FLOOR = {atol!r}


def _shape(names, dims):
    return tuple(d if isinstance(d, int) else int(dims[d]) for d in names)


{random_tensor_src}

{concrete_init_src}

def make_inputs(dims=None, device="cuda", seed=None):
    dims = dims or DIMS
    gen = torch.Generator(device=device).manual_seed(seed if seed is not None else int.from_bytes(os.urandom(6), "little"))
    return [random_tensor(_shape(a["shape"], dims), a["dtype"], concrete_init(a["init"], dims), gen, device)
            for a in INPUTS]


def forward(*inputs):
    out = torch.empty(_out_shape(inputs), dtype=getattr(torch, OUTPUT["dtype"]), device=inputs[0].device)
    launch(*inputs, out=out)
    return out


def _out_shape(inputs):
    dims = {{}}
    for a, x in zip(INPUTS, inputs):
        for name, size in zip(a["shape"], x.shape):
            if isinstance(name, str):
                dims[name] = int(size)
    for known in (DIMS, CHECK_DIMS):  # sizes only the output has (a conv's OH, OW) come from these
        if all(known.get(k) == v for k, v in dims.items()):
            dims = {{**known, **dims}}
            break
    return _shape(OUTPUT["shape"], dims)


{judge_src}

def self_check(trials=3):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dims = DIMS if device == "cuda" else CHECK_DIMS
    for t in range(trials):
        inputs = make_inputs(dims, device)
        before = [x.clone() for x in inputs]
        out = torch.empty(_out_shape(inputs), dtype=getattr(torch, OUTPUT["dtype"]), device=device)
        out.fill_(float("nan") if out.is_floating_point() else torch.iinfo(out.dtype).min)
        launch(*inputs, out=out)
        assert all(torch.equal(x, y) for x, y in zip(inputs, before)), "the kernel modified an input"
        x64 = [x.to(torch.float64) if x.is_floating_point() else x for x in inputs]
        if "compare" in globals():
            ok, reason, max_abs, _ = compare(out, *x64)
        else:
            ref = reference(*x64)
            scale = error_scale(*x64) if "error_scale" in globals() else ref.abs()
            ok, reason, max_abs, _ = judge(SPEC["dtype"], out, ref, scale)
        print(f"check {{t + 1}}/{{trials}} on {{device}} dims={{dims}}: {{'PASS' if ok else 'FAIL'}} ({{reason}}, max abs err {{max_abs:.3g}})")
        if not ok:
            raise SystemExit(1)


def benchmark():
    import triton.testing
    inputs = make_inputs(DIMS, "cuda")
    out = torch.empty(_out_shape(inputs), dtype=getattr(torch, OUTPUT["dtype"]), device="cuda")
    rows = [("triton (this kernel)", lambda: launch(*inputs, out=out)), ("pytorch eager", lambda: reference(*inputs))]
    try:
        compiled = torch.compile(reference)
        compiled(*inputs)
        rows.append(("torch.compile", lambda: compiled(*inputs)))
    except Exception as exc:  # torch.compile may be unavailable; say so instead of failing
        print(f"torch.compile unavailable: {{exc}}")
    for name, fn in rows:
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        print(f"{{name:>22}}: {{ms * 1000:9.2f}} us")


if __name__ == "__main__":
    self_check()
    if torch.cuda.is_available():
        benchmark()
'''


def named_sizes(family, spec: KernelSpec, dims: dict) -> dict:
    """dims plus every size a tensor's shape names that is derived from them (a conv weight's
    "C_in/G"), so the file's _shape can read each shape by its names."""
    sizes = dict(dims)
    for a in [*family.inputs(spec), family.output(spec)]:
        for name, size in zip(a.shape, a.concrete_shape(dims)):
            if isinstance(name, str):
                sizes.setdefault(name, int(size))
    return sizes


def standalone_source(spec: KernelSpec, config: dict, kernel_source: str, summary: str = "") -> str:
    family = family_of(spec)
    inputs = [{"name": a.name, "shape": list(a.shape), "dtype": a.dtype or spec.dtype, "init": a.init}
              for a in family.inputs(spec)]
    out = family.output(spec)
    output = {"shape": list(out.shape), "dtype": out.dtype or spec.dtype}
    header = _HEADER.format(title=family.describe(spec), summary=textwrap.indent(summary.strip(), "") if summary else "")
    driver = _DRIVER.format(
        spec_json=json.dumps(spec.to_dict()), config_json=json.dumps(config),
        dims_json=json.dumps(named_sizes(family, spec, spec.dims)),
        check_dims_json=json.dumps(named_sizes(family, spec, family.check_dims(spec, config))),
        inputs_json=json.dumps(inputs),
        output_json=json.dumps(output), rtol=correctness.RTOL[spec.dtype], atol=correctness.ATOL_FLOOR[spec.dtype],
        random_tensor_src=inspect.getsource(random_tensor),
        concrete_init_src=inspect.getsource(concrete_init), judge_src=inspect.getsource(correctness.judge),
    )
    driver = driver.replace("RTOL[dtype]", "RTOL").replace("ATOL_FLOOR[dtype]", "ATOL_FLOOR")
    return "\n".join([header, "import json\n", kernel_source.strip(), "",
                      "# ---- PyTorch reference ----------------------------------------------------------------",
                      family.reference_source(spec).strip(), driver])
