"""Can this process compile Triton kernels for a target, or has the interpreter spoiled it?

Two process-wide states break `triton.compile` after Triton's interpreter has been used:
- triton.language imported while TRITON_INTERPRET=1: Triton's own library functions (tl.sum,
  tl.max, tl.cdiv, ...) were decorated as interpreted functions, and the code generator cannot
  compile a kernel that calls them;
- the interpreter's patches left behind: running a kernel that calls a @jit helper (tl.sum is
  one) patches the helper's module (triton.language.core) through InterpretedFunction.__call__,
  which never restores what it patched (triton/runtime/interpreter.py, 3.6 to 3.9).  Every later
  compile then fails inside the code generator with "'value' object has no attribute 'dtype'".
Neither can be undone in place, so `compile_blocker()` says why, and callers compile in a fresh
child process instead (tools.target_compile does).
"""
from __future__ import annotations

INTERPRETER_MODULE = "triton.runtime.interpreter"


def _patched(value) -> bool:
    """An attribute the interpreter set: one of its functions or a property built from them."""
    if isinstance(value, property):
        value = value.fget
    return getattr(value, "__module__", None) == INTERPRETER_MODULE and callable(value) \
        and type(value).__name__ != "InterpretedFunction"


def _patch_sites() -> list:
    import triton.language as tl
    core = tl.core
    return [tl, core, tl.math, core.tensor, core.dtype, core.condition,
            getattr(core, "tensor_descriptor_base", None)]


def leaked_patches() -> list[str]:
    """Members of triton.language the interpreter replaced and did not restore."""
    found = []
    for site in _patch_sites():
        if site is None:
            continue
        for name, value in list(vars(site).items()):
            if _patched(value):
                found.append(f"{getattr(site, '__name__', site)}.{name}")
    return found


def language_interpreted() -> bool:
    """triton.language was imported with TRITON_INTERPRET=1 (its library is interpreted)."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    return not isinstance(tl.standard.sum, JITFunction)


def compile_blocker() -> str | None:
    """Why this process cannot compile for a target, or None when it can."""
    if language_interpreted():
        return "triton.language was imported under TRITON_INTERPRET=1 in this process"
    leaked = leaked_patches()
    if leaked:
        return (f"Triton's interpreter left {len(leaked)} members of triton.language patched "
                f"(e.g. {', '.join(leaked[:3])})")
    return None
