"""The pipeline against the tracking server docs/tracking.md sets up, run as written
(``deploy/mlflow-server.sh``, users and grants with ``deploy/mlflow_user.py``; paths made
temporary): MLflow's basic authentication with ``default_permission = NO_PERMISSIONS`` on
127.0.0.1, its files its user's only, the admin password nowhere in its config. One non-admin
user holds EDIT on the experiment, a second has no grant on it, a third READ only. Nothing gets
in without credentials; the preflight and a stage refuse the users who may not log, naming the
grant to ask for, before any file is touched; the scaffold logs as the granted user, and the
password appears nowhere it logs or hands on."""

from __future__ import annotations

import base64
import configparser
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from matplotlib.figure import Figure
from mlflow import MlflowClient

from learnable_sparsity.errors import LearnableSparsityError
from pipelines.commands.preflight import tracking_check
from pipelines.scaffold.cells import Grid, GridCell
from pipelines.scaffold.params import Params
from pipelines.scaffold.stage import run_stage
from pipelines.scaffold.tracking.provenance import system_tags
from pipelines.scaffold.tracking.runs import RunLogger, stage_run
from pipelines.scaffold.tracking.store import prepare, tracking_uri
from pipelines.sweeps import run as sweep
from tests.pipelines.conftest import free_port, wait_for_health

ROOT = Path(__file__).resolve().parents[2]
SEARCH = "/api/2.0/mlflow/experiments/search?max_results=1"
EXPERIMENT = "learnable-sparsity"  # params.yaml's mlflow.experiment
STOP_TIMEOUT_S = 60


@dataclass(frozen=True)
class Server:
    """The documented server: its address, its folder and each user's credentials file."""

    uri: str
    root: Path
    credentials: dict[str, Path]

    def password(self, user: str) -> str:
        config = configparser.ConfigParser()
        config.read(self.credentials[user])
        return config["mlflow"]["mlflow_tracking_password"]


def _as_user(credentials: Path, home: Path) -> dict[str, str]:
    """An environment whose ~/.mlflow/credentials is ``credentials`` (as docs/tracking.md puts
    it on a machine that logs)."""
    (home / ".mlflow").mkdir(parents=True, exist_ok=True)
    (home / ".mlflow" / "credentials").write_bytes(credentials.read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    return {**env, "HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """deploy/mlflow-server.sh in a temporary folder, then the admin's grants: alice EDIT on
    the experiment, bob EDIT on another one only, carol READ on it."""
    folder = tmp_path_factory.mktemp("documented")
    root, port = folder / "srv", free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    process = subprocess.Popen(
        ["bash", str(ROOT / "deploy" / "mlflow-server.sh"), str(root), str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    wait_for_health(process, uri, "deploy/mlflow-server.sh")
    admin = _as_user(root / "admin.credentials", folder / "admin")
    credentials = {"admin": root / "admin.credentials"}
    grants = [
        ("alice", EXPERIMENT, "EDIT"),
        ("bob", "another", "EDIT"),
        ("carol", EXPERIMENT, "READ"),
    ]
    for user, experiment, permission in grants:
        credentials[user] = folder / f"{user}.credentials"
        subprocess.run(
            [
                *(sys.executable, str(ROOT / "deploy" / "mlflow_user.py"), uri, user),
                *(experiment, "--permission", permission),
                *("--credentials", str(credentials[user])),
            ],
            check=True,
            env=admin,
            capture_output=True,
            timeout=120,
        )
    yield Server(uri, root, credentials)
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=STOP_TIMEOUT_S)


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither the variables nor a ~/.mlflow/credentials file (HOME is an empty folder)."""
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def _login(monkeypatch: pytest.MonkeyPatch, server: Server, user: str) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", server.password(user))


@pytest.fixture
def credentials(server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """Logged in as alice, the user with EDIT on the experiment."""
    _login(monkeypatch, server, "alice")
    return server


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {})) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_requests_without_credentials_are_refused(server: Server) -> None:
    assert _status(server.uri + SEARCH) == 401
    assert _status(server.uri + SEARCH, _basic("alice", "not-it")) == 401
    assert _status(server.uri + SEARCH, _basic("alice", server.password("alice"))) == 200


def test_the_server_keeps_its_files_private_and_no_admin_password(server: Server) -> None:
    """umask 077 in the script: the stores, users.db (password hashes), the artifacts and the
    config are the server's user's only; basic_auth.ini holds no password."""
    for path in [server.root, *server.root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} has mode {oct(mode)}"
    assert {"mlflow.db", "users.db", "basic_auth.ini"} <= {p.name for p in server.root.iterdir()}
    config = (server.root / "basic_auth.ini").read_text()
    assert "admin_password" not in config and server.password("admin") not in config
    assert "default_permission = NO_PERMISSIONS" in config


def test_a_stage_without_credentials_stops_before_any_work_naming_what_to_set(
    server: Server, no_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(LearnableSparsityError, match=r"refused .*UNAUTHENTICATED.*no credentials"):
        prepare(server.uri, "refused")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    check = tracking_check(EXPERIMENT)
    assert not check.ok and "MLFLOW_TRACKING_USERNAME" in check.detail


@pytest.mark.parametrize(
    ("user", "has"), [("bob", "no permission to read it"), ("carol", "only READ")]
)
def test_a_user_who_may_not_log_is_refused_by_the_preflight_naming_the_grant(
    server: Server, monkeypatch: pytest.MonkeyPatch, user: str, has: str
) -> None:
    _login(monkeypatch, server, user)
    check = tracking_check(EXPERIMENT)
    assert not check.ok
    assert f"gives user {user!r} {has} on experiment {EXPERIMENT!r}" in check.detail
    assert "grant_user_permission" in check.detail and "'EDIT'" in check.detail
    with pytest.raises(LearnableSparsityError, match="grant_user_permission"):
        prepare(server.uri, EXPERIMENT)
    _login(monkeypatch, server, "alice")
    assert tracking_check(EXPERIMENT).ok


def square(run: object) -> dict:
    """A grid cell's task (never reached in the test below)."""
    raise AssertionError("a cell ran")


@pytest.mark.parametrize("user", [None, "bob", "carol"])
def test_a_changed_cell_is_not_touched_by_a_stage_the_server_refuses(
    server: Server,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    user: str | None,
) -> None:
    """A finished cell whose params changed (its directory would be deleted and rerun): with
    no credentials, or a user without EDIT, the stage stops before last.pt and done.json are
    touched."""
    store = tmp_path / "models"
    cell = store / "a" / "seed0"
    cell.mkdir(parents=True)
    files = {"last.pt": b"weights", "done.json": b'{"fingerprint": "of the old params"}'}
    for name, data in files.items():
        (cell / name).write_bytes(data)
    before = {name: (cell / name).stat().st_mtime_ns for name in files}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    if user is None:
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))
    else:
        _login(monkeypatch, server, user)
    params = Params(
        {
            "profile": "ci",
            "mlflow": {"experiment": EXPERIMENT},
            "ray": {"address": None, "num_cpus": 1, "task_cpus": 1, "task_gpus": 0},
        },
        "params.yaml",
    )

    def main(stage: object) -> None:
        stage.run_grid(Grid(square, [GridCell("a/seed0", {"x": 2})], store))

    with pytest.raises(SystemExit) as exit_:
        run_stage("refused", main, argv=[], params=lambda: params)
    assert exit_.value.code == 1
    assert {name: (cell / name).read_bytes() for name in files} == files
    assert {name: (cell / name).stat().st_mtime_ns for name in files} == before
    assert sorted(p.name for p in cell.iterdir()) == sorted(files)


def test_a_uri_holding_credentials_is_refused_without_echoing_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A password holding '@' or '/' moves where a parser sees the authority end: the URI is
    refused all the same, and no part of the password is shown, by the stage or the preflight."""
    uris = {
        "http://admin:hunter2-secret@127.0.0.1:5000": "hunter2",
        "http://alice:p@ssW0rdTail@host": "ssW0rdTail",
        "http://alice:pa/ssTail@host": "ssTail",
        "http://alice:pa/ssTail@host:5000/path?q=1": "ssTail",
    }
    for uri, secret in uris.items():
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with pytest.raises(LearnableSparsityError, match="holds user information") as error:
            tracking_uri(ROOT)
        check = tracking_check(EXPERIMENT)
        assert not check.ok and "holds user information" in check.detail
        for shown in (str(error.value), check.detail):
            assert secret not in shown and "alice" not in shown and "pa" not in shown.split("(")[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:port5000")
    check = tracking_check(EXPERIMENT)
    assert not check.ok and "port is not a number" in check.detail
    assert "port5000" not in check.detail


def test_the_scaffold_logs_with_credentials_and_the_password_is_nowhere(
    credentials: Server,
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
    with stage_run(uri, EXPERIMENT, "train", params) as stage:
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
    secret = credentials.password("alice")
    for found in (parent, run_id):
        data = client.get_run(found).data
        assert secret not in json.dumps([data.params, data.tags])
        downloaded = Path(client.download_artifacts(found, "", tmp_path / found))
        for path in downloaded.rglob("*"):
            assert not path.is_file() or secret.encode() not in path.read_bytes(), path
    printed = capsys.readouterr()
    assert secret not in caplog.text + printed.out + printed.err


class _Jobs:
    """The Ray Jobs client `submit` uses, recording what a cluster would be sent: the job and
    its working directory packed as Ray packs it (during submit_job, while it exists)."""

    sent: ClassVar[dict] = {}
    packed: ClassVar[dict[str, bytes]] = {}

    def __init__(self, address: str) -> None:
        self.address = address

    def submit_job(self, **job: object) -> str:
        from ray._private.runtime_env.packaging import create_package

        _Jobs.sent = job
        runtime = job["runtime_env"]
        target = Path(runtime["working_dir"]).with_suffix(".zip")
        create_package(runtime["working_dir"], target, True, excludes=runtime["excludes"])
        with zipfile.ZipFile(target) as zipped:
            _Jobs.packed = {i.filename: zipped.read(i) for i in zipped.infolist() if not i.is_dir()}
        target.unlink()
        return str(job["submission_id"])

    async def tail_job_logs(self, job: str):
        yield f"{job} started\n"

    def get_job_status(self, job: str) -> str:
        return "FAILED"  # made no reports: submit logs that and returns


def test_a_submitted_sweep_hands_the_cluster_no_credential(
    credentials: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What `--submit` sends (entrypoint, runtime environment, the packed working directory)
    holds the server's address and no credential (a job's environment is shown by the
    dashboard and `ray job list`), and its files are those git tracks or would track (the
    trials' inputs taken as made: the smoke data are not made here;
    tests/pipelines/test_job_package.py packs inputs): nothing git ignores travels."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", credentials.uri)
    monkeypatch.setattr(sweep, "JobSubmissionClient", _Jobs)
    monkeypatch.chdir(ROOT)
    _Jobs.sent = {}
    if not (ROOT / "data" / "images" / "meta.json").exists():  # inputs not made: no job
        with pytest.raises(LearnableSparsityError, match=r"meta\.json.*`dvc repro`"):
            sweep.submit(Path("sweeps/ssvae_lr.yaml"), "http://127.0.0.1:8265")
        assert _Jobs.sent == {}
    monkeypatch.setattr(sweep, "job_inputs", lambda spec, uri, root: [])
    caplog.set_level(logging.DEBUG)
    assert sweep.submit(Path("sweeps/ssvae_lr.yaml"), "http://127.0.0.1:8265") == "FAILED"
    sent = json.dumps(_Jobs.sent, default=str)
    assert credentials.uri in sent
    secret = credentials.password("alice")
    assert secret not in sent + caplog.text
    assert "MLFLOW_TRACKING_USERNAME" not in sent and "MLFLOW_TRACKING_PASSWORD" not in sent
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    data = {name for name in _Jobs.packed if name.startswith("data/")}
    assert set(_Jobs.packed) - data <= set(tracked)
    assert "pipelines/sweeps/run.py" in _Jobs.packed and ".env" not in _Jobs.packed
    assert not any(secret.encode() in content for content in _Jobs.packed.values())


def test_a_submission_the_server_refuses_stops_before_the_job_is_sent(
    server: Server, no_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    monkeypatch.setattr(sweep, "JobSubmissionClient", _Jobs)
    monkeypatch.chdir(ROOT)
    _Jobs.sent = {}
    with pytest.raises(LearnableSparsityError, match="MLFLOW_TRACKING_USERNAME"):
        sweep.submit(Path("sweeps/ssvae_lr.yaml"), "http://127.0.0.1:8265")
    assert _Jobs.sent == {}
