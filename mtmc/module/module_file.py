"""A module file someone hands over (an upload in the chat, `mtmc optimize MODEL.py`, the files of
`mtmc verify`), checked without running it: one set of rules for the app and the command line.

`check_file`: a .py file under the upload size limit.  `check_module_source`: that, and valid
UTF-8 Python in the benchmark format (`class Model`, `get_inputs()`, `get_init_inputs()` at top
level).  Parsing is not running: the code itself only ever runs in a sandboxed child.
"""
from __future__ import annotations

import ast
from pathlib import Path

MAX_UPLOAD_BYTES = 256 * 1024          # a benchmark module is a few KB
REQUIRED = {"Model": ast.ClassDef, "get_inputs": ast.FunctionDef, "get_init_inputs": ast.FunctionDef}


class ModuleFileError(ValueError):
    """The file cannot be used; the message says why in plain words."""


def check_file(path: str | Path) -> None:
    """ModuleFileError unless `path` is a readable .py file of at most MAX_UPLOAD_BYTES."""
    path = Path(path)
    name = path.name
    if path.suffix.lower() != ".py":
        raise ModuleFileError(f"{name}: only Python modules (.py) are accepted.")
    if not path.is_file():
        raise ModuleFileError(f"{path}: no such file.")
    size = path.stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise ModuleFileError(f"{name} is {size // 1024} KB; the limit is {MAX_UPLOAD_BYTES // 1024} KB.")


def check_module_source(path: str | Path) -> str:
    """check_file, then valid Python in the benchmark format; returns the source."""
    path = Path(path)
    name = path.name
    check_file(path)
    try:
        source = path.read_bytes().decode("utf-8")
        tree = ast.parse(source, filename=name)   # parsing is not running
    except (UnicodeDecodeError, SyntaxError) as exc:
        raise ModuleFileError(f"{name} is not valid Python: {exc}") from exc
    defined = {node.name: type(node) for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    missing = [n for n, kind in REQUIRED.items() if defined.get(n) is not kind]
    if missing:
        raise ModuleFileError(f"{name} is not in the benchmark format: it needs `class Model(nn.Module)`, "
                              f"`get_inputs()` and `get_init_inputs()` at top level; missing: {', '.join(missing)}.")
    return source
