"""The import rules of ../shared/DESIGN.md's Layout (and docs/ARCHITECTURE.md), read from the code.

Packages import one way:  app, ui, commands -> agents -> {request, module, kernels, policy, memory}
-> tools;  tools imports nothing above it;  nothing imports ui or commands (but app.py, and the
benchmarks, which run the command line's entry mtmc/commands/cli.py);  no import cycle between modules or
between packages.

Every import counts, the lazy ones inside functions included, and so does a string that names a
module of the project (a module started as `python -m NAME` or imported by name is a dependency
too), and so does the package a module lives in: importing a.b.c runs a/__init__.py and
a/b/__init__.py first.  bench/ sits on top, beside the app.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Layers, top first; packages of one layer may import each other, without cycles.
LAYERS = [{"app", "bench", "ui", "commands"}, {"agents"}, {"request", "module", "kernels", "policy", "memory"},
          {"tools"}]
RANK = {pkg: len(LAYERS) - i for i, layer in enumerate(LAYERS) for pkg in layer}
# Who may import the top layer: app.py the chat, and the benchmarks the command line (they run
# `mtmc optimize` as a user does); the command line's dispatcher lives inside commands.
ENTRY = {"ui": {"app"}, "commands": {"bench"}}


def _modules() -> dict[str, Path]:
    files = [ROOT / "app.py", *sorted((ROOT / "mtmc").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]
    out = {}
    for f in files:
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def package(module: str) -> str:
    """The package a module belongs to: mtmc.<pkg>..., or app / bench."""
    parts = module.split(".")
    return parts[1] if parts[0] == "mtmc" and len(parts) > 1 else parts[0]


def _target(name: str) -> str | None:
    """The project module an imported name lives in (its longest known prefix)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        if ".".join(parts[:cut]) in MODULES:
            return ".".join(parts[:cut])
    return None


def _packages_above(module: str) -> list[str]:
    """The project packages a module lives in (not the project's root package, which holds no code)."""
    parts = module.split(".")
    return [".".join(parts[:cut]) for cut in range(2, len(parts)) if ".".join(parts[:cut]) in MODULES]


def _absolute(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_pkg else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, source: str | None = None, is_pkg: bool | None = None) -> dict[str, int]:
    """Project modules `module` (its file, or `source`) depends on -> a line where it does."""
    if source is None:
        source, is_pkg = MODULES[module].read_text(), MODULES[module].name == "__init__.py"
    tree = ast.parse(source)
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        t = _target(name)
        if t and t != module:
            found.setdefault(t, line)
            for parent in _packages_above(t):   # run before t, unless they hold `module` itself
                if parent != module and not module.startswith(parent + "."):
                    found.setdefault(parent, line)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, bool(is_pkg), node)
            for a in node.names:
                add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base, node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODULES \
                and node.value.startswith("mtmc."):
            add(node.value, node.lineno)     # a module named in a string: `-m NAME`, import_module(NAME)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def _where(a: str, b: str) -> str:
    return f"{MODULES[a].relative_to(ROOT)}:{GRAPH[a][b]} imports {b}"


def test_every_arrow_points_down():
    wrong = []
    for a, targets in GRAPH.items():
        pa = package(a)
        for b in targets:
            pb = package(b)
            if pa == pb:
                continue
            assert pb in RANK, f"{b}: package {pb!r} has no place in the layers; add it to LAYERS and the docs"
            if pb in ENTRY and pa not in ENTRY[pb]:
                wrong.append(f"{_where(a, b)}: nothing imports {pb} but {', '.join(sorted(ENTRY[pb]))}")
            elif RANK[pb] > RANK[pa]:
                wrong.append(f"{_where(a, b)}: {pa} is below {pb}")
            elif pb not in ENTRY and RANK[pb] == RANK[pa] and RANK[pa] == RANK["app"]:
                wrong.append(f"{_where(a, b)}: {pa} and {pb} are both on top")
    assert not wrong, "imports against the order:\n" + "\n".join(sorted(wrong))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_back():
    cycles = _cycles({m: set(t) for m, t in GRAPH.items()})
    lines = []
    for comp in cycles:
        inside = set(comp)
        lines.append(" <-> ".join(comp) + ":\n    " + "\n    ".join(
            _where(a, b) for a in comp for b in GRAPH[a] if b in inside))
    assert not cycles, "import cycles:\n" + "\n".join(lines)


def test_no_package_imports_itself_back():
    packages: dict[str, set[str]] = defaultdict(set)
    for a, targets in GRAPH.items():
        for b in targets:
            if package(a) != package(b):
                packages[package(a)].add(package(b))
    assert not _cycles(packages), f"package cycles: {_cycles(packages)}"


def test_the_reader_sees_lazy_relative_and_named_imports():
    source = ("import os\nfrom . import hardware\n\n\ndef f():\n    from mtmc.ui.chat import Chat\n"
              "    return ['python', '-m', 'mtmc.commands']\n")
    assert imports_of("mtmc.tools.sandbox", source, False) == {
        "mtmc.tools.hardware": 2, "mtmc.ui.chat": 6, "mtmc.ui": 6, "mtmc.commands": 7}
    # importing a guard module runs the guard package first: a re-export there is a dependency
    assert imports_of("mtmc.tools.worker", "from mtmc.tools.guard import reference\n", False) == {
        "mtmc.tools.guard.reference": 1, "mtmc.tools.guard": 1}
    assert package("mtmc.tools.guard.checks") == "tools" and package("app") == "app"
