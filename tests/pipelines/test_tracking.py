"""MLflow: the store (URIs, experiments), parent and child runs, concurrent metrics, artifacts."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

from learnable_sparsity.errors import LearnableSparsityError
from pipelines.scaffold.runner import Resources, run_grid
from pipelines.scaffold.tracking.provenance import system_metrics, system_tags
from pipelines.scaffold.tracking.runs import (
    END_REASON_TAG,
    MAX_PARAM_VALUE_CHARS,
    PARENT_TAG,
    RunLogger,
    flatten_params,
    metric_name,
    stage_run,
)
from pipelines.scaffold.tracking.store import prepare, tracking_uri

ROOT = Path(__file__).resolve().parents[2]
# A killed stage ends its runs and leaves: not Ray's minute of waiting on its dead processes.
KILLED_EXIT_S = 30
POINTS = 1000  # steps per task; two metrics each: 2000 points per task


@pytest.fixture(autouse=True)
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run every test in an empty directory, away from the repository (as DVC's temp copies)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# Ray tasks: top-level functions (conftest puts this folder on the workers' PYTHONPATH).


def log_points(task: dict) -> dict:
    with RunLogger(task["uri"], task["run_id"], flush_every=50) as run:
        for step in range(task["points"]):
            run.log_metrics(
                {"loss": task["offset"] + step, metric_name("alpha", "head0"): step}, step
            )
    return {"run_id": task["run_id"]}


def log_then_fail(task: dict) -> dict:
    with RunLogger(task["uri"], task["run_id"]) as run:
        run.log_metrics({"loss": 1.5}, step=0)
        raise RuntimeError("diverged")


def git_repository(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    return path


def test_tracking_uri_is_the_sqlite_file_at_the_git_root(
    monkeypatch: pytest.MonkeyPatch, elsewhere: Path
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    root = git_repository(elsewhere / "project")
    (root / "pipelines").mkdir()
    uri = tracking_uri(root / "pipelines")
    assert uri == f"sqlite:///{root.resolve()}/mlflow.db"
    assert uri.startswith("sqlite:////")


def test_a_dvc_experiment_copy_logs_to_the_users_store(
    monkeypatch: pytest.MonkeyPatch, elsewhere: Path
) -> None:
    """`dvc exp run --queue/--temp` runs a stage in a git copy under .dvc/tmp/exps/ and names the
    user's repository in $DVC_ROOT: the runs go to that repository's store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = git_repository(elsewhere / "project")
    copy = git_repository(root / ".dvc" / "tmp" / "exps" / "tmpabc123")
    monkeypatch.setenv("DVC_ROOT", str(root))
    assert tracking_uri(copy) == f"sqlite:///{root.resolve()}/mlflow.db"


def test_outside_a_git_repository_a_tracking_uri_is_required(
    monkeypatch: pytest.MonkeyPatch, elsewhere: Path
) -> None:
    """A Ray job's working directory is a copy without .git: a store there would be lost."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(elsewhere.parent))
    with pytest.raises(LearnableSparsityError, match="MLFLOW_TRACKING_URI") as error:
        tracking_uri(elsewhere)
    assert str(elsewhere) in str(error.value)


def test_tracking_uri_environment_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert tracking_uri(Path(".")) == "http://tracking:5000"


def test_experiments_open_on_the_runs_table(mlflow_uri: str) -> None:
    """MLflow 3's UI opens an experiment without a kind in its GenAI view."""
    experiment = MlflowClient(mlflow_uri).get_experiment(prepare(mlflow_uri, "kind exp"))
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_moved_project_writes_its_artifacts_into_its_own_folder(elsewhere: Path) -> None:
    """A store copied with its project pointed at the original clone's mlartifacts: the copy's
    first use moves every location (experiments and runs) to its own folder."""
    original = elsewhere / "original"
    original.mkdir()
    uri = f"sqlite:///{original / 'mlflow.db'}"
    with stage_run(uri, "moved exp", "train", {}) as stage:
        old_run = stage.run_id
        stage.log_dict({"a": 1}, "a.json")
    other = MlflowClient(uri).create_experiment("user's own", "file:///data/elsewhere")
    shutil.copytree(original, elsewhere / "copy")
    shutil.rmtree(original)  # the copy must not need it
    copied = f"sqlite:///{elsewhere / 'copy' / 'mlflow.db'}"
    with stage_run(copied, "moved exp", "train", {}) as stage:
        stage.log_dict({"b": 2}, "b.json")
        new_run = stage.run_id
    client = MlflowClient(copied)
    for run_id in (old_run, new_run):
        uri_of_run = client.get_run(run_id).info.artifact_uri
        assert uri_of_run.startswith((elsewhere / "copy" / "mlartifacts").as_uri()), uri_of_run
    assert client.list_artifacts(old_run)[0].path == "a.json"
    assert (elsewhere / "copy" / "mlartifacts").is_dir()
    assert client.get_experiment(other).artifact_location == "file:///data/elsewhere"


def test_prepare_is_idempotent_and_keeps_artifacts_beside_the_db(mlflow_uri: str) -> None:
    first = prepare(mlflow_uri, "idempotent exp")
    assert prepare(mlflow_uri, "idempotent exp") == first
    experiment = MlflowClient(mlflow_uri).get_experiment(first)
    database = Path(mlflow_uri.removeprefix("sqlite:///"))
    expected = database.parent / "mlartifacts" / "idempotent_exp"
    assert experiment.artifact_location == expected.as_uri()


@pytest.mark.parametrize("uri", ["file:///tmp/mlruns", "/tmp/mlruns", "sqlite:///mlflow.db"])
def test_prepare_refuses_stores_that_do_not_work_here(uri: str) -> None:
    with pytest.raises(LearnableSparsityError, match=re.escape(uri)):
        prepare(uri, "anything")


def test_metric_names_are_sanitised() -> None:
    assert metric_name("alpha", "encoder.self.layer0", "head3") == "alpha/encoder.self.layer0/head3"
    assert metric_name("alpha/enc:0 (self)", "head 3") == "alpha/enc_0 _self_/head 3"
    assert metric_name("/a//b/./c/../", "α") == "a/b/c/__/_"
    with pytest.raises(LearnableSparsityError, match="metric name '/'"):
        metric_name("/")
    with pytest.raises(LearnableSparsityError, match=r"metric name 'x{300}'"):
        metric_name("x" * 300)


def test_params_are_flattened_and_long_values_truncated() -> None:
    params = {
        "nmt": {"model": {"d_model": 64, "alpha_init": None}, "variants": ["softmax", "topk"]},
        "seeds": list(range(3000)),
        "empty": {},
    }
    flat = flatten_params(params)
    assert set(flat) == {
        "nmt.model.d_model",
        "nmt.model.alpha_init",
        "nmt.variants",
        "seeds",
        "empty",
    }
    assert flat["nmt.model.d_model"] == "64"
    assert flat["nmt.model.alpha_init"] == "None"
    assert flat["nmt.variants"] == "['softmax', 'topk']"
    assert flat["empty"] == "{}"
    seeds = flat["seeds"]
    assert len(seeds) == MAX_PARAM_VALUE_CHARS
    assert seeds.startswith("[0, 1, 2, 3")
    assert seeds.endswith(f"... [truncated: 3000 items, {len(str(params['seeds']))} characters]")


def test_parallel_tasks_lose_no_metric(ray_local: None, mlflow_uri: str) -> None:
    client = MlflowClient(mlflow_uri)
    prepare(mlflow_uri, "concurrent")
    with stage_run(mlflow_uri, "concurrent", "train", {"ray": {"task_cpus": 1}}) as stage:
        tasks = [
            {
                "uri": mlflow_uri,
                "run_id": stage.child(f"cell{i}", {"cell": {"seed": i}}),
                "points": POINTS,
                "offset": 10_000 * i,
            }
            for i in range(2)
        ]
        run_grid(log_points, tasks, resources=Resources(num_cpus=1), description="log")
    parent = client.get_run(stage.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.info.run_name == "train"
    assert parent.data.tags["stage"] == "train"
    assert parent.data.params == {"ray.task_cpus": "1"}
    for i, task in enumerate(tasks):
        child = client.get_run(task["run_id"])
        assert child.info.status == "FINISHED"
        assert child.info.run_name == f"cell{i}"
        assert child.data.tags[PARENT_TAG] == stage.run_id
        assert child.data.params == {"cell.seed": str(i)}
        loss = client.get_metric_history(task["run_id"], "loss")
        alpha = client.get_metric_history(task["run_id"], "alpha/head0")
        assert sorted((m.step, m.value) for m in loss) == [
            (step, 10_000 * i + step) for step in range(POINTS)
        ]
        assert sorted((m.step, m.value) for m in alpha) == [(s, s) for s in range(POINTS)]


def test_a_task_exception_marks_its_child_and_the_stage_failed(
    ray_local: None, mlflow_uri: str
) -> None:
    client = MlflowClient(mlflow_uri)
    prepare(mlflow_uri, "failing")
    with (
        pytest.raises(LearnableSparsityError, match="RuntimeError: diverged"),
        stage_run(mlflow_uri, "failing", "train", {}) as stage,
    ):
        failing = stage.child("diverges", {})
        never_started = stage.child("never started", {})
        task = {"uri": mlflow_uri, "run_id": failing}
        run_grid(log_then_fail, [task], resources=Resources(), description="fail")
    assert client.get_run(failing).info.status == "FAILED"
    assert [m.value for m in client.get_metric_history(failing, "loss")] == [1.5]
    assert client.get_run(never_started).info.status == "FAILED"
    assert client.get_run(stage.run_id).info.status == "FAILED"


def test_artifacts_are_kept_beside_the_db_and_retrievable(mlflow_uri: str, elsewhere: Path) -> None:
    client = MlflowClient(mlflow_uri)
    prepare(mlflow_uri, "artifacts")
    source = elsewhere / "notes.txt"
    source.write_text("hello\n")
    figure = Figure()
    figure.add_subplot().plot([0, 1], [1, 0])
    with stage_run(mlflow_uri, "artifacts", "report", {}) as stage:
        with RunLogger(mlflow_uri, stage.child("cell", {})) as run:
            run.log_dict({"bleu": 27.5}, "metrics.json")
            run.log_artifact(source)
            run.log_artifact(source, "texts")
            run.log_figure(figure, "figures/curve.png")
            run.set_tags({"cells": 1})
        stage.log_artifact(source)
    assert client.get_run(run.run_id).data.tags["cells"] == "1"
    database = Path(mlflow_uri.removeprefix("sqlite:///"))
    artifacts = database.parent / "mlartifacts" / "artifacts" / run.run_id / "artifacts"
    stored = sorted(str(p.relative_to(artifacts)) for p in artifacts.rglob("*") if p.is_file())
    assert stored == ["figures/curve.png", "metrics.json", "notes.txt", "texts/notes.txt"]
    downloaded = Path(client.download_artifacts(run.run_id, "metrics.json", str(elsewhere)))
    assert json.loads(downloaded.read_text()) == {"bleu": 27.5}
    figure_file = Path(client.download_artifacts(run.run_id, "figures/curve.png", str(elsewhere)))
    assert figure_file.read_bytes().startswith(b"\x89PNG")
    assert [a.path for a in client.list_artifacts(stage.run_id)] == ["notes.txt"]
    assert not (elsewhere / "mlruns").exists()


def test_a_busy_database_is_retried(mlflow_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare(mlflow_uri, "busy")
    failures = iter([True, True])
    log_batch = MlflowClient.log_batch

    def locked_twice(self: MlflowClient, *args, **kwargs) -> None:
        if next(failures, False):
            raise MlflowException("database is locked", TEMPORARILY_UNAVAILABLE)
        log_batch(self, *args, **kwargs)

    with stage_run(mlflow_uri, "busy", "train", {}) as stage:
        run_id = stage.child("cell", {})
        monkeypatch.setattr(MlflowClient, "log_batch", locked_twice)
        with RunLogger(mlflow_uri, run_id, flush_every=5) as run:
            for step in range(10):
                run.log_metrics({"loss": step}, step)
    assert next(failures, None) is None  # both simulated lock errors were met
    history = MlflowClient(mlflow_uri).get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == list(range(10))


def test_a_resumed_attempt_writes_no_point_twice(mlflow_uri: str) -> None:
    """An attempt killed after flushing points beyond its checkpoint (step 4 here), resumed from
    the checkpoint: the points it logs again are written once, the running total again."""
    prepare(mlflow_uri, "resumed")
    with stage_run(mlflow_uri, "resumed", "train", {}) as stage:
        run_id = stage.child("cell", {})
        first = RunLogger(mlflow_uri, run_id, flush_every=3)
        for step in range(8):
            first.log_metrics({"loss": step, "total": 1.0}, step)
        first.flush()  # then killed: steps 0-7 written, its checkpoint holds step 4
        with RunLogger(mlflow_uri, run_id, flush_every=3) as second:
            second.skip_written(except_keys={"total"})
            for step in range(5, 10):
                second.log_metrics({"loss": step, "total": 2.0}, step)
    client = MlflowClient(mlflow_uri)
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == list(range(10))
    assert client.get_run(run_id).data.metrics["total"] == 2.0


def test_bad_metrics_and_statuses_name_the_value(mlflow_uri: str) -> None:
    run = RunLogger(mlflow_uri, "no-such-run")
    with pytest.raises(LearnableSparsityError, match="metric name 'bad:name'"):
        run.log_metrics({"bad:name": 1.0}, step=0)
    with pytest.raises(LearnableSparsityError, match="metric 'loss' at step 3 is 'high'"):
        run.log_metrics({"loss": "high"}, step=3)  # type: ignore[dict-item]
    with pytest.raises(LearnableSparsityError, match="got 'DONE'"):
        run.finish("DONE")
    with pytest.raises(LearnableSparsityError, match="flush_every must be an int >= 1, got 0"):
        RunLogger(mlflow_uri, "no-such-run", flush_every=0)


def test_runs_of_a_driver_that_is_gone_are_marked_killed(mlflow_uri: str) -> None:
    experiment = prepare(mlflow_uri, "orphans")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a finished process: its pid is not alive
    client = MlflowClient(mlflow_uri)
    tags = {"stage": "train", "driver.host": socket.gethostname()}
    orphan = client.create_run(experiment, tags={**tags, "driver.pid": str(gone.pid)})
    alive = client.create_run(experiment, tags={**tags, "driver.pid": str(os.getpid())})
    with stage_run(mlflow_uri, "orphans", "train", {}) as stage:
        assert stage.run_id not in (orphan.info.run_id, alive.info.run_id)
    killed = client.get_run(orphan.info.run_id)
    assert killed.info.status == "KILLED"
    assert f"pid {gone.pid}" in killed.data.tags[END_REASON_TAG]
    assert client.get_run(alive.info.run_id).info.status == "RUNNING"  # its driver still runs


@pytest.mark.parametrize(("with_ray", "group"), [(False, False), (True, False), (True, True)])
def test_sigterm_ends_a_stage_and_its_run_killed(
    mlflow_uri: str, elsewhere: Path, with_ray: bool, group: bool
) -> None:
    """A plain ``kill`` ends the stage's run KILLED, also once the stage has started Ray (issue
    38: Ray's own SIGTERM handler aborted the process, rc 134, and the run ended FAILED), with
    status 143 and one line, no traceback; signalled as a process group (its local Ray's
    processes too), it does not wait on them (issue 47: 62 s)."""
    (elsewhere / "params.yaml").write_text("profile: ci\nmlflow: {experiment: sigterm}\n")
    script = (
        "import time\n"
        "from pipelines.scaffold import runner\n"
        "from pipelines.scaffold.stage import run_stage\n"
        "def main(stage):\n"
        + ("    runner.connect(None, 1)\n" if with_ray else "")
        + "    print(stage.run.run_id, flush=True)\n"
        + (  # waiting on a grid's Ray task, as a stage does
            "    runner.run_grid(time.sleep, [60], resources=runner.Resources(num_cpus=1), "
            "description='sleepy')\n"
            if with_ray
            else "    time.sleep(60)\n"
        )
        + "run_stage('sleepy', main)\n"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=elsewhere,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    )
    run_id = driver.stdout.readline().strip()
    time.sleep(3)  # into the wait for the task
    if group:
        os.killpg(driver.pid, signal.SIGTERM)
    else:
        driver.send_signal(signal.SIGTERM)
    code = driver.wait(timeout=KILLED_EXIT_S)
    stderr = driver.stderr.read()
    assert code == 128 + signal.SIGTERM, stderr[-3000:]
    assert "sleepy killed by SIGTERM: its MLflow runs are KILLED" in stderr
    assert "Traceback" not in stderr
    assert MlflowClient(mlflow_uri).get_run(run_id).info.status == "KILLED"


def test_system_metrics_are_sampled_while_a_block_runs(mlflow_uri: str) -> None:
    with (
        stage_run(mlflow_uri, "system exp", "train", {}) as stage,
        system_metrics(stage, interval_s=0.2),
    ):
        time.sleep(1.5)
    client = MlflowClient(mlflow_uri)
    history = client.get_metric_history(stage.run_id, "system/cpu_utilization_percentage")
    assert len(history) >= 2
    assert "system/system_memory_usage_megabytes" in client.get_run(stage.run_id).data.metrics


@pytest.mark.parametrize(
    ("raised", "status"),
    [(SystemExit(0), "FINISHED"), (SystemExit(1), "FAILED"), (KeyboardInterrupt(), "KILLED")],
)
def test_a_run_ends_with_how_its_block_ended(
    mlflow_uri: str, raised: BaseException, status: str
) -> None:
    """Ray Tune ends a trial its scheduler stopped early with sys.exit(0): a clean end."""
    with stage_run(mlflow_uri, "endings", "train", {}) as stage:
        run_id = stage.child("cell", {})
        with pytest.raises(type(raised)), RunLogger(mlflow_uri, run_id):
            raise raised
    assert MlflowClient(mlflow_uri).get_run(run_id).info.status == status


def test_a_new_store_is_its_owners_only(tmp_path: Path) -> None:
    """mlflow.db 0600 (runs, params: nobody else's to read) and its artifacts folder 0700,
    whatever the umask; a run logged into it keeps them so."""
    database = tmp_path / "project" / "mlflow.db"
    old = os.umask(0o022)
    try:
        uri = f"sqlite:///{database}"
        with stage_run(uri, "private", "train", {"profile": "ci"}) as stage:
            run = RunLogger(uri, stage.child("cell", {"seed": 0}))
            run.log_dict({"seed": 0}, "model/config.json")
            run.finish("FINISHED")
    finally:
        os.umask(old)
    assert database.stat().st_mode & 0o777 == 0o600
    assert (database.parent / "mlartifacts").stat().st_mode & 0o777 == 0o700


def test_a_server_that_does_not_answer_stops_a_stage_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before any work, and without MLflow's minutes of retries: one line naming the server."""
    from pipelines.scaffold.params import Params
    from pipelines.scaffold.stage import run_stage

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    params = Params({"profile": "ci", "mlflow": {"experiment": "x"}}, "params.yaml")
    ran: list[object] = []
    with caplog.at_level("ERROR"), pytest.raises(SystemExit):
        run_stage("unreachable", ran.append, argv=[], params=lambda: params)
    assert ran == []
    assert f"the MLflow tracking server {uri} does not answer" in caplog.text
    assert "Traceback" not in caplog.text


def test_a_run_records_which_cpu_kernels_were_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """make repro's pins (docs/pipeline.md, "Rerunning on another machine") and the caps that
    emulate another machine are tagged as set, or as unset."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    tags = system_tags()
    assert tags["system.ATEN_CPU_CAPABILITY"] == "default"
    assert tags["system.MKL_CBWR"] == "COMPATIBLE"
    assert tags["system.ONEDNN_MAX_CPU_ISA"] == "SSE41"
    assert tags["system.MKL_ENABLE_INSTRUCTIONS"] == "unset"
