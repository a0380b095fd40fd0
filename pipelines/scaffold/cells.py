"""The grid cells of a stage and their reuse: fingerprints, ``done.json`` records, the task run.

A :class:`GridCell` is a key (its directory under the stage's ``store``), the payload its task reads
(plain JSON) and the input files it reads. Its *fingerprint* hashes the payload, the contents of the
input files, the project code the task runs (``pipelines.scaffold.imports``: the task's module and
everything it imports within the repo) and the torch threads it gets (they change the numbers). A
cell whose ``done.json`` holds the same fingerprint is reused (:func:`reuse`); one whose directory
was started under another fingerprint is cleared and retrained; one started under the same
fingerprint resumes (its task finds its checkpoints); directories of cells no longer in the grid are
removed. The task runs in a Ray worker (``pipelines.scaffold.runner``), gets a :class:`CellRun` (its
key, payload, directory, device and MLflow child run) and returns a JSON result, which the worker
records in ``done.json`` before returning it (:func:`run_cell`).
``pipelines.scaffold.stage`` runs a stage's :class:`Grid` this way.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import torch
from mlflow.entities import Dataset
from torch import nn

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.files import remove_partial_writes
from pipelines.scaffold import layout
from pipelines.scaffold.files import file_digest, read_json, write_json
from pipelines.scaffold.imports import code_digest
from pipelines.scaffold.tracking.provenance import system_metrics, system_tags
from pipelines.scaffold.tracking.runs import RunLogger, find_run, metric_name

log = logging.getLogger(__name__)

STARTED = "cell.json"  # a cell's directory belongs to {"fingerprint", "payload"}
LOCK = ".cell.lock"  # held while a task runs the cell (.dvcignore keeps it out of DVC's hashes)
TASK_SECONDS = "task_seconds"


def fingerprint(*parts: Any) -> str:
    """A short, stable digest of JSON-serialisable ``parts``."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class GridCell:
    """One cell of a stage's grid, as the scaffold runs it (an experiment's own cell, such as an
    ``NmtCell``, gives it its key and goes into its payload): ``key`` (unique; its directory
    under the store), the JSON ``payload`` its task reads, the ``inputs`` (files) its result
    depends on, and which of them are ``data`` (logged as the MLflow run's datasets, one per
    directory)."""

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
    cells: list[GridCell]
    store: Path


def cell_fingerprints(
    task: Callable[[CellRun], dict],
    cells: Sequence[GridCell],
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
    run: RunLogger
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
        self.run.log_metrics({metric_name(k): v for k, v in metrics.items()}, step)
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
        MLflow run from there (the points after the checkpoint that an earlier attempt had
        written are not logged again: ``RunLogger.skip_written``)."""
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
        with system_metrics(cell.run):
            cell.run.set_tags(system_tags())
            cell.seconds_before = cell.run.latest(TASK_SECONDS) or 0.0
            # An earlier attempt may have written points, at a checkpoint or as its buffer
            # filled before the first one (then with no wall time yet).
            cell.run.skip_written(except_keys={TASK_SECONDS})
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
) -> RunLogger | None:
    """The FINISHED MLflow run of ``stage`` that trained cell ``key`` (its store ``store``), found
    by the fingerprint in the cell's ``done.json``; None when it is not in this store (the model
    was trained elsewhere)."""
    tags = {"stage": stage, "cell": key, "fingerprint": done_record(store, key)["fingerprint"]}
    found = find_run(uri, experiment_id, tags, ("FINISHED",))
    return None if found is None else RunLogger(uri, found)


def reusable(
    store: Path, cells: Sequence[GridCell], prints: Mapping[str, str]
) -> tuple[dict[str, dict], list[Path]]:
    """The recorded results (by key) of the cells finished under their fingerprint ``prints``
    with their files intact, and the directories of the cells finished otherwise (under other
    settings, or damaged since), which :func:`clear_outdated` removes."""
    results: dict[str, dict] = {}
    outdated = []
    for cell in cells:
        directory = store / cell.key
        record = read_json(layout.done(directory)) if layout.done(directory).exists() else {}
        if record.get("fingerprint") == prints[cell.key] and _intact(directory, record):
            results[cell.key] = record["result"]
        elif record:
            outdated.append(directory)
    return results, outdated


def clear_outdated(store: Path, outdated: Sequence[Path], prints: Mapping[str, str]) -> None:
    """Remove the ``outdated`` cell directories (:func:`reusable`), those of cells started under
    another fingerprint and those of cells no longer in the grid."""
    for directory in outdated:
        shutil.rmtree(directory)
    _remove_stale(store, prints)


def start(directory: Path, fingerprint: str, payload: Mapping[str, Any]) -> None:
    """Mark ``directory`` as the cell's under ``fingerprint`` (before its task first runs): a
    later grid resumes it only under the same fingerprint."""
    write_json(directory / STARTED, {"fingerprint": fingerprint, **payload})


def _module_name(function: Callable) -> str:
    """The importable name of ``function``'s module, also for a stage run as ``python -m``."""
    name = function.__module__
    if name == "__main__":
        spec = sys.modules["__main__"].__spec__
        if spec is None:
            raise LearnableSparsityError("run a stage as `python -m pipelines.<stage>`")
        name = spec.name
    return name


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
