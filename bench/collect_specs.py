"""What bench.collect measures: specs for every catalog family and the configs of each spec.

Specs start from the project's benchmark requests in words (every `*_TASKS` list of bench.tasks,
read by the rule parser) and KernelBench's level-1 convs (bench.conv.TASKS), and grow by
rescaling dims (powers of two and odd sizes, up and down) and switching dtype; each is validated
by its family and shrunk until its tensors fit `max_bytes` (and the tensors its float64 reference
holds at once, tracked on meta tensors, TRUTH_FACTOR times that).  A family's output dims that follow
from its input dims (a conv's, a pool's) are derived again by the family module's
`output_dims(op, dims, params)`, where it has one.  Each family gets the same number of specs,
about HELDOUT_FRACTION of them in the held-out set (dataset.split_of decides per spec key).

Configs of a spec: the family's default, all its one-knob neighbours (policy.actions), and
random points of the product of its config space; a held-out spec gets the whole product when
it is small enough, else that many random points.  The roofline model's resource check
(kernels.estimate) masks configs that cannot run; a seeded 5 % of those are measured anyway.
"""
from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass

from mtmc.kernels.catalog import families, family_of
from mtmc.kernels.estimate import estimate_time
from mtmc.kernels.spec import DTYPES, KernelSpec
from mtmc.policy.actions import config_key, legal_actions
from mtmc.policy.dataset import HELDOUT_FRACTION, split_of, unit

MAX_BYTES = 2 * 2**30
# the float64 truth's tensors may take this many times the inputs' cap at once (attention's score
# matrices); more would not fit beside the inputs and their copies on the GPU
TRUTH_FACTOR = 20
MASKED_SAMPLE = 0.05
POW2_FACTORS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 2, 4)


def requests() -> list[str]:
    """Every request in words of bench.tasks' lists (a list added there joins by its name)."""
    from bench import tasks
    return [text for name in sorted(vars(tasks)) if name.endswith("_TASKS") for text in getattr(tasks, name)]


def base_specs() -> list[KernelSpec]:
    from bench.conv import TASKS as CONV_TASKS
    from mtmc.kernels.families.conv import conv_spec
    from mtmc.request.parse import parse_request
    out = [r.spec for r in map(parse_request, requests()) if r.spec is not None]
    for op, x, c_out, k, params in CONV_TASKS.values():
        out.append(conv_spec(op, x, c_out, k, **params))
    return out


def _derive(spec: KernelSpec) -> tuple[set[str], Callable | None]:
    """The dims the family derives from the others, and the function that derives them."""
    fn = getattr(sys.modules[type(family_of(spec)).__module__], "output_dims", None)
    if fn is None:
        return set(), None
    try:
        return set(fn(spec.op, spec.dims, spec.params)), fn
    except Exception:   # e.g. an adaptive pool: its output dims are free
        return set(), None


def truth_bytes(spec: KernelSpec) -> int:
    """Peak bytes of the tensors the float64 reference and error scale hold at once (what the
    truth needs on the device beside the inputs), tracked on meta tensors; 0 when they cannot run
    there (data-dependent ops)."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from mtmc.kernels.task import task_of
    from mtmc.tools.correctness import concrete_shape, reference_namespace
    from mtmc.tools.loader import torch_dtype
    task = task_of(spec)
    live, peak = [0], [0]

    def freed(n: int) -> None:
        live[0] -= n

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and not t._is_view():
                    n = t.numel() * t.element_size()
                    live[0] += n
                    peak[0] = max(peak[0], live[0])
                    weakref.finalize(t, freed, n)
            return out

    def meta(a):
        dtype = torch_dtype(a["dtype"])
        return torch.empty(concrete_shape(a["shape"], task["dims"], a.get("groups", 1)),
                           dtype=torch.float64 if dtype.is_floating_point else dtype, device="meta")
    try:
        ns = reference_namespace(task)
        xs = [meta(a) for a in task["inputs"]]
        with Track():
            ref = ns["reference"](*xs)
            scale = ns["error_scale"](*xs) if "error_scale" in ns else None
            del ref, scale
    except Exception:
        return 0
    return peak[0]


def _valid(spec: KernelSpec, max_bytes: int) -> KernelSpec | None:
    """The spec, its derived dims recomputed, if its family serves it and it fits; else None."""
    derived, fn = _derive(spec)
    try:
        if fn is not None and derived:
            spec = spec.with_dims(**fn(spec.op, spec.dims, spec.params))
        fam = family_of(spec)
        fam.validate(spec)
        if min(spec.dims.values()) < 1 or _too_big(spec, max_bytes):
            return None
        fam.config_space(spec)
        return spec
    except Exception:
        return None


def _too_big(spec: KernelSpec, max_bytes: int) -> bool:
    return family_of(spec).tensor_bytes(spec) > max_bytes or truth_bytes(spec) > TRUTH_FACTOR * max_bytes


def fit(spec: KernelSpec, max_bytes: int) -> KernelSpec | None:
    """The spec shrunk (its largest free dim halved, again and again) until it fits max_bytes."""
    derived, _ = _derive(spec)
    for _ in range(64):
        ok = _valid(spec, max_bytes)
        if ok is not None:
            return ok
        try:
            size_problem = _too_big(spec, max_bytes)
        except Exception:
            return None
        free = {k: v for k, v in spec.dims.items() if k not in derived and v > 1}
        if not size_problem or not free:   # the family refuses it for another reason
            return None
        big = max(free, key=free.get)
        spec = spec.with_dims(**{big: max(1, free[big] // 2)})
    return None


def _scaled(value: int, rng: random.Random) -> int:
    new = max(1, round(value * rng.choice(POW2_FACTORS)))
    if rng.random() < 0.4:   # an odd size: no power-of-two alignment at all
        new = max(1, new - rng.randrange(1, 16)) | 1
    return new


def variant(base: KernelSpec, rng: random.Random, max_bytes: int) -> KernelSpec | None:
    """One rescaled / re-typed copy of `base` that its family serves and that fits, or None."""
    derived, _ = _derive(base)
    free = [k for k, v in base.dims.items() if k not in derived and v > 1]
    dims = dict(base.dims)
    for k in rng.sample(free, min(len(free), rng.choice((1, 1, 2)))):
        dims[k] = _scaled(dims[k], rng)
    dtype = rng.choice(DTYPES) if rng.random() < 0.5 else base.dtype
    spec = KernelSpec(base.family, base.op, dims, dtype, dict(base.params))
    return fit(spec, max_bytes)


@dataclass
class SpecEntry:
    spec: KernelSpec
    set: str   # "train" | "heldout"


def family_specs(name: str, n: int, seed: int, bases: list[KernelSpec], max_bytes: int = MAX_BYTES) -> list[SpecEntry]:
    """n specs of family `name`, about HELDOUT_FRACTION of them held out, drawn in turn from each
    of its base specs (so every base shape is represented)."""
    rng = random.Random(f"{seed}:{name}")
    mine = [b for b in bases if b.family == name]
    want = {"heldout": round(n * HELDOUT_FRACTION), "train": n - round(n * HELDOUT_FRACTION)}
    picked: dict[str, list[KernelSpec]] = {"heldout": [], "train": []}
    seen: set[str] = set()

    def offer(spec: KernelSpec | None) -> None:
        if spec is None or spec.key() in seen:
            return
        seen.add(spec.key())
        which = split_of(spec.key())
        if len(picked[which]) < want[which]:
            picked[which].append(spec)

    for b in mine:
        offer(fit(KernelSpec(b.family, b.op, dict(b.dims), b.dtype, dict(b.params)), max_bytes))
    tries = 0
    while mine and sum(map(len, picked.values())) < n and tries < 60 * n:
        offer(variant(mine[tries % len(mine)], rng, max_bytes))
        tries += 1
    # mix the sets in proportion, train first, so a run cut short still has both (with a held-out
    # spec first, the H200's first 400 s measured only held-out specs: nothing to train on)
    train, held = picked["train"], picked["heldout"]
    out, every = [], max(1, round(len(train) / max(1, len(held))))
    for i, spec in enumerate(train):
        out.append(SpecEntry(spec, "train"))
        if held and i % every == every - 1:
            out.append(SpecEntry(held.pop(0), "heldout"))
    return out + [SpecEntry(s, "heldout") for s in held]


def all_specs(names: list[str] | None, n: int, seed: int, max_bytes: int = MAX_BYTES) -> list[SpecEntry]:
    """n specs of each family named (default: every catalog family), interleaved family by family."""
    bases = base_specs()
    per = [family_specs(name, n, seed, bases, max_bytes) for name in (names or list(families()))]
    return [lst[i] for i in range(max(map(len, per), default=0)) for lst in per if i < len(lst)]


# -- configs ------------------------------------------------------------------------------
def _random_configs(space: dict, base: dict, count: int, rng: random.Random) -> list[dict]:
    size = math.prod(len(v) for v in space.values())
    if size <= count:   # the whole product
        import itertools
        return [{**base, **dict(zip(space, combo))} for combo in itertools.product(*space.values())]
    out, keys = [], set()
    for _ in range(count * 20):
        if len(out) >= count:
            break
        cfg = {**base, **{k: rng.choice(v) for k, v in space.items()}}
        if config_key(cfg) not in keys:
            keys.add(config_key(cfg))
            out.append(cfg)
    return out


def configs_for(entry: SpecEntry, hw, per_spec: int, exhaustive_heldout: int, seed: int,
                max_configs: int | None = None) -> list[dict]:
    """The configs to collect for one spec: default, its neighbours, then random ones."""
    spec = entry.spec
    fam = family_of(spec)
    space, default = fam.config_space(spec), fam.default_config(spec, hw)
    rng = random.Random(f"{seed}:{spec.key()}")
    count = exhaustive_heldout if entry.set == "heldout" else per_spec
    ordered = [default, *(a.apply(default) for a in legal_actions(space, default)),
               *_random_configs(space, default, count, rng)]
    out, keys = [], set()
    for cfg in ordered:
        if config_key(cfg) not in keys:
            keys.add(config_key(cfg))
            out.append(cfg)
    return out[:max_configs] if max_configs else out


def masked(spec: KernelSpec, config: dict, hw) -> str | None:
    """Why the resource model rules the config out, or None when it may run."""
    try:
        est = estimate_time(spec, config, hw)
    except Exception:   # the model cannot read this config: the compile judges it
        return None
    return None if est.get("ms") is not None else (est.get("reason") or "the resource model rules it out")


def sample_masked(spec_key: str, cfg_key: str, seed: int) -> bool:
    """Is this masked config in the seeded MASKED_SAMPLE measured anyway (to test the mask)?"""
    return unit(seed, "masked", spec_key, cfg_key) < MASKED_SAMPLE
