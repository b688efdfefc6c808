"""One kernel of the catalog as a module pair the guard verifies: the family's PyTorch reference
as `Model` (inputs drawn as the family draws them) and the kernel source behind `ModelNew`, so a
single generated kernel goes through the same checks as a whole module.

  reference_source(spec, dims), candidate_source(spec, kernel_source)  -> module text
  verify_kernel(spec, kernel_source, dims, device)                      -> guard verdict
  PairChecker(spec, dims, device).check(kernel_source)                  -> guard verdict, the
      reference's session kept open between kernels (the loop's drafts: each pays only its own)
"""
from __future__ import annotations

import itertools
import json
import shutil
import tempfile
import threading
from pathlib import Path

from mtmc.kernels.catalog import family_of
from mtmc.kernels.codegen import named_sizes
from mtmc.kernels.spec import KernelSpec
from mtmc.tools.loader import concrete_init
from mtmc.tools.guard.verifier import (
    DEFAULT_TIMEOUT_S, ReferenceFailed, check_candidate, invalid_reference, run_reference, verify,
)

_REFERENCE = '''import math

import torch
import torch.nn as nn

from mtmc.tools.loader import random_tensor

{reference}

INPUTS = json.loads({inputs!r})  # shape, dtype, init of each input


class Model(nn.Module):
    def forward(self, *inputs):
        return reference(*inputs)


def get_inputs():
    return [random_tensor(tuple(shape), dtype, init, None) for shape, dtype, init in INPUTS]


def get_init_inputs():
    return []
'''

_CANDIDATE = '''{kernel}

import torch.nn as _nn

_IN_SHAPES = {in_shapes!r}  # dim names (or sizes) of each input
_OUT_SHAPE, _OUT_DTYPE = {out_shape!r}, {out_dtype!r}
_KNOWN = {known!r}   # sizes only the output names (a conv's OH, OW), at the checked dims


class ModelNew(_nn.Module):
    def forward(self, *inputs):
        dims = {{**_KNOWN, **{{n: s for names, x in zip(_IN_SHAPES, inputs) for n, s in zip(names, x.shape)
                                 if isinstance(n, str)}}}}
        out = torch.empty([d if isinstance(d, int) else dims[d] for d in _OUT_SHAPE],
                          dtype=getattr(torch, _OUT_DTYPE), device=inputs[0].device)
        launch(*inputs, out=out)
        return out
'''


def reference_source(spec: KernelSpec, dims: dict | None = None) -> str:
    fam = family_of(spec)
    dims = dims or spec.dims
    inputs = [[list(a.concrete_shape(dims)), a.dtype or spec.dtype, concrete_init(a.init, dims)]
              for a in fam.inputs(spec)]
    return "import json\n" + _REFERENCE.format(reference=fam.reference_source(spec).strip(), inputs=json.dumps(inputs))


def candidate_source(spec: KernelSpec, kernel_source: str, dims: dict | None = None) -> str:
    fam = family_of(spec)
    out = fam.output(spec)
    known = named_sizes(fam, spec, dims or spec.dims)
    return _CANDIDATE.format(kernel=kernel_source.strip(), in_shapes=[list(a.shape) for a in fam.inputs(spec)],
                             out_shape=list(out.shape), out_dtype=out.dtype or spec.dtype, known=known)


def verify_kernel(spec: KernelSpec, kernel_source: str, dims: dict | None = None, device: str | None = None,
                  timeout_s: float | None = None) -> dict:
    """The guard's verdict on one kernel at `dims` (default: the spec's)."""
    with tempfile.TemporaryDirectory(prefix="mtmc-guard-kernel-") as tmp:
        ref, cand = Path(tmp) / "reference.py", Path(tmp) / "candidate.py"
        ref.write_text(reference_source(spec, dims))
        cand.write_text(candidate_source(spec, kernel_source, dims))
        return verify(ref, cand, device=device, timeout_s=timeout_s or DEFAULT_TIMEOUT_S)


class PairChecker:
    """The guard's reference for one spec at `dims`, opened once and kept: each kernel checked
    against it gets a fresh candidate session and fresh inputs, as `mtmc verify` gives them."""

    def __init__(self, spec: KernelSpec, dims: dict, device: str, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.spec, self.dims, self.timeout_s = spec, dims, timeout_s
        self.dir = Path(tempfile.mkdtemp(prefix="mtmc-guard-kernel-"))
        self.dir.chmod(0o755)     # our template's code and its reference: the sandbox user reads them
        self.reference = self.dir / "reference.py"
        self.reference.write_text(reference_source(spec, dims))
        self._lock, self._n = threading.Lock(), itertools.count()
        self.lent = 0             # checks under way or about to start (kernels.drafts lends it)
        try:
            self.ref, self.error = run_reference(self.reference, device, timeout_s, candidates_in=self.dir), None
            # a draft's steps check many kernels against it: on a GPU the next candidate session
            # starts while the planner and coder work (on the CPU it would take a core from them)
            self.ref.keep_spare = device == "cuda"
        except ReferenceFailed as e:
            self.ref, self.error = None, e

    @property
    def alive(self) -> bool:
        return self.ref is None or self.ref.session.alive

    def check(self, kernel_source: str) -> dict:
        cand = self.dir / f"candidate_{next(self._n)}.py"
        cand.write_text(candidate_source(self.spec, kernel_source, self.dims))
        try:
            if self.ref is None:
                return invalid_reference(self.reference, cand, self.error)
            with self._lock:
                return check_candidate(self.ref, cand, self.timeout_s)
        finally:
            cand.unlink(missing_ok=True)

    def close(self) -> None:
        if self.ref is not None:
            self.ref.close()
        shutil.rmtree(self.dir, ignore_errors=True)
