"""The stage scaffold: grid cells are reused only when nothing they depend on changed, stale cells
are removed, failures are reported, and errors end a stage with one clear message."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import build
from pipelines.scaffold import cells as grid_cells
from pipelines.scaffold import runner
from pipelines.scaffold.cells import CellRun, Grid, GridCell
from pipelines.scaffold.layout import done
from pipelines.scaffold.params import Params
from pipelines.scaffold.runner import RaySettings
from pipelines.scaffold.stage import Stage, run_stage

# Ray tasks must be top-level functions of an importable module (conftest puts this folder on the
# workers' PYTHONPATH).


def count_and_square(run: CellRun) -> dict:
    """Appends a line to the cell's ``calls`` file (how often it ran) and squares x."""
    calls = run.directory / "calls"
    calls.write_text(calls.read_text() + "x\n" if calls.exists() else "x\n")
    run.log_metrics({"square": run.payload["x"] ** 2}, step=0)
    return {"square": run.payload["x"] ** 2}


def fail_on_first_attempt(run: CellRun) -> dict:
    """Logs a step and flushes; the first attempt then dies, the second passes. The flush is a
    checkpoint's (the cell's wall time with the points), or with payload ``buffer`` a full
    buffer's, before any checkpoint (the points alone)."""
    run.log_metrics({"loss": 1.0}, step=1)
    if run.payload.get("buffer"):
        run.run.flush()
    else:
        run.flush()
    marker = run.directory / "attempted"
    if not marker.exists():
        marker.touch()
        raise LearnableSparsityError("interrupted")
    run.log_metrics({"loss": 0.5}, step=2)
    return {"attempts": 2}


def fail_on_three(run: CellRun) -> dict:
    if run.payload["x"] == 3:
        raise LearnableSparsityError("three is broken")
    return {"x": run.payload["x"]}


def train_a_line(run: CellRun) -> dict:
    """Fits nothing, but logs a model like a training task."""
    run.log_model(torch.nn.Linear(2, 1))
    return {"trained": run.key}


def params(task_cpus: float = 1, task_gpus: float = 0) -> Params:
    return Params(
        {
            "profile": "ci",
            "mlflow": {"experiment": "stage-scaffold"},
            "ray": {
                "address": None,
                "num_cpus": 2,
                "task_cpus": task_cpus,
                "task_gpus": task_gpus,
            },
        },
        "params.yaml",
    )


def calls(store: Path, key: str) -> int:
    path = store / key / "calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


def grid(
    store: Path, mlflow_uri: str, xs: dict[str, int], inputs: tuple[Path, ...] = (), **ray: float
) -> dict[str, dict]:
    stage = Stage("scaffold-test", params(**ray), mlflow_uri)
    cells = [GridCell(key, {"x": x}, inputs) for key, x in xs.items()]
    try:
        return stage.run_grid(Grid(count_and_square, cells, store))
    finally:
        stage.finish("FINISHED")


def test_finished_cells_are_reused_and_changed_ones_rerun(
    ray_local: None, mlflow_uri: str, store: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("v1")
    xs = {"a/seed0": 2, "b/seed0": 3}
    results = grid(store, mlflow_uri, xs, (data,))
    assert list(results.items()) == [("a/seed0", {"square": 4}), ("b/seed0", {"square": 9})]
    assert json.loads(done(store / "a/seed0").read_text())["result"] == {"square": 4}
    grid(store, mlflow_uri, xs, (data,))
    assert calls(store, "a/seed0") == calls(store, "b/seed0") == 1  # both reused

    grid(store, mlflow_uri, {"a/seed0": 2, "b/seed0": 5}, (data,))  # b's settings changed
    assert (calls(store, "a/seed0"), calls(store, "b/seed0")) == (1, 1)  # b cleared, then ran once
    assert json.loads(done(store / "b/seed0").read_text())["result"] == {"square": 25}

    data.write_text("v2")  # an input file changed: both rerun
    grid(store, mlflow_uri, {"a/seed0": 2, "b/seed0": 5}, (data,))
    assert (calls(store, "a/seed0"), calls(store, "b/seed0")) == (1, 1)
    assert json.loads(done(store / "a/seed0").read_text())["fingerprint"]


def test_code_and_threads_are_part_of_the_fingerprint(
    ray_local: None, mlflow_uri: str, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fingerprint() -> str:
        return json.loads(done(store / "a").read_text())["fingerprint"]

    grid(store, mlflow_uri, {"a": 1})
    one_thread = fingerprint()
    grid(store, mlflow_uri, {"a": 1}, task_cpus=2)  # torch threads change the numbers
    assert fingerprint() != one_thread
    two_threads = fingerprint()
    monkeypatch.setattr(grid_cells, "code_digest", lambda module: "other code")
    grid(store, mlflow_uri, {"a": 1}, task_cpus=2)
    assert fingerprint() != two_threads


def test_cells_that_left_the_grid_are_removed(
    ray_local: None, mlflow_uri: str, store: Path
) -> None:
    grid(store, mlflow_uri, {"D8/x/seed0": 1, "D8/x/seed1": 2, "D16/x/seed0": 3})
    grid(store, mlflow_uri, {"D8/x/seed0": 1})
    assert sorted(p.parent.relative_to(store).as_posix() for p in store.rglob("done.json")) == [
        "D8/x/seed0"
    ]
    assert not (store / "D16").exists()


def test_an_interrupted_cell_keeps_its_directory_to_resume(
    ray_local: None, mlflow_uri: str, store: Path
) -> None:
    grid(store, mlflow_uri, {"a": 1})
    done(store / "a").unlink()  # killed after the checkpoint, before it finished
    (store / "a" / "last.pt").write_text("checkpoint")
    grid(store, mlflow_uri, {"a": 1})
    assert (store / "a" / "last.pt").exists() and calls(store, "a") == 2


def test_a_resumed_cell_drops_the_partial_writes_of_the_killed_one(
    ray_local: None, mlflow_uri: str, store: Path
) -> None:
    grid(store, mlflow_uri, {"a": 1})
    done(store / "a").unlink()  # killed while writing a checkpoint (and a file of a sub-folder)
    (store / "a" / ".last.pt.4242.tmp").write_bytes(b"half a checkpoint")
    (store / "a" / "sub").mkdir()
    (store / "a" / "sub" / ".scores.json.x1y2.tmp").write_text("{")
    grid(store, mlflow_uri, {"a": 1})
    assert not list(store.rglob("*.tmp"))
    assert list(json.loads(done(store / "a").read_text())["files"]) == ["calls"]


def test_duplicate_keys_and_missing_inputs_fail_before_any_task(
    mlflow_uri: str, store: Path, tmp_path: Path
) -> None:
    stage = Stage("scaffold-test", params(), mlflow_uri)
    with pytest.raises(LearnableSparsityError, match=r"the grid has the cells \['a'\] twice"):
        twice = [GridCell("a", {"x": 1}), GridCell("a", {"x": 2})]
        stage.run_grid(Grid(count_and_square, twice, store))
    missing = tmp_path / "nowhere.txt"
    with pytest.raises(LearnableSparsityError, match=r"nowhere\.txt is missing"):
        stage.run_grid(Grid(count_and_square, [GridCell("a", {"x": 1}, (missing,))], store))
    assert not store.exists()


def test_a_failed_cell_is_reported_and_its_run_failed(
    ray_local: None, mlflow_uri: str, store: Path
) -> None:
    stage = Stage("scaffold-failing", params(), mlflow_uri)
    cells = [GridCell(f"x{x}", {"x": x}) for x in (1, 3)]
    with pytest.raises(LearnableSparsityError, match=r"1 of 2 cells failed:\n.*three is broken"):
        stage.run_grid(Grid(fail_on_three, cells, store))
    stage.finish("FAILED")
    assert done(store / "x1").exists() and not done(store / "x3").exists()
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs(
        [client.get_experiment_by_name("stage-scaffold").experiment_id],
        "tags.stage = 'scaffold-failing'",
    )
    status = {run.info.run_name: run.info.status for run in runs}
    assert status == {"x1": "FINISHED", "x3": "FAILED", "scaffold-failing": "FAILED"}


def test_more_cpus_per_cell_than_a_node_has_is_refused_before_any_run(
    ray_local: None, mlflow_uri: str, store: Path
) -> None:
    """ray.task_cpus = 3 on the 2-CPU local Ray: refused, naming the key and value, before the
    stage creates a run (its own or a cell's, which would end FAILED), a cell's directory, or
    removes a cell finished under the earlier ray.task_cpus."""
    grid(store, mlflow_uri, {"x1": 1})
    finished = done(store / "x1").read_text()
    stage = Stage("scaffold-oversized", params(task_cpus=3), mlflow_uri)
    cells = [GridCell(f"x{x}", {"x": x}) for x in (1, 2)]
    with pytest.raises(LearnableSparsityError, match=r"num_cpus=3\b.*ray\.task_cpus"):
        stage.run_grid(Grid(count_and_square, cells, store))
    stage.finish("FAILED")
    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("stage-scaffold")  # the first grid made it
    assert client.search_runs([experiment.experiment_id], "tags.stage = 'scaffold-oversized'") == []
    assert sorted(path.name for path in store.iterdir()) == ["x1"]
    assert done(store / "x1").read_text() == finished


def test_a_gpu_request_is_refused_even_when_every_cell_is_reused(
    ray_local: None, mlflow_uri: str, store: Path
) -> None:
    """Issue 38: ray.task_gpus = 1 on a machine without a GPU passed (a FINISHED run, the value
    in dvc.lock) whenever every cell was reused; the refusal must not depend on the work left."""
    grid(store, mlflow_uri, {"x1": 1})
    with pytest.raises(LearnableSparsityError, match=r"num_gpus=1\b.*ray\.task_gpus"):
        grid(store, mlflow_uri, {"x1": 1}, task_gpus=1)
    assert calls(store, "x1") == 1


def test_a_local_ray_is_judged_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a running Ray or a cluster, the request is judged against what a local Ray would
    get (ray.num_cpus, the GPUs torch sees), without starting one."""
    monkeypatch.setattr(runner.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runner, "connect", lambda *args: pytest.fail("started a Ray"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def settings(**ray: float) -> RaySettings:
        return build(RaySettings, {"num_cpus": 2, **ray}, "ray")

    runner.check_ready(settings(task_cpus=2))
    with pytest.raises(LearnableSparsityError, match=r"num_cpus=3\b.*\(largest: 2\)"):
        runner.check_ready(settings(task_cpus=3))
    monkeypatch.setattr(runner.torch.cuda, "device_count", lambda: 0)
    with pytest.raises(LearnableSparsityError, match=r"num_gpus=1\b.*cluster: 0 GPUs"):
        runner.check_ready(settings(task_gpus=1))


def test_a_users_error_is_one_message_and_leaves_no_run(
    tmp_path: Path,
    mlflow_uri: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    (tmp_path / "params.yaml").write_text(
        "profile: ci\nmlflow: {experiment: user-error}\nray: {num_cpus: 0}\n"
    )

    def main(stage: Stage) -> None:
        from pipelines.scaffold.runner import RaySettings

        stage.settings("ray", RaySettings)

    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as exit_:
        run_stage("user-error", main, argv=[])
    assert exit_.value.code == 1
    assert "params.yaml: ray.num_cpus must be >= 1, got 0" in caplog.text
    assert "Traceback" not in caplog.text and "--verbose" in caplog.text
    client = MlflowClient(mlflow_uri)
    assert not client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "tags.stage = 'user-error'"
    )
    caplog.clear()
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit):
        run_stage("user-error", main, argv=["--verbose"])
    assert "Traceback" in caplog.text


def test_damaged_files_of_a_finished_cell_make_it_run_again(
    ray_local: None, mlflow_uri: str, store: Path
) -> None:
    grid(store, mlflow_uri, {"a": 1, "b": 2})
    (store / "a" / "calls").write_text("truncated")  # a damaged checkpoint, say
    grid(store, mlflow_uri, {"a": 1, "b": 2})
    assert (store / "a" / "calls").read_text() == "x\n"  # cleared and run from scratch
    assert calls(store, "b") == 1  # intact: reused


@pytest.mark.parametrize("flushed", ["at a checkpoint", "as its buffer filled"])
def test_an_interrupted_cell_continues_its_mlflow_run(
    ray_local: None, mlflow_uri: str, store: Path, flushed: str
) -> None:
    cells = [GridCell("a", {"x": 1, "buffer": flushed == "as its buffer filled"})]
    name = f"scaffold-resume-{flushed.split()[-1]}"
    for attempt in (1, 2):
        stage = Stage(name, params(), mlflow_uri)
        try:
            stage.run_grid(Grid(fail_on_first_attempt, cells, store))
        except LearnableSparsityError:
            assert attempt == 1
            stage.finish("FAILED")
        else:
            stage.finish("FINISHED")
    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("stage-scaffold").experiment_id
    children = client.search_runs([experiment], f"tags.stage = '{name}' and tags.cell = 'a'")
    assert len(children) == 1  # the second attempt continued the first one's run
    run = children[0]
    assert run.info.status == "FINISHED" and run.data.tags["resumed"] == "true"
    # step 1, which the first attempt wrote, is not written again by the second
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]
    seconds = client.get_metric_history(run.info.run_id, "task_seconds")
    assert len(seconds) == (3 if flushed == "at a checkpoint" else 1)
    assert seconds[-1].value >= seconds[0].value > 0
    assert "system.cpu_capability" in run.data.tags and "system.torch" in run.data.tags


def test_a_cells_run_has_source_profile_datasets_and_model(
    ray_local: None, mlflow_uri: str, store: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpora" / "tiny"
    corpus.mkdir(parents=True)
    (corpus / "train.src").write_text("a b\nc d\ne\n")
    (corpus / "train.tgt").write_text("x\ny\nz\n")
    files = (corpus / "train.src", corpus / "train.tgt")
    stage = Stage("scaffold-metadata", params(), mlflow_uri)
    stage.run_grid(Grid(train_a_line, [GridCell("tiny/seed0", {"x": 1}, files, files)], store))
    stage.finish("FINISHED")
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs(
        [stage.run.experiment_id], "tags.stage = 'scaffold-metadata' and tags.cell = 'tiny/seed0'"
    )
    parent = client.get_run(stage.run.run_id)
    for tagged in (run, parent):
        assert len(tagged.data.tags["mlflow.source.git.commit"]) == 40
        assert tagged.data.tags["mlflow.source.name"] == "scaffold-metadata"
        assert tagged.data.tags["profile"] == "ci"
    assert run.data.params["profile"] == "ci"
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.name == corpus.as_posix()
    assert json.loads(dataset.dataset.profile) == {
        "train.src": {"rows": 3},
        "train.tgt": {"rows": 3},
    }
    assert {tag.key: tag.value for tag in dataset.tags}[
        "mlflow.data.context"
    ] == "scaffold-metadata"
    model = {item.path for item in client.list_artifacts(run.info.run_id, "model")}
    assert model == {"model/weights.pt"}  # a Linear has no config


def test_scores_are_logged_on_the_run_that_trained_the_model(
    ray_local: None, mlflow_uri: str, store: Path
) -> None:
    """An evaluation stage puts its scores (and files) on the training cell's run (one row in
    the UI)."""
    trained = Stage("scaffold-train", params(), mlflow_uri)
    trained.run_grid(Grid(count_and_square, [GridCell("a", {"x": 3})], store))
    trained.finish("FINISHED")
    for _ in range(2):  # a second annotation with equal values adds no points
        evaluation = Stage("scaffold-evaluate", params(), mlflow_uri)
        files = {"a": [store / "a" / "calls"]}
        evaluation.annotate_training_runs(
            "scaffold-train", store, {"a": {"test/bleu": 31.5}}, files=files, artifact="scored"
        )
        evaluation.finish("FINISHED")
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs(
        [trained.run.experiment_id], "tags.stage = 'scaffold-train' and tags.cell = 'a'"
    )
    assert run.data.metrics["square"] == 9 and run.data.metrics["test/bleu"] == 31.5
    assert len(client.get_metric_history(run.info.run_id, "test/bleu")) == 1
    assert [a.path for a in client.list_artifacts(run.info.run_id, "scored")] == ["scored/calls"]


def test_outputs_are_written_and_logged_to_the_stage_run_where_asked(
    mlflow_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # results/<stage>/metrics.json lands here
    stage = Stage("scaffold-outputs", params(), mlflow_uri)
    source = tmp_path / "cell" / "figure.png"
    source.parent.mkdir()
    source.write_bytes(b"\x89PNG not really")
    copied = tmp_path / "reports" / "figure.png"
    stage.copy_file(source, copied, artifact="figures/x")
    stage.write_metrics({"softmax": {"train_ratio": 1.0}, "steps": 3}, logged=True)
    stage.finish("FINISHED")
    assert copied.read_bytes() == source.read_bytes()
    client = MlflowClient(mlflow_uri)
    run = client.get_run(stage.run.run_id)
    assert run.data.metrics == {"softmax/train_ratio": 1.0, "steps": 3.0}
    logged = {a.path for a in client.list_artifacts(stage.run.run_id, "figures/x")}
    assert logged == {"figures/x/figure.png"}
    assert "metrics.json" in {a.path for a in client.list_artifacts(stage.run.run_id)}


def test_an_unknown_profile_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``profile: papre`` (a typo of paper) would label every run: every stage (run_stage)
    and the preflight refuse it, listing the known profiles, before main runs."""
    from pipelines.commands.preflight import profile_check

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    typo = Params({"profile": "papre", "mlflow": {"experiment": "x"}}, "params.yaml")
    ran = []
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit):
        run_stage("typo", ran.append, argv=[], params=lambda: typo)
    assert ran == [] and not (tmp_path / "mlflow.db").exists()
    assert "profile 'papre' is not a known profile; known: ['bible'," in caplog.text
    assert "'paper'" in caplog.text and "'smoke'" in caplog.text
    check = profile_check(typo)
    assert not check.ok and "'papre'" in check.detail
    assert profile_check(Params({"profile": "paper"}, "params.yaml")).ok
