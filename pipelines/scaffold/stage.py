"""The one scaffold every stage entrypoint stands on: params, grid cells with reuse, MLflow, output.

A stage entrypoint is ``run_stage(name, main)`` with ``main(stage)`` reading top to bottom:

1. ``stage.settings("nmt", NmtSettings)`` — every params section it needs, built and validated
   before anything is touched (a bad value fails here, naming its key);
2. ``stage.run_grid(Grid(task, cells, store))`` — the grid as Ray tasks with **cell reuse**
   (``pipelines.scaffold.cells``), its results by cell key; a stage that a sweep can run
   (``pipelines.sweeps.run``) builds its :class:`Grid` in a function of its own, ``grid(stage)``,
   which its ``main`` hands to ``stage.run_grid`` and a sweep trial runs too;
3. ``stage.write_json(...)`` / ``write_text`` / ``write_png`` — atomic outputs, optionally
   logged to the stage's MLflow run; ``stage.write_metrics(...)`` — its DVC metrics, checked to
   hold numbers only.

Before ``main`` runs, and so before any file is touched, :meth:`Stage.check_before_work` checks
the profile's name and the tracking store (a server that answers, takes the credentials and lets
their user log into the experiment). MLflow: the stage's parent run is created on first use (so
a params error leaves no run behind), at the latest before a grid clears an outdated cell, with
the params sections the stage read; every cell that runs is a child run, ended FINISHED or
FAILED with its task. Errors a user causes (:class:`LearnableSparsityError`) end the stage with
one clear message and exit status 1; ``--verbose`` (or ``LEARNABLE_SPARSITY_VERBOSE=1``) adds
the traceback. SIGTERM or Ctrl-C end its runs KILLED and the stage with one line and status 143
or 130.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import psutil
from matplotlib.figure import Figure

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.files import atomic_write_bytes, atomic_write_text
from learnable_sparsity.settings import Settings, params_of
from pipelines.scaffold import layout
from pipelines.scaffold.cells import (
    CellRun,
    Grid,
    cell_fingerprints,
    clear_outdated,
    datasets,
    execute_cell,
    reusable,
    start,
    training_run,
)
from pipelines.scaffold.files import file_digest, png, write_json
from pipelines.scaffold.inputs import require_inputs
from pipelines.scaffold.metrics import check_scalar_metrics
from pipelines.scaffold.params import Params, check_profile, load_params
from pipelines.scaffold.runner import LOG_FORMAT, RaySettings, check_ready, run_grid
from pipelines.scaffold.tracking.runs import RunLogger, StageRun, metric_name, start_stage_run
from pipelines.scaffold.tracking.store import MlflowSettings, check_access, tracking_uri

log = logging.getLogger(__name__)
S = TypeVar("S", bound=Settings)

VERBOSE_ENV = "LEARNABLE_SPARSITY_VERBOSE"


class Stage:
    """One invocation of a stage: its params, settings, MLflow parent run and outputs."""

    def __init__(self, name: str, params: Params, uri: str) -> None:
        self.name, self.params, self.uri = name, params, uri
        self._read: dict[str, Any] = {}
        self._run: StageRun | None = None

    def settings(self, key: str, cls: type[S], **derived: Any) -> S:
        """Params section ``key`` as ``cls``, validated (see ``Params.settings``)."""
        built = self.params.settings(key, cls, **derived)
        self._read[key] = params_of(built)
        return built

    def require_entries(self, key: str, names: Sequence[str], section: str) -> None:
        """Every name of ``key`` (e.g. ``nmt.corpora``) is an entry of params ``section``."""
        known = self.params.get(section, Mapping)
        for name in names:
            if name not in known:
                raise LearnableSparsityError(
                    f"{self.params.source}: {key} names {name!r}, which is not in {section} "
                    f"({sorted(known)})"
                )

    def require_external(self, key: str, path: str) -> None:
        """The user's input file ``path`` (params ``key``) lies in ``data/external``, which DVC
        tracks as a dependency: an edit of the file then reruns the stage."""
        inside = Path(path).resolve().is_relative_to(layout.EXTERNAL.resolve())
        if not inside:
            raise LearnableSparsityError(
                f"{self.params.source}: {key} is {path!r}, outside {layout.EXTERNAL}/: put (or "
                f"`dvc add`) your files there, so that DVC sees when they change"
            )

    @property
    def profile(self) -> str:
        return self.params.get("profile", str)

    def check_before_work(self) -> None:
        """What must hold before the stage touches any file (a cell directory, an output): a
        known profile, and a store that takes the credentials given and lets their user log
        into the experiment (:func:`~pipelines.scaffold.tracking.store.check_access`)."""
        check_profile(self.params)
        check_access(self.uri, self.settings("mlflow", MlflowSettings).experiment)

    @property
    def run(self) -> StageRun:
        """The stage's MLflow parent run, created on first use."""
        if self._run is None:
            experiment = self.settings("mlflow", MlflowSettings).experiment
            self._run = start_stage_run(
                self.uri, experiment, self.name, {"profile": self.profile, **self._read}
            )
        return self._run

    def finish(self, status: str) -> None:
        if self._run is not None:
            self._run.finish(status)

    def run_grid(self, grid: Grid) -> dict[str, dict]:
        """The grid's task on every cell as Ray tasks, reusing finished cells; the results by
        cell key, in the grid's cell order."""
        task, cells, store = grid.task, grid.cells, grid.store
        keys = [cell.key for cell in cells]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise LearnableSparsityError(f"{self.name}: the grid has the cells {repeated} twice")
        ray = self.settings("ray", RaySettings)
        # Cells share their inputs (a corpus for every variant and seed): read each file once.
        digest = functools.cache(file_digest)
        described = functools.cache(lambda files: datasets(files, digest))
        prints = cell_fingerprints(task, cells, ray.task_cpus, digest)
        results, outdated = reusable(store, cells, prints)
        todo = [cell for cell in cells if cell.key not in results]
        log.info("%s: %d cells to run, %d reused", self.name, len(todo), len(results))
        # A request no node can give ends here, even with nothing to run: no run made, no
        # finished cell removed.
        check_ready(ray)
        self.run  # noqa: B018 - the parent run (the server's yes) before a cell is touched
        clear_outdated(store, outdated, prints)
        runs = []
        for cell in todo:
            directory = store / cell.key
            start(directory, prints[cell.key], cell.payload)
            child = self.run.child(
                cell.key,
                {"cell": cell.key, **cell.payload},
                {"cell": cell.key, "fingerprint": prints[cell.key]},
            )
            RunLogger(self.uri, child).log_datasets(described(cell.data), self.name)
            runs.append(
                CellRun(
                    task,
                    cell.key,
                    cell.payload,
                    directory,
                    prints[cell.key],
                    ray.task_gpus,
                    RunLogger(self.uri, child),
                )
            )
        finished = run_grid(
            execute_cell,
            runs,
            resources=ray.resources,
            description=self.name,
            address=ray.address,
            num_cpus=ray.num_cpus,
        )
        results |= {run.key: result for run, result in zip(runs, finished, strict=True)}
        self.run.set_tags(
            {"cells_run": str(len(todo)), "cells_reused": str(len(cells) - len(todo))}
        )
        return {key: results[key] for key in keys}

    def annotate_training_runs(
        self,
        stage: str,
        store: Path,
        metrics: Mapping[str, Mapping[str, float]],
        *,
        files: Mapping[str, Sequence[Path]] | None = None,
        artifact: str | None = None,
    ) -> None:
        """Log ``metrics[key]`` (and the ``files[key]``, as artifacts under ``artifact``) also on
        the run of ``stage`` that trained cell ``key`` (see :func:`training_run`), so that one
        row of the MLflow runs table carries a model's params, training curves, scores and
        analysis; values the run already has are not logged again."""
        for key, values in metrics.items():
            trained = training_run(self.uri, self.run.experiment_id, stage, store, key)
            if trained is None:
                log.info("%s: no %s run of %s in this MLflow store", self.name, stage, key)
                continue
            has = trained.client.get_run(trained.run_id).data.metrics
            named = {metric_name(name): float(v) for name, v in values.items()}
            trained.log_metrics({k: v for k, v in named.items() if has.get(k) != v}, step=0)
            trained.flush()
            for path in (files or {}).get(key, ()):
                trained.log_artifact(path, artifact)

    def write_json(self, path: Path, data: Any, *, artifact: str | None = None) -> None:
        """Atomic JSON at ``path``; also an artifact of the stage run under ``artifact``."""
        write_json(path, data)
        self._logged(path, artifact)

    def write_metrics(self, data: Mapping[str, Any], *, logged: bool = False) -> None:
        """The stage's DVC metrics, ``results/<stage>/metrics.json`` (numbers only: see
        ``pipelines.scaffold.metrics``); also an artifact of the stage run and, when
        ``logged``, its metrics (nested names joined by "/")."""
        check_scalar_metrics(data, self.name)
        self.write_json(layout.metrics(self.name), data, artifact="")
        if logged:
            self.run.log_metrics(_flat_metrics(data), step=0)

    def write_text(self, path: Path, text: str, *, artifact: str | None = None) -> None:
        atomic_write_text(path, text)
        self._logged(path, artifact)

    def write_png(self, path: Path, figure: Figure, *, artifact: str | None = None) -> None:
        atomic_write_bytes(path, png(figure))
        self._logged(path, artifact)

    def copy_file(self, source: Path, path: Path, *, artifact: str | None = None) -> None:
        """``source`` (a cell's file, say) copied atomically to the output ``path``."""
        atomic_write_bytes(path, Path(source).read_bytes())
        self._logged(path, artifact)

    def _logged(self, path: Path, artifact: str | None) -> None:
        if artifact is not None:
            self.run.log_artifact(path, artifact or None)


def _flat_metrics(data: Mapping[str, Any], *parts: str) -> dict[str, float]:
    """Nested DVC metrics as MLflow metrics: ``{"a": {"b": 1}}`` → ``{"a/b": 1.0}``."""
    flat: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat |= _flat_metrics(value, *parts, key)
        else:
            flat[metric_name(*parts, key)] = float(value)
    return flat


class _Killed(KeyboardInterrupt):
    """A signal ended the stage (its number in ``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


_SIGNALLED: list[int] = []  # the signals _interrupt received (Ray re-raises its exception anew)


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM (``kill``, a scheduler) ends a stage like Ctrl-C: its MLflow runs are KILLED."""
    _SIGNALLED.append(signum)
    raise _Killed(signum)


# Seconds the processes this stage started (a local Ray's) get to end on SIGTERM before SIGKILL.
CHILDREN_GRACE_S = 5.0


def _end_children() -> None:
    """End every process this one started and their children (a local Ray's GCS, raylet and
    agents), which a stage leaving at once would leave behind."""
    me, ended = psutil.Process(), set()
    while children := [c for c in me.children(recursive=True) if c.pid not in ended]:
        # a raylet may start a worker (a task's retry) while it is being ended: look again
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.terminate()
        _, alive = psutil.wait_procs(children, timeout=CHILDREN_GRACE_S)
        for child in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        ended |= {child.pid for child in children}


def _exit_killed(name: str, error: BaseException) -> NoReturn:
    """End a killed stage: one line, no traceback, the shell's status for the signal (143 for
    SIGTERM, 130 for Ctrl-C). The process leaves at once: Ray's exit handlers would wait about
    a minute for a local Ray whose processes the same signal already ended (a process group's
    ``kill``), and the runs are ended already."""
    if isinstance(error, _Killed):
        signum = error.signum
    elif _SIGNALLED:  # ray.wait raises a KeyboardInterrupt of its own for _interrupt's
        signum = _SIGNALLED[-1]
    else:  # Ctrl-C, or a handler of Ray's that exited with SIGTERM's number
        signum = signal.SIGTERM if isinstance(error, SystemExit) else signal.SIGINT
    log.error("%s killed by %s: its MLflow runs are KILLED", name, signal.Signals(signum).name)
    _end_children()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


def run_stage(
    name: str,
    main: Callable[[Stage], None],
    argv: Sequence[str] | None = None,
    *,
    params: Callable[[], Params] = load_params,
) -> None:
    """Run the stage entrypoint ``main`` on ``params()`` (``params.yaml``; a sweep: its spec's
    params): logging, one MLflow parent run (FINISHED / FAILED / KILLED with the stage), and a
    user's error as one clear message."""
    args = sys.argv[1:] if argv is None else list(argv)
    verbose = "--verbose" in args or os.environ.get(VERBOSE_ENV) == "1"
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    signal.signal(signal.SIGTERM, _interrupt)
    stage = None
    try:
        require_inputs(name.replace("/", "@"), Path.cwd())  # before a run or a cell is touched
        stage = Stage(name, params(), tracking_uri(Path.cwd()))
        stage.check_before_work()
        main(stage)
    except LearnableSparsityError as error:
        if stage is not None:
            stage.finish("FAILED")
        detail = traceback.format_exc() if verbose else "(rerun with --verbose for details)"
        log.error("%s failed: %s\n%s", name, error, detail)
        raise SystemExit(1) from None
    except BaseException as error:
        # runner.connect keeps _interrupt across ray.init; a handler that exits with the
        # signal's number (a process where Ray's replaced it) is a kill all the same.
        killed = isinstance(error, KeyboardInterrupt) or (
            isinstance(error, SystemExit) and error.code == signal.SIGTERM
        )
        if stage is not None:
            stage.finish("KILLED" if killed else "FAILED")
        if killed:
            _exit_killed(name, error)
        raise
    stage.finish("FINISHED")
