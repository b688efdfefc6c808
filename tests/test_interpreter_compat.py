"""Rendered kernels run in Triton 3.6's interpreter under NumPy >= 2.4, whatever Triton runs the tests.

That interpreter turns a scalar used as an index (a range() bound) into an int with int() on a
1-element array, which NumPy >= 2.4 refuses (triton#9171); later interpreters squeeze the array
first, so on them a loop bound left a tensor would pass unnoticed.  The `strict_index` fixture
puts the 3.6 behaviour back, and every loop with run-time bounds the templates write (matmul's
K loop and persistent walk, the elementwise persistent walk, the row families' column chunks and
persistent walk) must run under it.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from mtmc.kernels import catalog
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import check

interpreter = pytest.importorskip("triton.runtime.interpreter")


def _strict_index(self):
    data = self.handle.data
    if data.ndim:  # what int() on a 1-element array does under NumPy >= 2.4
        raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
    return int(data)


@pytest.fixture
def strict_index(monkeypatch):
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        pytest.skip("this Triton's interpreter patches tensors differently")

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _strict_index)

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch)


@triton.jit
def _count_kernel(out_ptr, n):
    total = 0
    for _ in range(0, n):
        total += 1
    tl.store(out_ptr, total)


def test_strict_index_reproduces_the_triton_36_failure(strict_index):
    """Without this the tests below would prove nothing: a bare range() over a kernel
    argument fails under the fixture as it does in Triton 3.6."""
    with pytest.raises(Exception, match="only 0-dimensional arrays"):
        _count_kernel[(1,)](torch.zeros(1, dtype=torch.int32), 3)


def _rows(op, family, M, N, block, persistent):
    cfg = {"BLOCK_N": block, "num_warps": 4, "num_stages": 1, "ROWS_PER_PROG": 2, "PERSISTENT": persistent}
    return KernelSpec(family, op, {"M": M, "N": N}, "float32", {}), cfg


def _matmul(dtype, split, persistent):
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_K": split,
           "PERSISTENT": persistent, "num_warps": 4, "num_stages": 2}
    return KernelSpec("matmul", "matmul", {"M": 20, "N": 24, "K": 70}, dtype, {}), cfg


CASES = {
    "matmul": _matmul("float16", 1, False),
    "matmul-bf16-persistent-split-k": _matmul("bfloat16", 2, True),
    "elementwise-persistent": (KernelSpec("elementwise", "chain", {"M": 9, "N": 500}, "float32",
                                          {"chain": [{"op": "relu"}]}),
                               {"BLOCK": 256, "num_warps": 4, "PERSISTENT": True}),
    "sum-looped": _rows("sum", "reduction", 5, 100, 32, False),
    "argmax-looped-persistent": _rows("argmax", "reduction", 40, 70, 32, True),
    "softmax-looped-persistent": _rows("softmax", "softmax", 40, 70, 32, True),
    "layernorm-looped": _rows("layernorm", "norm", 5, 100, 32, False),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_template_loops_run_in_the_triton_36_interpreter(case, strict_index):
    spec, cfg = CASES[case]
    family = catalog.family_of(spec)
    family.validate(spec)
    result = check(spec, family.render(spec, cfg), family.check_dims(spec, cfg), device="cpu", trials=1)
    assert result.ok, result.reason
