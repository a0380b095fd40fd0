"""End to end: `dvc repro` of the real stages on the ci profile, in a copy of the repository.

The copy is a fresh git repository (DVC needs one) holding exactly the project's files; MLflow
logs to a SQLite database in the temporary directory. Checks the stage outputs, the MLflow
parent/child runs, and that a second `dvc repro` does nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ["softmax", "sparsemax", "entmax15", "entmax_alpha", "topk"]


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    completed = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert completed.returncode == 0, (
        f"{command}:\n{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}"
    )
    return completed.stdout + completed.stderr


@pytest.fixture(scope="module")
def repro(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """Run `dvc repro` on the ci profile once; (repository copy, MLflow URI, second repro log)."""
    work = tmp_path_factory.mktemp("e2e")
    repo = work / "repo"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in listed:
        if (ROOT / name).is_file() and not name.startswith(("data/", "models/", "results/")):
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": uri,
        "PYTHONPATH": str(repo),
        "RAY_ADDRESS": "",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid"]
    run(["git", "init", "-q"], repo, env)
    run([*git, "add", "-A"], repo, env)
    run([*git, "commit", "-qm", "copy"], repo, env)
    run([sys.executable, "-m", "pipelines.profile", "ci"], repo, env)
    run(["dvc", "repro"], repo, env)
    second = run(["dvc", "repro"], repo, env)
    return repo, uri, second


def test_outputs_of_every_stage(repro: tuple[Path, str, str]) -> None:
    repo, _, _ = repro
    for split in ("train", "valid", "test"):
        assert (repo / f"data/corpora/smoke/{split}.src").stat().st_size > 0
    assert (repo / "data/bpe/smoke/bpe.model").exists()
    summary = json.loads((repo / "results/train_nmt/summary.json").read_text())
    bleu = json.loads((repo / "results/evaluate_nmt/bleu.json").read_text())
    keys = [f"smoke/{v}/seed0" for v in VARIANTS]
    assert sorted(summary) == sorted(keys) and sorted(bleu["cells"]) == sorted(keys)
    assert all(set(bleu["cells"][k]) == {"bleu", "tokenized_bleu", "chrf"} for k in keys)
    assert "tok:13a" in bleu["signatures"]["bleu"]
    for key in keys:
        translations = (repo / f"results/evaluate_nmt/cells/{key}/translations.txt").read_text()
        assert len(translations.splitlines()) == 40
        assert (repo / f"models/nmt/{key}/last.pt").exists()
    trajectories = json.loads((repo / "results/train_nmt/alpha_trajectories.json").read_text())
    assert list(trajectories) == ["smoke/entmax_alpha/seed0"]
    header = (repo / "results/train_nmt/train_loss.csv").read_text().splitlines()[0]
    assert header.split(",") == ["step", *keys]
    speed = json.loads((repo / "results/speed/speed.json").read_text())
    assert {row["variant"] for row in speed["rows"]} == set(VARIANTS)


def test_mlflow_has_a_parent_run_per_stage_and_a_child_per_cell(
    repro: tuple[Path, str, str],
) -> None:
    _, uri, _ = repro
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("learnable-sparsity")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = {r.info.run_name: r for r in runs if "mlflow.parentRunId" not in r.data.tags}
    assert {"train_nmt", "evaluate_nmt"} <= set(parents)
    for stage in ("train_nmt", "evaluate_nmt"):
        parent = parents[stage]
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert sorted(c.info.run_name for c in children) == sorted(
            f"smoke/{v}/seed0" for v in VARIANTS
        )
        assert all(c.info.status == "FINISHED" for c in [parent, *children])
    train_children = [
        r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents["train_nmt"].info.run_id
    ]
    alpha_child = next(r for r in train_children if r.info.run_name.endswith("entmax_alpha/seed0"))
    history = client.get_metric_history(alpha_child.info.run_id, "loss")
    assert [m.step for m in history] == [4, 8, 12]
    assert any(
        name.startswith("alpha/encoder.self.layer0/head") for name in alpha_child.data.metrics
    )


def test_second_repro_is_a_no_op(repro: tuple[Path, str, str]) -> None:
    _, _, second = repro
    assert "Data and pipelines are up to date" in second
