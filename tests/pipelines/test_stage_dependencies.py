"""dvc.yaml lists exactly the project code each stage runs (derived from its imports, never kept
by hand), and no stage imports another."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from pipelines import stages
from pipelines.scaffold.imports import ROOT, code_digest, code_files, dvc_deps

DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())
_COMMAND = re.compile(r"python (?:-m (?P<module>[\w.]+)|(?P<script>[\w/]+\.py))")


def _entry(command: str) -> str:
    match = _COMMAND.match(command)
    assert match, f"unrecognised stage command {command!r}"
    return match.group("module") or match.group("script")


def _stages() -> dict[str, tuple[str, list[str]]]:
    """stage name → (entry module or script, deps), foreach stages once."""
    stages = {}
    for name, stage in DVC["stages"].items():
        body = stage.get("do", stage)
        stages[name] = (_entry(body["cmd"]), body.get("deps", []))
    return stages


STAGES = _stages()
CODE = ("learnable_sparsity/", "pipelines/", "benchmarks/", "tools/")


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_dvc_yaml_lists_the_code_each_stage_imports(stage: str) -> None:
    entry, deps = STAGES[stage]
    listed = [dep for dep in deps if dep.startswith(CODE) and not dep.endswith((".yaml", ".json"))]
    missing = [
        f for f in code_files(entry) if not any(f == d or f.startswith(d + "/") for d in listed)
    ]
    assert not missing, f"dvc.yaml stage {stage} misses {missing}; it needs {dvc_deps(entry)}"
    assert sorted(listed) == dvc_deps(entry), (
        f"dvc.yaml stage {stage} lists code it does not import: "
        f"{sorted(set(listed) - set(dvc_deps(entry)))}"
    )


def _file(entry: str) -> str:
    return entry if entry.endswith(".py") else str(Path(*entry.split("."))) + ".py"


def test_no_stage_imports_another() -> None:
    stage_files = {_file(entry) for entry, _ in STAGES.values()}
    for entry, _ in STAGES.values():
        imported = set(code_files(entry)) - {_file(entry)}
        assert not imported & stage_files, f"{entry} imports the stages {imported & stage_files}"


def _copy_tree(tmp_path: Path) -> Path:
    for folder in ("learnable_sparsity", "pipelines", "benchmarks"):
        shutil.copytree(
            ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    return tmp_path


def test_a_changed_import_changes_the_code_digest(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    before = {
        e: code_digest(e, root)
        for e in ("pipelines.stages.nmt.train_nmt", "pipelines.stages.report.tables")
    }
    batching = root / "learnable_sparsity/nmt/batching.py"
    batching.write_text(batching.read_text() + "\nPADDING_NOTE = 1\n")
    assert (
        code_digest("pipelines.stages.nmt.train_nmt", root)
        != before["pipelines.stages.nmt.train_nmt"]
    )
    assert (
        code_digest("pipelines.stages.report.tables", root)
        == before["pipelines.stages.report.tables"]
    )


def test_imports_are_followed_transitively_and_scripts_see_their_siblings(tmp_path: Path) -> None:
    (tmp_path / "learnable_sparsity" / "pkg").mkdir(parents=True)
    (tmp_path / "learnable_sparsity" / "__init__.py").write_text(
        '"""Docstring only: runs nothing."""\n'
    )
    (tmp_path / "learnable_sparsity" / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "learnable_sparsity" / "pkg" / "a.py").write_text(
        "from learnable_sparsity.pkg import b\n"
    )
    (tmp_path / "learnable_sparsity" / "pkg" / "b.py").write_text(
        "def f():\n    import learnable_sparsity.pkg.c\n"
    )
    (tmp_path / "learnable_sparsity" / "pkg" / "c.py").write_text("import torch\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "run.py").write_text(
        "from helper import x\nimport learnable_sparsity.pkg.a\n"
    )
    (tmp_path / "benchmarks" / "helper.py").write_text("x = 1\n")
    assert code_files("benchmarks/run.py", tmp_path) == [
        "benchmarks/helper.py",
        "benchmarks/run.py",
        "learnable_sparsity/pkg/__init__.py",
        "learnable_sparsity/pkg/a.py",
        "learnable_sparsity/pkg/b.py",
        "learnable_sparsity/pkg/c.py",
    ]
    assert dvc_deps("benchmarks/run.py", tmp_path) == [
        "benchmarks/helper.py",
        "benchmarks/run.py",
        "learnable_sparsity/pkg",
    ]


def test_the_stage_modules_are_dvc_yamls_stages_one_to_one() -> None:
    """``pipelines/stages/<line>/`` holds one module per stage of dvc.yaml, each the stage's
    ``cmd`` (``pipelines.stages.module`` maps a stage name to it), and nothing else."""
    assert {name: entry for name, (entry, _) in STAGES.items()} == stages.MODULES
    on_disk = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "pipelines" / "stages").glob("*/*.py")
        if path.name != "__init__.py"
    }
    assert on_disk == set(stages.MODULES.values())


# What a reader takes in at one glance: a folder with more modules than this is split by role.
MODULES_PER_FOLDER = 10


@pytest.mark.parametrize("folder", ["pipelines", "tools", "benchmarks"])
def test_no_folder_of_the_orchestration_holds_more_than_ten_modules(folder: str) -> None:
    for directory in [ROOT / folder, *(ROOT / folder).rglob("*/")]:
        if "__pycache__" in directory.parts:
            continue
        modules = [p.name for p in directory.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= MODULES_PER_FOLDER, f"{directory}: {sorted(modules)}"
