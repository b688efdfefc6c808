"""The benchmark scripts' own logic (their numbers come from the GPU, not from tests)."""
import ast

import pytest

from bench.modules import FULL_SIZE, MODULES, resized


def test_every_test_module_has_full_sizes_that_replace_its_constants():
    assert set(FULL_SIZE) == {p.name for p in MODULES.glob("*.py")}
    for name, sizes in FULL_SIZE.items():
        tree = ast.parse(resized((MODULES / name).read_text(), sizes))
        assigned = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                t = node.targets[0]
                names = [t.id] if isinstance(t, ast.Name) else [e.id for e in getattr(t, "elts", [])]
                values = [ast.literal_eval(node.value)] if isinstance(t, ast.Name) else ast.literal_eval(node.value)
                assigned.update(zip(names, values))
        assert {k: assigned[k] for k in sizes} == sizes, name


def test_a_size_the_module_does_not_assign_is_an_error():
    with pytest.raises(ValueError, match="no top-level assignment of \\['hidden'\\]"):
        resized("batch, rows = 2, 3\n", {"batch": 4, "hidden": 8})
    assert resized("batch, rows = 2, 3\nx = 1\n", {"rows": 30}) == "batch, rows = 2, 30\nx = 1\n"
