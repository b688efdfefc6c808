"""The contract every op family implements, and the generic pieces they share.

A family turns a KernelSpec plus a config (the knobs the macro actions turn) into:
  * the inputs it takes (`inputs`) and the output it writes (`output`), described by dim names;
  * PyTorch reference source (`reference_source`): `def reference(*inputs)`; the verifier runs it
    on float64 copies for the ground truth and on the native inputs for eager / torch.compile;
  * Triton source (`render`): one or more `@triton.jit` kernels and `def launch(*inputs, out)`,
    a host wrapper that reads every size from the tensors it gets (so one source serves the
    real shape on a GPU and small shapes in the interpreter) and writes into `out`;
  * the config space (legal values of each knob, in increasing order) and a default config;
  * the least work it can do (`work`: flops and bytes) for the roofline;
  * small dims for interpreter checks (`check_dims`) that still cover tails and several tiles.

Everything a family returns is source text or plain data, so the same pieces build the
standalone artifact, run in the verifier's child process and travel through the graph state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mtmc.kernels.spec import KernelSpec
from mtmc.tools.correctness import concrete_shape


@dataclass(frozen=True)
class TensorArg:
    """One tensor the kernel reads or writes.

    shape: dim names of spec.dims (or ints). dtype: None means the spec's dtype.
    init:  how fresh random inputs are drawn: "randn" (normal), "uniform" (U(-1, 1)),
           "positive" (U(0.5, 1.5), e.g. norm weights), "mask" (True with probability 1/2,
           for boolean masks).
    groups: a "NAME/G" entry of shape is NAME's size over this many groups (a grouped conv's weight).
    """

    name: str
    shape: tuple
    dtype: str | None = None
    init: str = "randn"
    groups: int = 1

    def concrete_shape(self, dims: dict[str, int]) -> tuple[int, ...]:
        return concrete_shape(self.shape, dims, self.groups)


class Family:
    """Base class; subclasses are singletons registered in kernels.catalog."""

    name: str = ""
    ops: tuple[str, ...] = ()

    # -- what is computed ---------------------------------------------------------------
    def describe(self, spec: KernelSpec) -> str:
        dims = " x ".join(f"{k}={v}" for k, v in spec.dims.items())
        return f"{spec.op} ({self.name}) {dims} {spec.dtype}"

    def validate(self, spec: KernelSpec) -> None:
        """Raise ValueError with a plain-words reason when the spec is not servable."""
        if spec.op not in self.ops:
            raise ValueError(f"{self.name} family has no op {spec.op!r}; it has {', '.join(self.ops)}")

    def inputs(self, spec: KernelSpec) -> list[TensorArg]:
        raise NotImplementedError

    def output(self, spec: KernelSpec) -> TensorArg:
        raise NotImplementedError

    def reference_source(self, spec: KernelSpec) -> str:
        """Source defining `reference(*inputs)` with torch ops only; may also define
        `error_scale(*inputs)` (float64, broadcastable to the output) giving the magnitude the
        error is judged against (e.g. |A| @ |B| for a matmul); the default is |reference|."""
        raise NotImplementedError

    # -- how it is computed -------------------------------------------------------------
    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        raise NotImplementedError

    def default_config(self, spec: KernelSpec, hw) -> dict:
        raise NotImplementedError

    def render(self, spec: KernelSpec, config: dict) -> str:
        raise NotImplementedError

    # -- cost and checking --------------------------------------------------------------
    def tensor_bytes(self, spec: KernelSpec) -> int:
        """Bytes of the kernel's inputs and its output at the spec's full size: what must fit
        in the GPU's memory at once."""
        args = [*self.inputs(spec), self.output(spec)]
        return sum(math.prod(a.concrete_shape(spec.dims)) * DTYPE_BYTES[a.dtype or spec.dtype] for a in args)

    def work(self, spec: KernelSpec) -> tuple[float, float]:
        """(flops, bytes) that any implementation must do / move at least."""
        raise NotImplementedError

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        """Small dims for interpreter runs: several tiles plus a ragged tail where the real
        shape has one."""
        raise NotImplementedError


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1}
# The host wrappers assume this many SMs off the GPU (Triton's interpreter), so a persistent grid
# still loops there.
CPU_SMS = 4
# A persistent grid keeps this many programs per SM in flight to hide latency.
PROGRAMS_PER_SM = 4


def elements(args: list[TensorArg], dims: dict[str, int]) -> int:
    """Elements of the tensors `args` at `dims` (an epilogue's operands: what reading them costs)."""
    return sum(math.prod(a.concrete_shape(dims)) for a in args)


def small_dim(d: int, block: int, tiles: int = 2) -> int:
    """Shrink dim d for the interpreter while keeping what matters to correctness:
    more than one tile, and a partial last tile exactly when d has one."""
    if d <= tiles * block:
        return d
    tail = d % block
    return tiles * block + tail
