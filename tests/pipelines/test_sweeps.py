"""Sweep specs: parsing, overrides, the checks before anything runs (every error names the spec,
the key and the value), the committed example specs, and what a trial reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow import MlflowClient
from ray.train._internal.storage import StorageContext
from ray.tune.experiment import Trial

from learnable_sparsity.errors import LearnableSparsityError, MissingInputError
from learnable_sparsity.settings import SettingsError
from pipelines.scaffold.tracking.runs import stage_run, start_stage_run
from pipelines.scaffold.tracking.store import MlflowSettings
from pipelines.sweeps.run import REPORTS, fetch_reports
from pipelines.sweeps.spec import apply_override, load_spec, parse_axis
from pipelines.sweeps.trials import (
    STOPPED_TAG,
    SWEEP_TAG,
    TRIAL_TAG,
    StopOnWrongMetric,
    SweepProgress,
    error_text,
    scalar_results,
    trial_name,
)

ROOT = Path(__file__).resolve().parents[2]
SSVAE = {
    "stages": ["train_lvm@ssvae"],
    "profile": "ci",
    "search": {
        "lvm.ssvae.methods": {"grid": ["sparsemax", "sfe"]},
        "lvm.ssvae.lr.default": {"loguniform": [1.0e-4, 1.0e-2]},
    },
    "metric": "accuracy",
    "mode": "max",
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with the project's params and profiles and the files the grids of
    the example specs look at (the images stage's index, the APE triplets, the Bible corpus's
    record); empty files are enough to build the grids."""
    for path in [ROOT / "params.yaml", *sorted((ROOT / "profiles").glob("*.yaml"))]:
        name = path.relative_to(ROOT)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(path.read_text())
    images = tmp_path / "data/images"
    images.mkdir(parents=True)
    kinds = {"digits": {"kind": "images"}, "digits_game": {"kind": "game"}}
    (images / "meta.json").write_text(json.dumps(kinds))
    for split in ("train", "valid", "test"):
        for side in ("src", "mt", "pe"):
            path = tmp_path / f"data/ape/real/{split}.{side}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    # analyze_heads reads a corpus's source language from the settings its meta.json records.
    bible = tmp_path / "data/corpora/bible/meta.json"
    bible.parent.mkdir(parents=True)
    bible.write_text(json.dumps({"source": {"source": "sword", "sizes": {"valid": 1, "test": 1}}}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def spec_file(project: Path, spec: dict[str, Any], name: str = "sweep") -> Path:
    path = project / "sweeps" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def load(path: Path):
    return load_spec(path, Path("params.yaml"), Path("profiles"))


@pytest.mark.parametrize("example", sorted((ROOT / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_committed_spec_checks_out(project: Path, example: Path) -> None:
    spec = load(example)
    inputs = spec.check_trials("sqlite:///unused.db")
    assert inputs  # the files its trials read, which no stage of the chain writes
    assert all(not str(path).startswith(("models/nmt", "models/ape/")) for path in inputs)


def test_a_spec_builds_the_trials_params_from_the_profile_and_overrides(project: Path) -> None:
    spec = load(spec_file(project, {**SSVAE, "params": {"lvm.ssvae.steps": 40}}))
    assert spec.name == "sweep"
    params = spec.params_for({"lvm.ssvae.methods": "sfe", "lvm.ssvae.lr.default": 0.003})
    assert params.get("profile", str) == "ci"
    assert params.get("lvm.ssvae.steps", int) == 40  # the spec's fixed override
    assert params.get("lvm.ssvae.batch_size", int) == 16  # from profiles/ci.yaml
    assert params.get("lvm.ssvae.methods", list) == ["sfe"]  # one entry of the list
    assert params.get("lvm.ssvae.lr", dict) == {"default": 0.003}
    assert spec.params.get("lvm.ssvae.methods", list) == ["dense", "sparsemax", "sfe"]
    space = spec.search_space()
    assert space["lvm.ssvae.methods"] == {"grid_search": ["sparsemax", "sfe"]}
    assert space["lvm.ssvae.lr.default"].lower == pytest.approx(1e-4)
    assert [c["lvm.ssvae.lr.default"] for c in spec.combinations()] == [1e-4, 1e-2, 1e-4, 1e-2]


def test_overrides_select_list_entries_and_mapping_entries() -> None:
    data = {"ape": {"regimes": {"low": {"systems": ["a", "b"]}, "aug": {}}, "seeds": [0, 1]}}
    apply_override(data, "ape.seeds", 1, "search.ape.seeds")
    apply_override(data, "ape.regimes", "low", "params.ape.regimes")
    apply_override(data, "ape.regimes.low.systems", ["b"], "search.x")
    assert data == {"ape": {"regimes": {"low": {"systems": ["b"]}}, "seeds": [1]}}
    with pytest.raises(SettingsError, match=r"selects 'mid' of ape.regimes, which has \['low'\]"):
        apply_override(data, "ape.regimes", "mid", "search.ape.regimes")
    with pytest.raises(SettingsError, match=r"'ape.seed', which is not in the params; ape has"):
        apply_override(data, "ape.seed", 1, "search.ape.seed")
    with pytest.raises(SettingsError, match=r"ape.seeds is not a section"):
        apply_override(data, "ape.seeds.first", 1, "search.ape.seeds.first")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"search": {"lvm.ssvae.lrate": {"grid": [1]}}}, "'lvm.ssvae.lrate', which is not in"),
        ({"search": {"lvm.ssvae.steps": {"grid": []}}}, "steps.grid must be a non-empty list"),
        ({"search": {"lvm.ssvae.steps": {"range": [1, 2]}}}, "must be one of {grid, choice"),
        ({"search": {"lvm.ssvae.lr.default": {"loguniform": [0, 1]}}}, "must be > 0"),
        ({"search": {"lvm.ssvae.steps": {"randint": [1.5, 9]}}}, "must be integers"),
        ({"search": {"lvm.ssvae.steps": {"uniform": [9, 1]}}}, "low < high"),
        ({"search": {}}, "search must map at least one dotted key"),
        ({"stages": ["train_bert"]}, "has 'train_bert'; sweepable"),
        ({"mode": "best"}, "mode must be one of"),
        ({"profile": "huge"}, "no profile 'huge'"),
        ({"epochs": 3}, "unknown keys ['epochs']"),
        ({"params": {"lvm.ssvae.methods": ["sfe"]}}, "search and params both set"),
        ({"plot": {"group": "lvm.ssvae.seeds"}}, "plot.group must be a search key"),
        ({"asha": {"metric": "loss", "mode": "min", "max_t": 0}}, "asha.max_t must be"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_spec_and_key(
    project: Path, change: dict, message: str
) -> None:
    path = spec_file(project, {**SSVAE, **change})
    with pytest.raises(LearnableSparsityError) as error:
        load(path)
    assert str(error.value).startswith(f"{path}: ")
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("search", "message"),
    [
        # a value the stage's settings refuse, at the end of a range
        ({"lvm.ssvae.lr.default": {"uniform": [-1.0, 1.0]}}, "lvm.ssvae.lr"),
        ({"lvm.ssvae.methods": {"grid": ["sparsemax", "magic"]}}, "has 'magic'; choose from"),
        # a trial that would run two cells of the grid
        ({"lvm.ssvae.lr.default": {"grid": [0.001]}}, "gives train_lvm@ssvae 3 grid cells"),
    ],
)
def test_every_trial_is_checked_before_anything_runs(
    project: Path, search: dict, message: str
) -> None:
    spec = load(spec_file(project, {**SSVAE, "search": search}))
    with pytest.raises(LearnableSparsityError, match=message):
        spec.check_trials("sqlite:///unused.db")


def test_a_missing_input_stays_a_missing_input(project: Path) -> None:
    (project / "data/images/meta.json").unlink()
    spec = load(spec_file(project, SSVAE))
    with pytest.raises(MissingInputError, match=r"data/images/meta.json is missing"):
        spec.check_trials("sqlite:///unused.db")


def test_a_chain_reads_what_its_first_stage_writes_from_the_trial(project: Path) -> None:
    spec = load(ROOT / "sweeps/nmt_alpha_init.yaml")
    inputs = {str(path) for path in spec.check_trials("sqlite:///unused.db")}
    assert "data/bpe/smoke/bpe.model" in inputs and "data/corpora/smoke/test.src" in inputs
    assert not any(path.startswith("models/") for path in inputs)  # the trial trains them


def test_results_are_the_numbers_the_tasks_return() -> None:
    evaluate_nmt = {
        "metrics": {"bleu": {"score": 41.5, "signature": "nrefs:1"}, "chrf": {"score": 60.0}},
        "empty_hypotheses": 0,
    }
    train_nmt = {"summary": {"final_valid_nll": 1.25, "steps": 600}, "history": {"train": []}}
    evaluate_ape = {"test": {"ter": {"score": 20.0}}, "valid": {"ter": {"score": 21.0}}}
    lvm = {"metrics": {"accuracy": 0.9, "decoder_calls": 1.5}, "curves": {"loss": [[1], [2]]}}
    assert scalar_results(evaluate_nmt) == {"bleu": 41.5, "chrf": 60.0, "empty_hypotheses": 0.0}
    assert scalar_results(train_nmt) == {"final_valid_nll": 1.25, "steps": 600.0}
    assert scalar_results(evaluate_ape) == {"test/ter": 20.0, "valid/ter": 21.0}
    assert scalar_results(lvm) == {"accuracy": 0.9, "decoder_calls": 1.5}


def test_a_trial_is_named_by_its_values(project: Path) -> None:
    spec = load(spec_file(project, SSVAE))
    config = {"lvm.ssvae.methods": "sfe", "lvm.ssvae.lr.default": 0.00123456}
    assert trial_name(spec, config) == "ssvae.methods=sfe lr.default=0.001235"


class FakeTrial:
    """What the progress callback reads of a Tune trial."""

    def __init__(self, trial_id: str, config: dict, last_result: dict) -> None:
        self.trial_id, self.config, self.last_result = trial_id, config, last_result
        self.num_failures = 0
        self.error_file = None  # no local copy: the error comes from storage

    def get_error(self) -> str:
        return "Traceback ...\nLearnableSparsityError: non-finite loss nan at step 1"


def test_the_progress_callback_ends_each_trials_run_with_its_outcome(
    project: Path, mlflow_uri: str
) -> None:
    spec = load(spec_file(project, SSVAE, "progress"))
    client = MlflowClient(mlflow_uri)
    trials = {
        "t0": ({"accuracy": 0.5}, "finished"),
        "t1": ({"accuracy": 0.8}, "finished"),
        "t2": (None, "stopped"),
        "t3": (None, "failed"),
    }
    with stage_run(mlflow_uri, "sweeps", "sweep/progress", {}) as parent:
        progress = SweepProgress(spec, parent)
        for index, (trial_id, (results, outcome)) in enumerate(trials.items()):
            config = {"lvm.ssvae.methods": "sfe", "lvm.ssvae.lr.default": 0.001 * (index + 1)}
            parent.child(trial_id, {}, {SWEEP_TAG: parent.run_id, TRIAL_TAG: trial_id})
            last = {"step": 40} if results is None else {"step": 60, "results": results}
            trial = FakeTrial(trial_id, config, last)
            if outcome == "failed":
                progress.on_trial_error(0, [], trial)
            else:
                progress.on_trial_complete(0, [], trial)
    assert (progress.finished, progress.stopped, progress.failed) == (2, 1, 1)
    assert progress.best == (0.8, "ssvae.methods=sfe lr.default=0.002")
    statuses = {}
    for run in client.search_runs(
        [parent.experiment_id], f"tags.`{SWEEP_TAG}` = '{parent.run_id}'"
    ):
        statuses[run.data.tags[TRIAL_TAG]] = run.info.status
        if run.data.tags[TRIAL_TAG] == "t2":
            assert run.data.tags[STOPPED_TAG] == "true"
        if run.data.tags[TRIAL_TAG] == "t3":
            assert "non-finite loss" in run.data.tags["error"]
    assert statuses == {"t0": "FINISHED", "t1": "FINISHED", "t2": "FINISHED", "t3": "FAILED"}
    rows = {row["trial"]: row for row in progress.rows}
    assert rows["t1"]["accuracy"] == 0.8 and rows["t2"]["status"] == "stopped early"
    assert rows["t3"]["error"].startswith("LearnableSparsityError: non-finite loss")
    stopper = StopOnWrongMetric(progress)
    assert not stopper.stop_all()
    progress.on_trial_complete(0, [], FakeTrial("t4", config, {"results": {"acc": 1.0}}))
    assert stopper.stop_all()  # a misspelt metric ends the sweep after its first trial
    assert "metric 'accuracy' is not among the trials' results ['acc']" in progress.wrong_metric


def test_a_failed_trials_error_is_read_before_tune_copies_it_to_storage(
    ray_local: None, tmp_path: Path
) -> None:
    """Tune writes the error into the driver's staging folder and copies it to storage only at its
    next sync, after `on_trial_error`: reading storage alone gave "unknown error" in CI."""
    storage = StorageContext(storage_path=str(tmp_path), experiment_dir_name="sweep")
    trial = Trial("trainable", config={}, storage=storage, stub=True)
    trial.init_local_path()
    trial.handle_error(RuntimeError("LearnableSparsityError: non-finite loss nan at step 1"))
    assert trial.get_error() is None  # not in storage yet
    assert error_text(trial).endswith("LearnableSparsityError: non-finite loss nan at step 1")


def test_the_scale_out_docs_example_spec_checks_out(project: Path) -> None:
    """The annotated spec of docs/scale-out.md, "A sweep spec", is a spec that loads and checks."""
    page = (ROOT / "docs/scale-out.md").read_text()
    section = page[page.index("## A sweep spec") :]
    example = section[section.index("```yaml\n") + 8 : section.index("```\n", 8)]
    spec = load(spec_file(project, yaml.safe_load(example), "documented"))
    assert spec.settings.asha is not None and spec.settings.num_samples == 2
    assert spec.check_trials("sqlite:///unused.db") == [Path("data/images/digits.pt")]


def test_a_trial_asks_for_what_a_grid_cell_of_its_profile_asks_for(project: Path) -> None:
    on_gpus = load(spec_file(project, {**SSVAE, "profile": "paper"}))
    assert (on_gpus.resources.cpus, on_gpus.resources.gpus) == (4.0, 1.0)
    chosen = load(spec_file(project, {**SSVAE, "resources": {"cpus": 2, "gpus": 0.5}}))
    assert (chosen.resources.cpus, chosen.resources.gpus) == (2.0, 0.5)


def test_fetched_reports_are_the_latest_ended_sweeps_each_file_replaced(
    project: Path, tmp_path: Path
) -> None:
    """Without a job id, the reports of the newest parent run of the sweep that ended (a running
    one is not done writing them), put over the files of the same names; others stay, and no
    temporary folder is left."""
    spec = load(spec_file(project, SSVAE, "fetched"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = spec.params.settings("mlflow", MlflowSettings).experiment
    for label, status in (("older", "FINISHED"), ("newer", "FAILED"), ("running", None)):
        run = start_stage_run(uri, experiment, "sweep/fetched", {})
        written = tmp_path / label / "summary.md"
        written.parent.mkdir()
        written.write_text(label)
        run.log_artifact(written)
        if status is not None:
            run.finish(status)
    folder = REPORTS / "fetched"
    folder.mkdir(parents=True)
    (folder / "summary.md").write_text("from an earlier sweep")
    (folder / "notes.md").write_text("the user's")
    assert fetch_reports(spec, uri) == folder
    assert (folder / "summary.md").read_text() == "newer"
    assert (folder / "notes.md").read_text() == "the user's"
    assert [path.name for path in REPORTS.iterdir()] == ["fetched"]
    with pytest.raises(LearnableSparsityError, match=r"no ended run sweep/fetched of Ray job x1 "):
        fetch_reports(spec, uri, "x1")


def test_a_randint_axis_checks_the_values_ray_draws_at_its_ends() -> None:
    """Ray's randint excludes ``high``: the checks try ``low`` and ``high − 1``, the extremes a
    trial can get, found here by drawing (not from the code under test)."""
    axis = parse_axis("lvm.ssvae.steps", {"randint": [2, 5]})
    drawn = {axis.space().sample() for _ in range(400)}
    assert drawn == {2, 3, 4}
    assert axis.checked_values() == (min(drawn), max(drawn))
