"""Load generated or uploaded source as a module, and draw fresh random tensors.

Triton's @jit reads the kernel's source with `inspect`, so generated code must live in a real
file: each load writes it to a content-addressed file under a cache directory.  Call these only
in a sandboxed child for code that is not ours.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path


_CACHE_DIR = Path(os.environ.get("MTMC_SOURCE_CACHE", Path(tempfile.gettempdir()) / "mtmc-sources"))


def load_source(source: str, name: str = "candidate"):
    """Import `source` as a fresh module (a new module object on every call)."""
    _CACHE_DIR.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    path = _CACHE_DIR / f"{name}_{digest}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    return load_file(path, f"mtmc_gen_{name}_{digest}")


def load_file(path: str | os.PathLike, module_name: str | None = None):
    path = Path(path)
    module_name = module_name or f"mtmc_file_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and triton look modules up by name
    spec.loader.exec_module(module)
    return module


def torch_dtype(name: str):
    import torch
    return getattr(torch, name)


def concrete_init(init: str, dims: dict) -> str:
    """An init at concrete dims: "index:C" (indices below the size of dim C) names its bound."""
    if init.startswith("index:") and not init[6:].isdigit():
        return f"index:{int(dims[init[6:]])}"
    return init


def random_tensor(shape, dtype: str, init: str, generator, device="cpu"):
    """A fresh random tensor drawn on `device` from `generator` (a generator of that device, or
    None): GPU-sized inputs are never made on the host.  Self-contained: kernel files embed its
    source."""
    import torch
    if init.startswith("index:"):   # class indices in [0, n) (a cross-entropy target)
        return torch.randint(0, int(init[6:]), shape, generator=generator, dtype=getattr(torch, dtype), device=device)
    if init == "mask":              # a random boolean mask, about half set
        return torch.rand(shape, generator=generator, device=device) < 0.5
    if init == "sign":              # +-1 labels (hinge and cosine embedding losses)
        return torch.rand(shape, generator=generator, device=device).round().mul_(2).sub_(1).to(getattr(torch, dtype))
    if init == "randn":
        t = torch.randn(shape, generator=generator, dtype=torch.float32, device=device)
    elif init == "uniform":
        t = torch.rand(shape, generator=generator, dtype=torch.float32, device=device).mul_(2).sub_(1)
    elif init == "positive":
        t = torch.rand(shape, generator=generator, dtype=torch.float32, device=device).add_(0.5)
    elif init == "mask":   # a boolean mask, True or False as often (a row of 16+ rarely all one)
        t = torch.rand(shape, generator=generator, dtype=torch.float32, device=device).lt_(0.5)
    else:
        raise ValueError(f"unknown init {init!r}")
    return t.to(getattr(torch, dtype))

