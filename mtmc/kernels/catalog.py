"""The op catalog: every family the product can write kernels for."""
from __future__ import annotations

from mtmc.kernels.families import attention, conv, elementwise, loss, matmul, norm, pool, reduction, scan, softmax
from mtmc.kernels.family import Family
from mtmc.kernels.spec import CUSTOM_FAMILY, KernelSpec

_FAMILIES: dict[str, Family] = {f.name: f for f in (elementwise.FAMILY, reduction.FAMILY, softmax.FAMILY,
                                                    norm.FAMILY, matmul.FAMILY, conv.FAMILY,
                                                    pool.FAMILY, scan.FAMILY, loss.FAMILY, attention.FAMILY)}


def families() -> dict[str, Family]:
    return _FAMILIES


def family_of(spec: KernelSpec) -> Family:
    if spec.family not in _FAMILIES:
        raise ValueError(f"unknown op family {spec.family!r}; the catalog has {', '.join(_FAMILIES)}")
    return _FAMILIES[spec.family]


def describe(spec: KernelSpec) -> str:
    """The spec in a few words, as its family puts it ("softmax (softmax) M=4096 x N=8192 float16")."""
    if spec.family == CUSTOM_FAMILY:
        shapes = ", ".join(f"{'x'.join(map(str, i['shape']))} {i['dtype']}" for i in spec.params.get("inputs", []))
        return f"{spec.op} outside the catalog ({shapes}): the model writes its kernel"
    return family_of(spec).describe(spec)


def supported_ops() -> dict[str, tuple[str, ...]]:
    return {name: fam.ops for name, fam in _FAMILIES.items()}
