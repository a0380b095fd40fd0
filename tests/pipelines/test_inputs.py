"""A stage run alone on missing inputs refuses before any work, naming each missing file and the
stage that writes it (``pipelines.scaffold.inputs``): the claims stage's gates and the report's
sections cannot silently vanish with a missing result."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from learnable_sparsity.errors import MissingInputError
from pipelines import stages
from pipelines.scaffold.inputs import declared_inputs, require_inputs

ROOT = Path(__file__).resolve().parents[2]


def test_the_declared_inputs_are_the_deps_other_stages_write() -> None:
    claims = declared_inputs("claims")
    assert claims["results/train_nmt/cells"] == "train_nmt"
    assert claims["results/train_ape/valid_nll.csv"] == "train_ape"
    assert claims["results/train_lvm/bitvector_vae/calls.csv"] == "train_lvm@bitvector_vae"
    assert not any(dep.startswith(("learnable_sparsity/", "pipelines/")) for dep in claims)
    assert declared_inputs("tables")["reports/claims.md"] == "claims"
    assert declared_inputs("train_lvm@ssvae") == {"data/images": "images"}
    assert declared_inputs("corpora") == {} and declared_inputs("no_such_stage") == {}


def test_require_inputs_names_the_missing_file_and_its_stage(tmp_path: Path) -> None:
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    for dep in declared_inputs("tables"):
        if dep != "reports/claims.md":
            (tmp_path / dep).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / dep).touch()
    with pytest.raises(MissingInputError, match=r"reports/claims.md \(written by stage claims\)"):
        require_inputs("tables", tmp_path)
    (tmp_path / "reports/claims.md").touch()
    require_inputs("tables", tmp_path)


@pytest.mark.parametrize("stage", ["claims", "tables"])
def test_a_report_stage_run_alone_in_a_fresh_clone_refuses_and_writes_nothing(
    stage: str, tmp_path: Path, project_files: Callable[[Path], None]
) -> None:
    project_files(tmp_path)
    before = {p: p.read_bytes() for p in (tmp_path / "reports").glob("*.md")}
    done = subprocess.run(
        [sys.executable, "-m", stages.module(stage)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "results/evaluate_nmt/bleu.json (written by stage evaluate_nmt)" in done.stderr
    assert {p: p.read_bytes() for p in (tmp_path / "reports").glob("*.md")} == before
