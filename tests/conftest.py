import os

import pytest

# Kernels run in Triton's interpreter unless a GPU is present (CI has none).
os.environ.setdefault("TRITON_INTERPRET", "1")


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _mtmc_home(tmp_path, monkeypatch):
    """Each test gets its own data directory (checkpoints, memory, artifacts)."""
    monkeypatch.setenv("MTMC_HOME", str(tmp_path / "mtmc-home"))
