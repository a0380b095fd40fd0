"""The project files a stage's code runs: its imports, followed transitively within the repo.

Stage dependencies are derived, not kept by hand: ``dvc.yaml`` must list every file that
:func:`code_files` finds for a stage's entrypoint (a test checks it), and a grid cell's
fingerprint hashes the same files (:func:`code_digest`), so that a change to any of them makes
DVC rerun the stage and the stage retrain the cells — never report results of older code.

Imports are read from the source (``ast``), not executed: ``import a.b``, ``from a.b import c``
(``c`` a module or a name) and, for scripts outside a package (the benchmarks), imports of their
sibling files. A package's ``__init__.py`` runs when anything inside it is imported, so it counts
too, unless it holds nothing but a docstring. Imports inside functions count as well;
third-party and standard-library modules do not.

``python -m pipelines.scaffold.imports pipelines.stages.nmt.train_nmt`` prints the ``deps`` entries
of a stage for ``dvc.yaml``: whole folders for sub-packages (``learnable_sparsity/nmt``,
``pipelines/scaffold``), single files elsewhere.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Top-level folders whose Python files belong to the project.
PACKAGES = ("learnable_sparsity", "pipelines", "benchmarks")


def _module_file(name: str, root: Path) -> Path | None:
    """The file of dotted module ``name`` under ``root`` (module.py or package/__init__.py)."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _packages_of(path: Path, root: Path) -> list[Path]:
    """The ``__init__.py`` files of the packages enclosing ``path`` (they run on import)."""
    inits = []
    for parent in path.relative_to(root).parents:
        init = root / parent / "__init__.py"
        if parent != Path(".") and init.is_file():
            inits.append(init)
    return inits


def _imported_names(path: Path) -> list[str]:
    """Dotted names imported by ``path``: ``a.b`` and, for ``from a.b import c``, ``a.b.c``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _resolve(name: str, importer: Path, root: Path) -> Path | None:
    """The project file ``name`` refers to from ``importer``, if it is one of the project's."""
    if name.split(".")[0] in PACKAGES:
        return _module_file(name, root)
    if not (importer.parent / "__init__.py").exists():  # a script: its siblings are importable
        return _module_file(name, importer.parent)
    return None


def _closure(start: Path, root: Path) -> frozenset[Path]:
    seen: set[Path] = set()
    pending = [start, *_packages_of(start, root)]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imported_names(path):
            found = _resolve(name, path, root)
            if found is not None and found not in seen:
                pending += [found, *_packages_of(found, root)]
    return frozenset(seen)


def runs_code(path: Path) -> bool:
    """Whether importing ``path`` runs anything: statements other than a docstring and
    ``from __future__`` imports."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return any(
        not (isinstance(node, ast.ImportFrom) and node.module == "__future__") for node in body
    )


def code_files(entry: str | Path, root: Path = ROOT) -> list[str]:
    """Project files run by ``entry`` — a module name (``pipelines.stages.nmt.train_nmt``) or a
    script path relative to ``root`` (``benchmarks/marginalization.py``) — as sorted paths
    relative to ``root``, ``entry`` itself included (it must lie under ``root``)."""
    if isinstance(entry, Path) or str(entry).endswith(".py"):
        start = root / entry
    else:  # a project module, or one found on sys.path (e.g. a test module under the root)
        spec = importlib.util.find_spec(str(entry))
        start = _module_file(str(entry), root) or (Path(spec.origin) if spec else None)
    if start is None or not start.is_file():
        raise FileNotFoundError(f"no project module or script {entry!r} under {root}")
    files = _closure(start.resolve(), root.resolve())
    return sorted(str(path.relative_to(root.resolve())) for path in files if runs_code(path))


def code_digest(entry: str | Path, root: Path = ROOT) -> str:
    """SHA-256 over the paths and contents of :func:`code_files` of ``entry``."""
    digest = hashlib.sha256()
    for relative in code_files(entry, root):
        digest.update(relative.encode("utf-8") + b"\0")
        digest.update((root / relative).read_bytes() + b"\0")
    return digest.hexdigest()


def dvc_deps(entry: str | Path, root: Path = ROOT) -> list[str]:
    """The code ``deps`` of a stage running ``entry``: the library's sub-packages it imports from
    and the scaffold as whole folders (``learnable_sparsity/nmt``, ``pipelines/scaffold``), other
    files one by one (a stage depends on the stage modules' package, never on the other stages)."""
    return sorted({_dep(Path(f)) for f in code_files(entry, root)})


def _dep(path: Path) -> str:
    whole = path.parts[0] == "learnable_sparsity" or path.parts[:2] == ("pipelines", "scaffold")
    return "/".join(path.parts[:2]) if whole and len(path.parts) > 2 else str(path)


def git(*args: str, checkout: Path = ROOT) -> str | None:
    """The output of ``git *args`` in ``checkout``; None outside a checkout (or without git)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=checkout, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


if __name__ == "__main__":
    import sys

    for argument in sys.argv[1:]:
        print(f"{argument}:")
        print("".join(f"  - {dep}\n" for dep in dvc_deps(argument)), end="")
