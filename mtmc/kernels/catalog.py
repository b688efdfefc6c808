"""The op catalog: every family the product can write kernels for."""
from __future__ import annotations

from mtmc.kernels.family import Family
from mtmc.kernels.spec import KernelSpec


def _families() -> dict[str, Family]:
    # Imported here so that importing a spec does not import every template.
    from mtmc.kernels.families import conv, elementwise, matmul, norm, reduction, softmax
    fams = [elementwise.FAMILY, reduction.FAMILY, softmax.FAMILY, norm.FAMILY, matmul.FAMILY, conv.FAMILY]
    return {f.name: f for f in fams}


_CACHE: dict[str, Family] = {}


def families() -> dict[str, Family]:
    if not _CACHE:
        _CACHE.update(_families())
    return _CACHE


def family_of(spec: KernelSpec) -> Family:
    fams = families()
    if spec.family not in fams:
        raise ValueError(f"unknown op family {spec.family!r}; the catalog has {', '.join(fams)}")
    return fams[spec.family]


def supported_ops() -> dict[str, tuple[str, ...]]:
    return {name: fam.ops for name, fam in families().items()}
