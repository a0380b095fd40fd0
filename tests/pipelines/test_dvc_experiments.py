"""DVC experiments (`dvc exp run --queue` + `dvc queue start`, `dvc exp run --temp`) run a stage in
a copy under `.dvc/tmp/exps/`: their MLflow runs must land in the user's store, with artifacts in
the user's `mlartifacts`, not in a database thrown away with the copy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

ROOT = Path(__file__).resolve().parents[2]
QUEUE_TIMEOUT_S = 300

# A stage on the project's scaffold: its parent run logs x and its output as an artifact.
PROBE_STAGE = """
from pathlib import Path

from pipelines.scaffold.stage import run_stage


def main(stage):
    x = stage.params.get("x", int)
    stage.run.log_metrics({"x": x}, step=0)
    stage.write_json(Path("out.json"), {"x": x}, artifact="")


run_stage("probe", main)
"""
DVC_YAML = {
    "stages": {
        "probe": {
            "cmd": "python probe_stage.py",
            "deps": ["probe_stage.py"],
            "params": ["x"],
            "metrics": [{"out.json": {"cache": False}}],
        }
    }
}


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_queued_and_temp_experiments_log_to_the_users_store(tmp_path: Path) -> None:
    repo = tmp_path / "project"
    repo.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("MLFLOW_TRACKING_URI", "DVC_ROOT")
    }
    env["PYTHONPATH"] = str(ROOT)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    (repo / "probe_stage.py").write_text(PROBE_STAGE)
    (repo / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML))
    params = {"profile": "smoke", "mlflow": {"experiment": "queued"}, "x": 1}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    (repo / ".gitignore").write_text("mlflow.db\nmlartifacts/\n")
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid"]
    run(["git", "init", "-q"], repo, env)
    run(["dvc", "init", "-q"], repo, env)
    run([*git, "add", "-A"], repo, env)
    run([*git, "commit", "-qm", "probe"], repo, env)

    run(["dvc", "exp", "run", "--queue", "-S", "x=2"], repo, env)
    run(["dvc", "exp", "run", "--queue", "-S", "x=3"], repo, env)
    run(["dvc", "queue", "start", "-j", "1"], repo, env)
    deadline = time.monotonic() + QUEUE_TIMEOUT_S
    while True:
        status = run(["dvc", "queue", "status"], repo, env)
        if "Queued" not in status and "Running" not in status:
            break
        assert time.monotonic() < deadline, status
        time.sleep(2)
    assert status.count("Success") == 2, status
    run(["dvc", "exp", "run", "--temp", "-S", "x=4"], repo, env)

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("queued")
    runs = client.search_runs([experiment.experiment_id], "tags.stage = 'probe'")
    assert sorted(r.data.metrics["x"] for r in runs) == [2, 3, 4]
    for found in runs:
        assert found.info.status == "FINISHED"
        assert found.data.tags["dvc.experiment"]  # the experiment's name, for `dvc exp show`
        assert found.info.artifact_uri.startswith((repo / "mlartifacts").as_uri())
        assert [a.path for a in client.list_artifacts(found.info.run_id)] == ["out.json"]
    assert not list((repo / ".dvc").rglob("mlflow.db"))
