"""Uploaded modules: checked here without running them (module.module_file: only .py, under the
size limit the command line applies too, valid Python in the benchmark format); the code itself
only ever runs in the sandboxed child process of the module flow."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from mtmc.module.module_file import MAX_UPLOAD_BYTES, check_module_source
from mtmc.module.module_file import ModuleFileError as UploadError
from mtmc.tools.paths import home

__all__ = ["MAX_UPLOAD_BYTES", "UploadError", "check_module"]


def check_module(path: str | Path) -> Path:
    """Validate an uploaded file and keep a copy under $MTMC_HOME/uploads; returns the copy."""
    path = Path(path)
    check_module_source(path)
    keep = home() / "uploads" / uuid.uuid4().hex[:12] / path.name
    keep.parent.mkdir(parents=True)
    shutil.copyfile(path, keep)
    return keep
