"""A deep copy of a torch module whose closures follow the copy."""
from __future__ import annotations

import copy
import types


def deep_copy(model):
    """copy.deepcopy of a module whose closures stored on it follow the copy: deepcopy keeps
    functions as they are, so minGPT's `self.mlpf = lambda x: m.c_proj(m.act(m.c_fc(x)))` in a
    float64 copy still ran the float32 original's layers (the guard lost its float64 truth), and
    in an eval-mode copy the original's training-mode dropout."""
    memo: dict = {}
    new = copy.deepcopy(model, memo)
    for mod in new.modules():
        for name, f in list(vars(mod).items()):
            if isinstance(f, types.FunctionType) and f.__closure__:
                cells = tuple(_cell_copy(c, memo) for c in f.__closure__)
                g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, cells)
                g.__kwdefaults__, g.__dict__ = f.__kwdefaults__, dict(f.__dict__)
                setattr(mod, name, g)
    return new


def _cell_copy(cell, memo: dict):
    try:
        value = cell.cell_contents
    except ValueError:   # an empty cell (a name not bound yet)
        return cell
    return types.CellType(memo.get(id(value), value))
