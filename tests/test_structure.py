"""The shape of the tree: imports flow one way, transports share only their base layer, and
algorithms never learn how bytes move. Read from the source (ast), so lazy imports inside
functions count too: a lazy import hides a knot, it does not untie it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from transports import registry

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("collectives", "transports", "trainer", "benchmarks")
# What a transport may import from its own package: the base layer, shared by all of them.
TRANSPORT_BASE = {"transports", "transports.base", "transports.errors", "transports.bootstrap",
                  "transports.cuda", "transports.shared_memory", "transports.slots"}
ALGORITHMS = ("all_reduce", "all_gather", "broadcast", "scatter", "reduce_scatter", "gather",
              "reduce", "all_to_all", "scan", "ring", "naive", "chunking", "ops", "blocks",
              "point_to_point", "check", "hierarchical", "two_shot")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `name` imports, anywhere in its source.

    `from package import thing` counts as importing the submodule `package.thing` when there is
    one, else `package` itself.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def project_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, set(known)) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` (module -> modules it imports) as a path, or None if it has none."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return path[path.index(name):] + [name]
        if name in done:
            return None
        for dep in sorted(graph[name]):
            cycle = visit(dep, path + [name])
            if cycle:
                return cycle
        done.add(name)
        return None

    for name in sorted(graph):
        cycle = visit(name, [])
        if cycle:
            return cycle
    return None


def test_no_import_cycle_anywhere():
    cycle = find_cycle(project_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_walk_sees_a_lazy_import_cycle(tmp_path):
    """A package whose two modules import each other, one of them inside a function."""
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import g\n")
    known = {"pkg", "pkg.a", "pkg.b"}
    graph = {name: imports(name, tmp_path / f"{name[4:]}.py", known) for name in ("pkg.a", "pkg.b")}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]


@pytest.mark.parametrize("name", registry.names(launched=True) + registry.names(launched=False))
def test_a_transport_imports_only_the_base_layer(name):
    module = registry.TRANSPORTS[name].module
    inside = {m for m in project_graph()[module] if m.startswith("transports")}
    assert inside <= TRANSPORT_BASE, f"{module} imports {sorted(inside - TRANSPORT_BASE)}"


@pytest.mark.parametrize("name", ALGORITHMS)
def test_an_algorithm_sees_only_the_transport_seam(name):
    path = ROOT / "collectives" / f"{name}.py"
    found = imports(f"collectives.{name}", path, set(modules()) | {"mpi4py", "cupy", "torch"})
    seam = ("transports.base", "transports.errors")
    outside = {m for m in found if m.startswith("transports.") and m not in seam
               or m in ("mpi4py", "cupy", "torch")}
    assert not outside, f"collectives/{name}.py imports {sorted(outside)}"


def test_every_registered_transport_loads_and_names_itself():
    for name in registry.names(device="cpu"):
        assert registry.load(name).name == name
