"""Sweep trials on Ray Tune: each trial runs one cell of every stage of the chain, with the
stages' own grid code and cell tasks, in a directory of its own; one MLflow child run per trial.

Where a trial runs. Its directory is ``<storage>/trials/<trial id>``; it links the project's
``data/`` entries and the ``models/`` entries no stage of the chain writes (a BERT, say) from the
project root the trial's code was imported from — the job's working directory on that node, or
a checkout on a shared filesystem — and makes it the working directory, so that the stages' paths
(``pipelines.scaffold.layout``, relative) find the inputs there and write the trial's own models
and results beside them. The cells keep their checkpoints there: a trial whose worker died is
restarted by Tune (``max_failures``) and its cells resume from their last checkpoint, and a cell
that had finished is not run again (its ``done.json``). On a cluster of several nodes the
storage must be shared, as Ray Tune's own ``storage_path`` must.

What a trial reports. While it trains, the records its cells log go to its MLflow run as in a
DVC stage; with a scheduler, each record holding the scheduler's metric is also reported to Tune
(with ``step``), so that ASHA can stop it early. At the end it reports its results: the numbers
each stage's task returned (:func:`scalar_results`), under ``results``; its MLflow run gets
them too, as ``results/<name>`` metrics.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ray import tune

from pipelines.scaffold import layout
from pipelines.scaffold.cells import (
    TASK_SECONDS,
    CellRun,
    cell_fingerprints,
    datasets,
    run_cell,
)
from pipelines.scaffold.files import file_digest
from pipelines.scaffold.imports import ROOT
from pipelines.scaffold.runner import LOG_FORMAT
from pipelines.scaffold.stage import Stage
from pipelines.scaffold.tracking.runs import STATUSES, RunLogger, StageRun, find_run, metric_name
from pipelines.sweeps.spec import SweepSpec, stage_grid

log = logging.getLogger(__name__)

SWEEP_TAG = "sweep.run"  # a trial's run: the id of its sweep's parent run
TRIAL_TAG = "trial"  # and its Tune trial id
STOPPED_TAG = "sweep.stopped_early"
ERROR_TAG = "error"
RESULTS = "results"  # the key of a trial's final results in its Tune result
STEP = "step"  # the time attribute of the scheduler
_ERROR_LINES = 6
ANY_STATUS = ("RUNNING", *STATUSES)


@dataclass(frozen=True)
class SweepRun:
    """What each trial receives (picklable): the spec, the sweep's MLflow parent run and the
    storage of the trials."""

    spec: SweepSpec
    parent: StageRun
    storage: Path


def trial_name(spec: SweepSpec, config: Mapping[str, Any]) -> str:
    """A trial's run name: its search values by the last two parts of their keys
    (``ssvae.methods=sfe lr.default=0.001 ssvae.seeds=1``)."""
    parts = []
    for axis in spec.axes:
        value = config[axis.key]
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        parts.append(f"{'.'.join(axis.key.split('.')[-2:])}={shown}")
    return " ".join(parts)


def scalar_results(result: Mapping[str, Any]) -> dict[str, float]:
    """The numbers a stage's task returned, flat: nested names joined by ``/`` without the
    ``metrics`` / ``summary`` level, a ``score`` under its metric's name (``bleu``,
    ``valid/ter``, ``accuracy``, ``final_valid_nll``); lists (curves) are left out."""
    flat: dict[str, float] = {}

    def walk(node: Mapping[str, Any], prefix: tuple[str, ...]) -> None:
        for key, value in node.items():
            path = prefix if key in ("metrics", "summary") and not prefix else (*prefix, key)
            if key == "score" and prefix:
                path = prefix
            if isinstance(value, Mapping):
                walk(value, path)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                flat["/".join(path)] = float(value)

    walk(result, ())
    return flat


class _Reporter:
    """Follows the records a trial's cells log; reports those holding the scheduler's metric."""

    def __init__(self, metric: str | None) -> None:
        self.metric, self.latest, self.step = metric, {}, 0

    def logged(self, metrics: Mapping[str, float], step: int) -> None:
        named = {metric_name(key): float(value) for key, value in metrics.items()}
        self.latest.update(named)
        self.step = max(self.step, step)
        if self.metric is not None and self.metric in named:
            tune.report({**named, STEP: step})

    def final(self, results: Mapping[str, float]) -> dict[str, Any]:
        scheduled = {self.metric: self.latest[self.metric]} if self.metric in self.latest else {}
        return {**scheduled, STEP: self.step, RESULTS: dict(results)}


def run_trial(config: dict[str, Any], sweep: SweepRun) -> None:
    """The Tune trainable: one trial of ``sweep`` with the search values ``config``."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, force=True)
    spec, parent = sweep.spec, sweep.parent
    resources = spec.resources
    torch.set_num_threads(max(1, int(resources.cpus)))
    trial_id = tune.get_context().get_trial_id()
    directory = sweep.storage / "trials" / trial_id
    directory.mkdir(parents=True, exist_ok=True)
    # The stages' paths are relative: the trial's directory becomes the working directory. The
    # project's modules stay importable from the root they came from.
    sys.path.insert(0, str(ROOT))
    os.chdir(directory)
    _link_entries(layout.DATA, stores=())
    stage = Stage(parent.stage, spec.params_for(config), parent.uri)
    grids = [stage_grid(stage, name) for name in spec.settings.stages]
    _link_entries(layout.MODELS, stores=[grid.store for grid in grids])
    identity = {SWEEP_TAG: parent.run_id, TRIAL_TAG: trial_id}
    values = {f"sweep.{key}": value for key, value in config.items()}
    # A trial id names one trial of this sweep: a retried trial continues its run, even one an
    # earlier attempt ended (its worker killed before Tune received the final result), and
    # writes no point that attempt wrote (the cells' records after their checkpoints, the
    # final results).
    run_id = parent.child(trial_name(spec, config), values, identity, resume=ANY_STATUS)
    run = RunLogger(parent.uri, run_id)
    run.skip_written(except_keys={TASK_SECONDS})
    asha = spec.settings.asha
    reporter = _Reporter(asha.metric if asha else None)
    results: dict[str, float] = {}
    with run:
        for name, grid in zip(spec.settings.stages, grids, strict=True):
            (cell,) = grid.cells
            run.log_params({"cell": cell.key, **cell.payload})
            # The datasets and the fingerprint read each input file once.
            digest = functools.cache(file_digest)
            run.log_datasets(datasets(cell.data, digest), name)
            fingerprint = cell_fingerprints(grid.task, [cell], resources.cpus, digest)[cell.key]
            cell_run = CellRun(
                grid.task,
                cell.key,
                cell.payload,
                grid.store / cell.key,
                fingerprint,
                resources.gpus,
                run,
                on_metrics=reporter.logged,
            )
            log.info("trial %s: %s %s", trial_id, name, cell.key)
            results |= scalar_results(run_cell(cell_run))
        # Under the names the sweep's summary gives them, to sort the trials by in the UI.
        run.log_metrics({f"{RESULTS}/{key}": value for key, value in results.items()}, step=0)
    tune.report(reporter.final(results))


def _link_entries(top: Path, stores: Sequence[Path]) -> None:
    """Link each entry of the project's ``top`` (data/, models/) into the working directory,
    except those a stage of the chain writes (a store, or a folder holding one)."""
    source = ROOT / top
    for entry in sorted(source.iterdir()) if source.is_dir() else []:
        relative = top / entry.name
        if any(store.is_relative_to(relative) for store in stores) or relative.is_symlink():
            continue
        relative.parent.mkdir(parents=True, exist_ok=True)
        relative.symlink_to(entry, target_is_directory=entry.is_dir())


class SweepProgress(tune.Callback):
    """On the driver: a log line per finished trial with the best metric so far, a warning per
    retried one, an error per failed one, and each trial's MLflow run ended with its outcome
    (FINISHED; FAILED with its error; FINISHED and tagged when a scheduler stopped it early)."""

    def __init__(self, spec: SweepSpec, parent: StageRun) -> None:
        self.spec, self.parent = spec, parent
        self.finished = self.failed = self.stopped = 0
        self.best: tuple[float, str] | None = None
        self.rows: list[dict[str, Any]] = []  # a trial each: its outcome, values and results
        self.wrong_metric: str | None = None  # the error, once a trial lacks the metric

    def _row(self, trial: Any, status: str, results: Mapping[str, float], error: str = "") -> None:
        config = {axis.key: trial.config[axis.key] for axis in self.spec.axes}
        name = trial_name(self.spec, trial.config)
        row = {"trial": trial.trial_id, "name": name, "status": status, **config, **results}
        self.rows.append({**row, "error": error})

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        settings = self.spec.settings
        result = trial.last_result or {}
        results = result.get(RESULTS) or {}
        name = trial_name(self.spec, trial.config)
        if settings.metric not in results and RESULTS in result:
            # A misspelt metric: known only once a trial has its results. The stopper ends the
            # sweep now rather than after every trial ran for nothing.
            self.wrong_metric = (
                f"{self.spec.source}: metric {settings.metric!r} is not among the trials' "
                f"results {sorted(results)}"
            )
            self._row(trial, "finished", results)
            self._end(trial, "FINISHED", {})
            return
        if settings.metric not in results:
            self.stopped += 1
            self._row(trial, "stopped early", {})
            self._end(trial, "FINISHED", {STOPPED_TAG: "true"})
            log.info(
                "trial %s [%s] stopped early at step %s", trial.trial_id, name, result.get(STEP)
            )
            return
        self.finished += 1
        value = results[settings.metric]
        better = self.best is None or (value > self.best[0]) == (settings.mode == "max")
        if better:
            self.best = (value, name)
        self._row(trial, "finished", results)
        self._end(trial, "FINISHED", {})
        log.info(
            "trial %d/%d done [%s]: %s = %.4g; best so far %.4g [%s]",
            self.finished + self.failed + self.stopped,
            len(trials),
            name,
            settings.metric,
            value,
            *self.best,
        )

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        log.warning(
            "trial %s [%s] failed (its worker died, or it raised: Tune logs the traceback); "
            "retrying it, its cells resume from their checkpoints (failure %d of at most %d)",
            trial.trial_id,
            trial_name(self.spec, trial.config),
            trial.num_failures,
            self.spec.settings.max_failures,
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.failed += 1
        text = error_text(trial)
        self._row(trial, "failed", {}, text.splitlines()[-1])
        self._end(trial, "FAILED", {ERROR_TAG: text})
        name = trial_name(self.spec, trial.config)
        log.error("trial %s [%s] failed: %s", trial.trial_id, name, text)

    def _end(self, trial: Any, status: str, tags: Mapping[str, str]) -> None:
        """End the trial's run with ``status`` and ``tags`` (none: it never started)."""
        identity = {SWEEP_TAG: self.parent.run_id, TRIAL_TAG: trial.trial_id}
        found = find_run(self.parent.uri, self.parent.experiment_id, identity, ANY_STATUS)
        if found is not None:
            run = RunLogger(self.parent.uri, found)
            run.set_tags(tags)
            run.finish(status)


class StopOnWrongMetric(tune.Stopper):
    """Stops the whole sweep once ``progress`` found that the trials lack its metric."""

    def __init__(self, progress: SweepProgress) -> None:
        self.progress = progress

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.progress.wrong_metric is not None


def error_text(trial: Any) -> str:
    """The end of the traceback of the trial's latest error. Tune writes it to the driver's local
    trial folder just before it calls ``on_trial_error``, and copies it to storage only at its next
    sync, so storage (``trial.get_error()``) is read only where the local file is gone."""
    local = Path(trial.error_file) if trial.error_file else None
    if local is not None and local.is_file():
        text = local.read_text()
    else:
        text = str(trial.get_error() or "unknown error (no error file)")
    text = text.strip()
    return "\n".join(text.splitlines()[-_ERROR_LINES:])
