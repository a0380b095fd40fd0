"""The pipeline against a tracking server with authentication (`mlflow server --app-name
basic-auth` on 127.0.0.1, set up as docs/tracking.md says): nothing gets in without credentials,
a stage and a sweep's submission stop before any work when the server refuses them, the
scaffold logs with them, and the password appears nowhere it logs or hands on."""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.request
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from matplotlib.figure import Figure
from mlflow import MlflowClient

from learnable_sparsity.errors import LearnableSparsityError
from pipelines import sweep
from pipelines.preflight import tracking_check
from pipelines.scaffold.provenance import system_tags
from pipelines.scaffold.runs import RunLogger, stage_run
from pipelines.scaffold.store import prepare, tracking_uri
from tests.pipelines.conftest import AuthServer

ROOT = Path(__file__).resolve().parents[2]
SEARCH = "/api/2.0/mlflow/experiments/search?max_results=1"


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither the variables nor a ~/.mlflow/credentials file (HOME is an empty folder)."""
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
def credentials(mlflow_auth_server: AuthServer, monkeypatch: pytest.MonkeyPatch) -> AuthServer:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", mlflow_auth_server.username)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", mlflow_auth_server.password)
    return mlflow_auth_server


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {})) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def test_requests_without_credentials_are_refused(mlflow_auth_server: AuthServer) -> None:
    server = mlflow_auth_server
    assert _status(server.uri + SEARCH) == 401
    wrong = base64.b64encode(f"{server.username}:not-it".encode()).decode()
    assert _status(server.uri + SEARCH, {"Authorization": f"Basic {wrong}"}) == 401
    right = base64.b64encode(f"{server.username}:{server.password}".encode()).decode()
    assert _status(server.uri + SEARCH, {"Authorization": f"Basic {right}"}) == 200


def test_a_stage_without_credentials_stops_before_any_work_naming_what_to_set(
    mlflow_auth_server: AuthServer, no_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(LearnableSparsityError, match=r"refused .*UNAUTHENTICATED.*no credentials"):
        prepare(mlflow_auth_server.uri, "refused")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_auth_server.uri)
    check = tracking_check()
    assert not check.ok and "MLFLOW_TRACKING_USERNAME" in check.detail


def test_a_uri_holding_credentials_is_refused_without_echoing_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://admin:hunter2-secret@127.0.0.1:5000")
    with pytest.raises(LearnableSparsityError, match=r"http://\*\*\*@127.0.0.1:5000") as error:
        tracking_uri(ROOT)
    assert "hunter2" not in str(error.value)


def test_the_scaffold_logs_with_credentials_and_the_password_is_nowhere(
    credentials: AuthServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """A stage's run and a cell's (params, tags, metrics, a model, a figure) through the
    server; then every param, tag and artifact of both, and everything logged or printed, is
    searched for the password."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", credentials.uri)
    caplog.set_level(logging.DEBUG)
    uri = tracking_uri(ROOT)
    params = {"profile": "ci", "train": {"steps": 3}}
    with stage_run(uri, "authenticated", "train", params) as stage:
        run_id = stage.child("cell", {"seed": 0})
        with RunLogger(uri, run_id) as run:
            run.set_tags(system_tags())
            for step in range(3):
                run.log_metrics({"loss": 1.0 / (step + 1)}, step)
            weights = tmp_path / "weights.pt"
            torch.save(torch.nn.Linear(2, 1).state_dict(), weights)
            run.log_artifact(weights, "model")
            run.log_dict({"seed": 0}, "model/config.json")
            run.log_figure(Figure(), "figures/empty.png")
        parent = stage.run_id
    client = MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [0, 1, 2]
    secret = credentials.password
    for found in (parent, run_id):
        data = client.get_run(found).data
        assert secret not in json.dumps([data.params, data.tags])
        downloaded = Path(client.download_artifacts(found, "", tmp_path / found))
        for path in downloaded.rglob("*"):
            assert not path.is_file() or secret.encode() not in path.read_bytes(), path
    printed = capsys.readouterr()
    assert secret not in caplog.text + printed.out + printed.err


class _Jobs:
    """The Ray Jobs client `submit` uses, recording what a cluster would be sent."""

    sent: ClassVar[dict] = {}

    def __init__(self, address: str) -> None:
        self.address = address

    def submit_job(self, **job: object) -> str:
        _Jobs.sent = job
        return str(job["submission_id"])

    async def tail_job_logs(self, job: str):
        yield f"{job} started\n"

    def get_job_status(self, job: str) -> str:
        return "FAILED"  # made no reports: submit logs that and returns


def test_a_submitted_sweep_hands_the_cluster_no_credential(
    credentials: AuthServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What `--submit` sends (entrypoint, runtime environment) holds the server's address and
    no credential: a job's environment is shown by the dashboard and `ray job list`."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", credentials.uri)
    monkeypatch.setattr(sweep, "JobSubmissionClient", _Jobs)
    monkeypatch.chdir(ROOT)
    caplog.set_level(logging.DEBUG)
    assert sweep.submit(Path("sweeps/ssvae_lr.yaml"), "http://127.0.0.1:8265") == "FAILED"
    sent = json.dumps(_Jobs.sent, default=str)
    assert credentials.uri in sent
    assert credentials.password not in sent + caplog.text
    assert "MLFLOW_TRACKING_USERNAME" not in sent and "MLFLOW_TRACKING_PASSWORD" not in sent


def test_a_submission_the_server_refuses_stops_before_the_job_is_sent(
    mlflow_auth_server: AuthServer, no_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_auth_server.uri)
    monkeypatch.setattr(sweep, "JobSubmissionClient", _Jobs)
    monkeypatch.chdir(ROOT)
    _Jobs.sent = {}
    with pytest.raises(LearnableSparsityError, match="MLFLOW_TRACKING_USERNAME"):
        sweep.submit(Path("sweeps/ssvae_lr.yaml"), "http://127.0.0.1:8265")
    assert _Jobs.sent == {}
