"""Fresh inputs for every verification: the module's own get_inputs() under a seed from the OS,
then, trial by trial, a different distribution of the same shapes and dtypes, so that a kernel
tuned to (or cached for) one distribution, or one that breaks on large or shifted values, fails.

Variants (one per trial, in this order):
  as_given       what get_inputs() draws
  heavy_tailed   Cauchy values clipped to +-CLIP times the template's RMS (many large values)
  offset_scaled  the template times a random scale in [1/4, 4] plus a random offset
Non-negative templates stay non-negative (a log or sqrt in the module keeps its domain); integer
and boolean tensors (indices, masks) are kept as get_inputs() drew them.  Where a template is
non-negative, one more trial draws it with both signs:
  signed         normal values of the template's RMS, either sign (on torch.rand inputs an ELU or
                 a ReLU is the identity, so a copy of the input would pass every other trial;
                 the reference falls back to as_given where Model is not finite on these)
"""
from __future__ import annotations

import math
import os

VARIANTS = ("as_given", "heavy_tailed", "offset_scaled")
SIGNED = "signed"
CLIP = 12.0


def fresh_seed() -> int:
    """A seed nobody can predict: not derived from time, a counter or the process."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def seed_everything(seed: int) -> None:
    import random

    import torch
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass


def vary(template, variant: str, gen):
    """One input tensor of the template's shape and dtype, drawn as `variant` says, on the
    template's device (`gen` is a generator of that device)."""
    import torch
    if not isinstance(template, torch.Tensor) or not template.is_floating_point() or template.numel() == 0:
        return template
    t32 = template.detach().to(torch.float32)
    rms = float(torch.linalg.vector_norm(t32)) / math.sqrt(t32.numel()) or 1.0
    nonneg = bool(t32.min() >= 0)
    if variant == "as_given":
        out = t32
    elif variant == "heavy_tailed":
        out = torch.empty(t32.shape, device=t32.device).cauchy_(generator=gen).clamp_(-CLIP, CLIP).mul_(rms)
        out = out.abs_() if nonneg else out
    elif variant == "offset_scaled":
        u = torch.rand(2, generator=gen, dtype=torch.float64, device=t32.device).tolist()
        scale = math.exp((2 * u[0] - 1) * math.log(4.0))
        offset = (u[1] * 2 if nonneg else u[1] * 4 - 2) * rms
        out = t32 * scale + offset
    elif variant == SIGNED:
        out = torch.empty(t32.shape, device=t32.device).normal_(generator=gen).mul_(rms)
    else:
        raise ValueError(f"unknown input variant {variant!r}; known: {', '.join(VARIANTS + (SIGNED,))}")
    return out.to(template.dtype).reshape(template.shape).contiguous()


def draw_inputs(get_inputs, variant: str, device: str = "cpu") -> tuple[list, int]:
    """(inputs, seed): get_inputs() under a fresh seed, each tensor varied as `variant` says.
    Tensors are made on `device` (factory calls run under it; a tensor get_inputs() puts on the
    CPU explicitly is moved), so GPU-sized inputs never sit on the host."""
    import torch
    from torch.utils._pytree import tree_map
    seed = fresh_seed()
    seed_everything(seed)
    with torch.device(device):
        template = list(get_inputs())
    template = tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, template)
    gen = torch.Generator(device=device).manual_seed(fresh_seed())
    return tree_map(lambda t: vary(t, variant, gen), template), seed


def shrink(inputs: list, max_elems: int) -> tuple[list, bool]:
    """Inputs cut along dim 0 so that none has more than max_elems elements (Triton's
    interpreter is slow; a smaller batch exercises the same kernels): the largest input sets the
    rows, and every input with the same leading size (the batch) is cut with it.  (inputs,
    whether cut)."""
    import torch
    big = [x for x in inputs if isinstance(x, torch.Tensor) and x.numel() > max_elems and x.dim() > 0]
    if not big:
        return inputs, False
    batch = max(big, key=lambda x: x.numel()).shape[0]
    rows = min(max(1, x.shape[0] * max_elems // x.numel()) for x in big if x.shape[0] == batch)
    return [x[:rows].clone() if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch else x
            for x in inputs], True
