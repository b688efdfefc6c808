"""Uploaded modules: checked here without running them (only .py, under a size limit, valid
Python in the benchmark format); the code itself only ever runs in the sandboxed child process
of the module flow."""
from __future__ import annotations

import ast
import shutil
import uuid
from pathlib import Path

from mtmc.paths import home

MAX_UPLOAD_BYTES = 256 * 1024          # a benchmark module is a few KB
REQUIRED = {"Model": ast.ClassDef, "get_inputs": ast.FunctionDef, "get_init_inputs": ast.FunctionDef}


class UploadError(ValueError):
    """The message says what is wrong with the file, for the chat."""


def check_module(path: str | Path) -> Path:
    """Validate an uploaded file and keep a copy under $MTMC_HOME/uploads; returns the copy."""
    path = Path(path)
    name = path.name
    if path.suffix.lower() != ".py":
        raise UploadError(f"{name}: only Python modules (.py) can be uploaded.")
    size = path.stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise UploadError(f"{name} is {size // 1024} KB; the limit is {MAX_UPLOAD_BYTES // 1024} KB.")
    try:
        source = path.read_bytes().decode("utf-8")
        tree = ast.parse(source, filename=name)   # parsing is not running
    except (UnicodeDecodeError, SyntaxError) as exc:
        raise UploadError(f"{name} is not valid Python: {exc}") from exc
    defined = {node.name: type(node) for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    missing = [n for n, kind in REQUIRED.items() if defined.get(n) is not kind]
    if missing:
        raise UploadError(f"{name} is not in the benchmark format: it needs `class Model(nn.Module)`, "
                          f"`get_inputs()` and `get_init_inputs()` at top level; missing: {', '.join(missing)}.")
    keep = home() / "uploads" / uuid.uuid4().hex[:12] / name
    keep.parent.mkdir(parents=True)
    shutil.copyfile(path, keep)
    return keep
