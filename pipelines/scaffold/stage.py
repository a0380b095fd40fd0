"""The one scaffold every stage entrypoint stands on: params, grid cells with reuse, MLflow, output.

A stage entrypoint is ``run_stage(name, main)`` with ``main(stage)`` reading top to bottom:

1. ``stage.settings("nmt", NmtSettings)`` — every params section it needs, built and validated
   before anything is touched (a bad value fails here, naming its key);
2. ``stage.grid(task, cells, store=...)`` — the grid as Ray tasks with **cell reuse**; a stage
   that a sweep can run (``pipelines.sweep``) builds its :class:`Grid` in a function of its own,
   ``grid(stage)``, which its ``main`` hands to ``stage.run_grid`` and a sweep trial runs too;
3. ``stage.write_json(...)`` / ``write_text`` / ``write_png`` — atomic outputs, optionally
   logged to the stage's MLflow run; ``stage.write_metrics(...)`` — its DVC metrics, checked to
   hold numbers only.

Cell reuse. A :class:`Cell` is a key (its directory under the stage's ``store``), the payload
its task reads (plain JSON) and the input files it reads. Its *fingerprint* hashes the payload,
the contents of the input files, the project code the task runs (``pipelines.scaffold.imports``: the
task's module and everything it imports within the repo) and the torch threads it gets (they
change the numbers). A cell whose ``done.json`` holds the same fingerprint is reused; one whose
directory was started under another fingerprint is cleared and retrained; one started under the
same fingerprint resumes (its task finds its checkpoints); directories of cells no longer in the
grid are removed. The task runs in a Ray worker (``pipelines.scaffold.runner``), gets a
:class:`CellRun` (its key, payload, directory, device and MLflow child run) and returns a JSON
result, which the worker records in ``done.json`` before returning it.

MLflow: the stage's parent run is created on first use (so a params error leaves no run behind),
with the params sections the stage read; every cell that runs is a child run, ended FINISHED or
FAILED with its task. Errors a user causes (:class:`LearnableSparsityError`) end the stage with
one clear message and exit status 1; ``--verbose`` (or ``LEARNABLE_SPARSITY_VERBOSE=1``) adds
the traceback.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from matplotlib.figure import Figure
from mlflow.entities import Dataset
from torch import nn

from components.data.atomic import atomic_write_bytes, atomic_write_text, remove_partial_writes
from components.errors import LearnableSparsityError, MissingInputError
from components.settings import Settings, params_of
from pipelines.scaffold import layout, tracking
from pipelines.scaffold.imports import code_digest
from pipelines.scaffold.metrics import check_scalar_metrics
from pipelines.scaffold.params import Params, load_params
from pipelines.scaffold.runner import LOG_FORMAT, RaySettings, check_ready, run_grid

log = logging.getLogger(__name__)
S = TypeVar("S", bound=Settings)

STARTED = "cell.json"  # a cell's directory belongs to {"fingerprint", "payload"}
LOCK = ".cell.lock"  # held while a task runs the cell (.dvcignore keeps it out of DVC's hashes)
TASK_SECONDS = "task_seconds"
VERBOSE_ENV = "LEARNABLE_SPARSITY_VERBOSE"
_FIGURE_DPI = 110


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON at ``path``, written atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    """The JSON at ``path``; a missing or malformed file raises naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingInputError(f"{path} is missing: run the stage that writes it") from None
    except json.JSONDecodeError as error:
        raise LearnableSparsityError(f"{path} is not valid JSON: {error}") from None


def png(figure: Figure) -> bytes:
    """``figure`` rendered as PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=_FIGURE_DPI)
    return buffer.getvalue()


def fingerprint(*parts: Any) -> str:
    """A short, stable digest of JSON-serialisable ``parts``."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def file_digest(path: Path) -> str:
    """SHA-256 of the contents of ``path`` (an input of a cell); a missing file raises."""
    if not Path(path).is_file():
        raise MissingInputError(f"{path} is missing: run the stage that writes it")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Cell:
    """One cell of a grid: ``key`` (unique; its directory under the store), the JSON ``payload``
    its task reads, the ``inputs`` (files) its result depends on, and which of them are ``data``
    (logged as the MLflow run's datasets, one per directory)."""

    key: str
    payload: Mapping[str, Any]
    inputs: tuple[Path, ...] = ()
    data: tuple[Path, ...] = ()


def datasets(files: Sequence[Path], digest: Callable[[Path], str] = file_digest) -> list[Dataset]:
    """``files`` as MLflow datasets, one per directory (e.g. ``data/corpora/smoke``): named by the
    directory, with a digest of the files' contents (by ``digest``) and each file's rows (lines)
    in its profile."""
    by_directory: dict[Path, list[Path]] = {}
    for path in files:
        by_directory.setdefault(Path(path).parent, []).append(Path(path))
    found = []
    for directory, paths in by_directory.items():
        profile = {path.name: {"rows": _rows(path)} for path in paths}
        found.append(
            Dataset(
                name=directory.as_posix(),
                digest=fingerprint([digest(path) for path in paths]),
                source_type="local",
                source=json.dumps({"uri": directory.as_posix()}),
                profile=json.dumps(profile),
            )
        )
    return found


def _rows(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))


@dataclass(frozen=True)
class Grid:
    """What a stage runs: ``task`` on every cell of ``cells``, their directories under ``store``."""

    task: Callable[[CellRun], dict]
    cells: list[Cell]
    store: Path


def cell_fingerprints(
    task: Callable[[CellRun], dict],
    cells: Sequence[Cell],
    task_cpus: float,
    digest: Callable[[Path], str] = file_digest,
) -> dict[str, str]:
    """Each cell's fingerprint (by key): its payload, the contents of its inputs (by
    ``digest``), the project code ``task`` runs and its torch threads (``task_cpus``)."""
    code = code_digest(_module_name(task))
    return {
        cell.key: fingerprint(cell.payload, [digest(p) for p in cell.inputs], code, task_cpus)
        for cell in cells
    }


@dataclass
class CellRun:
    """What a task receives in its Ray worker (picklable)."""

    task: Callable[[CellRun], dict]
    key: str
    payload: Mapping[str, Any]
    directory: Path
    fingerprint: str
    num_gpus: float
    run: tracking.RunLogger
    # Wall time of the cell before this attempt (earlier, interrupted attempts) and the start of
    # this one (set by execute_cell).
    seconds_before: float = 0.0
    started: float = 0.0
    # Also called with every logged record (a sweep trial reports them to Ray Tune's scheduler).
    on_metrics: Callable[[Mapping[str, float], int], None] | None = None

    @property
    def device(self) -> torch.device:
        """cuda when the cell was given a GPU (an error if torch sees none), else cpu."""
        if self.num_gpus <= 0:
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise LearnableSparsityError(
                "ray.task_gpus > 0 but torch sees no CUDA device in the task; set ray.task_gpus: 0"
            )
        return torch.device("cuda")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` (names made MLflow-safe) at ``step`` to the cell's run."""
        self.run.log_metrics({tracking.metric_name(k): v for k, v in metrics.items()}, step)
        if self.on_metrics is not None:
            self.on_metrics(metrics, step)

    def log_model(self, model: nn.Module) -> None:
        """Log the trained weights (``model/weights.pt``, a state dict) and the model's config
        (``model/config.json``: a dataclass, or a transformers config) as artifacts of the
        cell's run."""
        with tempfile.TemporaryDirectory() as folder:
            weights = Path(folder) / "weights.pt"
            torch.save(model.state_dict(), weights)
            self.run.log_artifact(weights, "model")
        config = getattr(model, "config", None)
        if is_dataclass(config):
            self.run.log_dict(asdict(config), "model/config.json")
        elif hasattr(config, "to_dict"):
            self.run.log_dict(config.to_dict(), "model/config.json")

    def flush(self, _step: int | None = None) -> None:
        """Write the buffered metrics and the cell's wall time so far (``task_seconds``, over
        all its attempts) now. Call it before every checkpoint is written: what an interrupted
        cell logged up to its checkpoint is then kept, and the resumed cell continues the same
        MLflow run from there (points after the checkpoint are logged again, with equal values)."""
        seconds = self.seconds_before + time.perf_counter() - self.started
        self.run.log_metrics({TASK_SECONDS: seconds}, step=0)
        self.run.flush()


def execute_cell(cell: CellRun) -> dict:
    """The Ray task of every grid: :func:`run_cell` inside the cell's MLflow run, which ends
    FINISHED, or FAILED if the task raises."""
    with cell.run:
        return run_cell(cell)


def run_cell(cell: CellRun) -> dict:
    """Run the stage's task on the cell (tagging its MLflow run with this machine's library
    versions and CPU kernels, sampling system metrics, adding up its wall time over attempts),
    then record the result and the digest of every file the cell wrote in its ``done.json``; a
    cell already done under the same fingerprint returns its recorded result. The MLflow run is
    left open (a sweep trial logs several stages' cells to one run).

    The cell's directory is locked while its task runs (and cleared of the temporary files of
    writes a killed worker left): a worker of a killed driver can outlive
    it by a few seconds, and a new run of the cell waits for it instead of writing the same
    checkpoints at the same time (and reuses its result if it finished).
    """
    cell.directory.mkdir(parents=True, exist_ok=True)
    with open(cell.directory / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = layout.done(cell.directory)
        if done.exists() and read_json(done)["fingerprint"] == cell.fingerprint:
            return read_json(done)["result"]
        # A worker killed mid-write left its temporary file: the resumed cell must end with the
        # files of one never interrupted (they are hashed into done.json and by DVC).
        for partial in remove_partial_writes(cell.directory):
            log.info("%s: removed %s, left by an interrupted write", cell.key, partial.name)
        with tracking.system_metrics(cell.run):
            cell.run.set_tags(tracking.system_tags())
            cell.seconds_before = cell.run.latest(TASK_SECONDS) or 0.0
            cell.started = time.perf_counter()
            result = cell.task(cell)
            cell.flush()
        files = _files(cell.directory)
        write_json(done, {"fingerprint": cell.fingerprint, "result": result, "files": files})
        return result


def _files(directory: Path) -> dict[str, str]:
    """SHA-256 of every file a cell wrote in its directory (not its own records)."""
    records = {STARTED, LOCK, layout.done(directory).name}
    return {
        path.relative_to(directory).as_posix(): file_digest(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name not in records
    }


def _intact(directory: Path, record: Mapping[str, Any]) -> bool:
    """Whether a finished cell's files are as it left them (none missing, changed or added)."""
    if "files" not in record:
        return False
    current = _files(directory)
    if current == record["files"]:
        return True
    changed = sorted(
        set(current) ^ set(record["files"])
        | {
            name
            for name in current.keys() & record["files"].keys()
            if current[name] != record["files"][name]
        }
    )
    log.warning("%s: %s changed since the cell finished; running it again", directory, changed)
    return False


def done_record(store: Path, key: str) -> dict[str, Any]:
    """The ``done.json`` of cell ``key`` of another stage's store (e.g. a trained model)."""
    return read_json(layout.done(store / key))


def training_run(
    uri: str, experiment_id: str, stage: str, store: Path, key: str
) -> tracking.RunLogger | None:
    """The FINISHED MLflow run of ``stage`` that trained cell ``key`` (its store ``store``), found
    by the fingerprint in the cell's ``done.json``; None when it is not in this store (the model
    was trained elsewhere)."""
    tags = {"stage": stage, "cell": key, "fingerprint": done_record(store, key)["fingerprint"]}
    found = tracking.find_run(uri, experiment_id, tags, ("FINISHED",))
    return None if found is None else tracking.RunLogger(uri, found)


class Stage:
    """One invocation of a stage: its params, settings, MLflow parent run and outputs."""

    def __init__(self, name: str, params: Params, uri: str) -> None:
        self.name, self.params, self.uri = name, params, uri
        self._read: dict[str, Any] = {}
        self._run: tracking.StageRun | None = None

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

    @property
    def run(self) -> tracking.StageRun:
        """The stage's MLflow parent run, created on first use."""
        if self._run is None:
            experiment = self.settings("mlflow", tracking.MlflowSettings).experiment
            self._run = tracking.start_stage_run(
                self.uri, experiment, self.name, {"profile": self.profile, **self._read}
            )
        return self._run

    def finish(self, status: str) -> None:
        if self._run is not None:
            self._run.finish(status)

    def grid(
        self, task: Callable[[CellRun], dict], cells: Sequence[Cell], *, store: Path
    ) -> list[dict]:
        """``task`` on every cell as Ray tasks, reusing finished cells; results in cell order."""
        keys = [cell.key for cell in cells]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise LearnableSparsityError(f"{self.name}: the grid has the cells {repeated} twice")
        ray = self.settings("ray", RaySettings)
        # Cells share their inputs (a corpus for every variant and seed): read each file once.
        digest = functools.cache(file_digest)
        described = functools.cache(lambda files: datasets(files, digest))
        prints = cell_fingerprints(task, cells, ray.task_cpus, digest)
        results: dict[str, dict] = {}
        outdated = []  # finished under other settings, or their files were damaged
        for cell in cells:
            directory = store / cell.key
            record = read_json(layout.done(directory)) if layout.done(directory).exists() else {}
            if record.get("fingerprint") == prints[cell.key] and _intact(directory, record):
                results[cell.key] = record["result"]
            elif record:
                outdated.append(directory)
        todo = [cell for cell in cells if cell.key not in results]
        log.info("%s: %d cells to run, %d reused", self.name, len(todo), len(results))
        if todo:  # a request no node can give ends here: no run made, no finished cell removed
            check_ready(ray)
        for directory in outdated:
            shutil.rmtree(directory)
        _remove_stale(store, prints)
        runs = []
        for cell in todo:
            directory = store / cell.key
            write_json(directory / STARTED, {"fingerprint": prints[cell.key], **cell.payload})
            child = self.run.child(
                cell.key,
                {"cell": cell.key, **cell.payload},
                {"cell": cell.key, "fingerprint": prints[cell.key]},
            )
            tracking.RunLogger(self.uri, child).log_datasets(described(cell.data), self.name)
            runs.append(
                CellRun(
                    task,
                    cell.key,
                    cell.payload,
                    directory,
                    prints[cell.key],
                    ray.task_gpus,
                    tracking.RunLogger(self.uri, child),
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
        return [results[key] for key in keys]

    def run_grid(self, grid: Grid) -> list[dict]:
        """:meth:`grid` on a stage's :class:`Grid`."""
        return self.grid(grid.task, grid.cells, store=grid.store)

    def annotate_training_runs(
        self, stage: str, store: Path, metrics: Mapping[str, Mapping[str, float]]
    ) -> None:
        """Log ``metrics[key]`` also on the run of ``stage`` that trained cell ``key`` (see
        :func:`training_run`), so that one row of the MLflow runs table carries a model's
        params, training curves and scores; values the run already has are not logged again."""
        for key, values in metrics.items():
            trained = training_run(self.uri, self.run.experiment_id, stage, store, key)
            if trained is None:
                log.info("%s: no %s run of %s in this MLflow store", self.name, stage, key)
                continue
            has = trained.client.get_run(trained.run_id).data.metrics
            named = {tracking.metric_name(name): float(v) for name, v in values.items()}
            trained.log_metrics({k: v for k, v in named.items() if has.get(k) != v}, step=0)
            trained.flush()

    def write_json(self, path: Path, data: Any, *, artifact: str | None = None) -> None:
        """Atomic JSON at ``path``; also an artifact of the stage run under ``artifact``."""
        write_json(path, data)
        self._logged(path, artifact)

    def write_metrics(self, data: Mapping[str, Any]) -> None:
        """The stage's DVC metrics, ``results/<stage>/metrics.json`` (numbers only: see
        ``pipelines.scaffold.metrics``); also an artifact of the stage run."""
        check_scalar_metrics(data, self.name)
        self.write_json(layout.metrics(self.name), data, artifact="")

    def write_text(self, path: Path, text: str, *, artifact: str | None = None) -> None:
        atomic_write_text(path, text)
        self._logged(path, artifact)

    def write_png(self, path: Path, figure: Figure, *, artifact: str | None = None) -> None:
        atomic_write_bytes(path, png(figure))
        self._logged(path, artifact)

    def _logged(self, path: Path, artifact: str | None) -> None:
        if artifact is not None:
            self.run.log_artifact(path, artifact or None)


def _module_name(function: Callable) -> str:
    """The importable name of ``function``'s module, also for a stage run as ``python -m``."""
    name = function.__module__
    if name == "__main__":
        spec = sys.modules["__main__"].__spec__
        if spec is None:
            raise LearnableSparsityError("run a stage as `python -m pipelines.<stage>`")
        name = spec.name
    return name


def clear(directory: Path) -> None:
    """Remove ``directory`` (a stage's output it rewrites in full) if it exists."""
    shutil.rmtree(directory, ignore_errors=True)


def _remove_stale(store: Path, prints: Mapping[str, str]) -> None:
    """Clear the directories of cells that left the grid, and of cells started under another
    fingerprint (their checkpoints belong to other settings, data or code)."""
    for started in sorted(store.rglob(STARTED)) if store.is_dir() else []:
        directory = started.parent
        key = directory.relative_to(store).as_posix()
        if key not in prints:
            log.info("%s: no longer in the grid, removed", directory)
        elif read_json(started)["fingerprint"] != prints[key]:
            log.info("%s: settings, data or code changed, training from scratch", directory)
        else:
            continue
        shutil.rmtree(directory)
        for parent in directory.parents:
            if parent == store or not parent.is_dir() or any(parent.iterdir()):
                break
            parent.rmdir()


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM (``kill``, a scheduler) ends a stage like Ctrl-C: its MLflow runs are KILLED."""
    raise KeyboardInterrupt(f"signal {signum}")


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
        stage = Stage(name, params(), tracking.tracking_uri(Path.cwd()))
        main(stage)
    except LearnableSparsityError as error:
        if stage is not None:
            stage.finish("FAILED")
        detail = traceback.format_exc() if verbose else "(rerun with --verbose for details)"
        log.error("%s failed: %s\n%s", name, error, detail)
        raise SystemExit(1) from None
    except BaseException as error:
        # ray.init replaces the SIGTERM handler with sys.exit(SIGTERM): killed all the same.
        killed = isinstance(error, KeyboardInterrupt) or (
            isinstance(error, SystemExit) and error.code == signal.SIGTERM
        )
        if stage is not None:
            stage.finish("KILLED" if killed else "FAILED")
        raise
    stage.finish("FINISHED")
