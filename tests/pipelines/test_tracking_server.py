"""The stages against a real MLflow tracking server (`mlflow server` on 127.0.0.1, as on a
cluster): runs, metrics and artifacts logged by Ray workers go through the server, artifacts into
its `--artifacts-destination` (proxied `mlflow-artifacts:` URIs, readable wherever the UI runs),
never into a worker's local folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from pipelines.scaffold.cells import CellRun, Grid, GridCell
from pipelines.scaffold.params import Params
from pipelines.scaffold.stage import Stage


def train_and_log(run: CellRun) -> dict:
    """A Ray task that logs like a training cell: a curve and the model."""
    for step in range(3):
        run.log_metrics({"loss": 1.0 / (step + 1)}, step)
    run.log_model(torch.nn.Linear(2, 1))
    return {"cell": run.key}


def test_cells_log_through_the_server_and_artifacts_land_in_its_destination(
    ray_local: None, mlflow_server: tuple[str, Path], tmp_path: Path
) -> None:
    uri, artifacts = mlflow_server
    params = Params(
        {
            "profile": "ci",
            "mlflow": {"experiment": "on-a-server"},
            "ray": {"address": None, "num_cpus": 2, "task_cpus": 1, "task_gpus": 0},
        },
        "params.yaml",
    )
    stage = Stage("server-test", params, uri)
    cells = [GridCell(f"toy/seed{seed}", {"seed": seed}) for seed in (0, 1)]
    assert stage.run_grid(Grid(train_and_log, cells, tmp_path / "store")) == {
        "toy/seed0": {"cell": "toy/seed0"},
        "toy/seed1": {"cell": "toy/seed1"},
    }
    stage.finish("FINISHED")

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("on-a-server")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id], "tags.stage = 'server-test'")
    children = [r for r in runs if "cell" in r.data.tags]
    assert sorted(r.info.run_name for r in children) == ["toy/seed0", "toy/seed1"]
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.info.artifact_uri.startswith("mlflow-artifacts:")
        history = client.get_metric_history(child.info.run_id, "loss")
        assert [m.step for m in history] == [0, 1, 2]
        listed = {a.path for a in client.list_artifacts(child.info.run_id, "model")}
        assert listed == {"model/weights.pt"}
        local = Path(client.download_artifacts(child.info.run_id, "model/weights.pt", tmp_path))
        assert set(torch.load(local)) == {"weight", "bias"}
    assert len(list(artifacts.rglob("weights.pt"))) == 2  # in the server's destination


def test_a_server_without_authentication_lets_anyone_log(
    mlflow_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_access on a server without basic-auth (its permission routes answer 404): the
    credentials a machine holds for other servers do not stop a stage."""
    from pipelines.scaffold.tracking.store import check_access

    uri = mlflow_server[0]
    MlflowClient(uri).create_experiment("open to anyone")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "someone")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "for another server")
    check_access(uri, "open to anyone")
    check_access(uri, "not made yet")
