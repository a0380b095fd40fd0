"""The library's import graph has no cycle, between its modules nor between its parts (the
top-level modules and the sub-packages): no module of a sub-package imports a top-level module
that imports back into that sub-package (an upward arrow). Read from the source, imports inside
functions included."""

from __future__ import annotations

import ast
import graphlib
import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "learnable_sparsity"


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name → file of every module of the library under ``root``."""
    modules = {}
    for path in (root / PACKAGE).rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The library modules ``path`` imports: ``from a import b`` is ``a.b`` where that is a
    module (a sub-module of package ``a``), ``a`` where ``b`` is a name defined in ``a``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: a relative import; the library imports absolutely"
            named = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= named & modules.keys()
            if named - modules.keys():
                found.add(node.module)
    return found & modules.keys()


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Library module → the library modules it imports (itself left out)."""
    modules = _modules(root)
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _part(module: str) -> str:
    """``learnable_sparsity.data`` for ``learnable_sparsity.data.datasets``; a top-level module
    is its own part."""
    return ".".join(module.split(".")[:2])


def part_graph(modules: dict[str, set[str]]) -> dict[str, dict[str, str]]:
    """Part → the other parts it imports, each with one import that makes the arrow (a → b)."""
    parts: dict[str, dict[str, str]] = {}
    for module, imported in sorted(modules.items()):
        arrows = parts.setdefault(_part(module), {})
        for target in sorted(imported):
            if _part(target) != _part(module):
                arrows.setdefault(_part(target), f"{module} → {target}")
    return parts


def cycle(graph: dict[str, set[str]] | dict[str, dict[str, str]]) -> list[str]:
    """A cycle of ``graph`` (its nodes, the first one repeated at the end), or [] if it has none."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        return list(reversed(error.args[1]))  # the sorter lists it against the arrows
    return []


def test_no_module_imports_itself_back() -> None:
    found = cycle(module_graph())
    assert not found, f"import cycle: {' → '.join(found)}"


def test_no_part_of_the_library_imports_itself_back() -> None:
    parts = part_graph(module_graph())
    found = cycle(parts)
    arrows = [parts[a][b] for a, b in itertools.pairwise(found)]
    assert not found, f"the parts {' → '.join(found)} import each other: {'; '.join(arrows)}"


def test_an_upward_arrow_is_found(tmp_path: Path) -> None:
    """The check is no tautology: the arrow this layout once had (a dataset module importing a
    top-level module that imports back into data/) is a cycle of parts, with its imports named."""
    data = tmp_path / PACKAGE / "data"
    data.mkdir(parents=True)
    for path, source in {
        data / "__init__.py": '"""Data."""\n',
        data / "atomic.py": "import os\n",
        data / "datasets.py": "from learnable_sparsity.checkpoints import load_file\n",
        data.parent / "checkpoints.py": "from learnable_sparsity.data import atomic\n",
    }.items():
        path.write_text(source)
    modules = module_graph(tmp_path)
    assert not cycle(modules)  # no module cycle: only the parts import each other
    parts = part_graph(modules)
    found = cycle(parts)
    assert sorted(found[:-1]) == ["learnable_sparsity.checkpoints", "learnable_sparsity.data"]
    assert parts["learnable_sparsity.data"] == {
        "learnable_sparsity.checkpoints": (
            "learnable_sparsity.data.datasets → learnable_sparsity.checkpoints"
        )
    }
    (data / "atomic.py").write_text("import learnable_sparsity.data.datasets\n")
    assert cycle(module_graph(tmp_path))  # datasets → checkpoints → atomic → datasets


def test_the_graph_reads_the_imports() -> None:
    """File I/O is one module at the bottom of the graph: it imports the errors only."""
    modules = module_graph()
    assert modules["learnable_sparsity.files"] == {"learnable_sparsity.errors"}
    assert modules["learnable_sparsity.checkpoints"] == {
        "learnable_sparsity.errors",
        "learnable_sparsity.files",
    }
    assert "learnable_sparsity.files" in modules["learnable_sparsity.data.datasets"]
