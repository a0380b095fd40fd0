"""MLflow helpers: one parent run per stage invocation, one child run per grid cell.

Usage pattern (driver, then Ray tasks; ``pipelines.scaffold.stage`` does this for every stage)::

    uri = tracking_uri(Path.cwd())
    stage = start_stage_run(uri, experiment, "train_nmt", params)   # prepares the store once
    run_id = stage.child(cell_key, cell_params)   # children are created by the driver
    ...                                           # hand RunLogger(uri, run_id) to the Ray task
    # in the task:
    with RunLogger(uri, run_id) as run:
        run.log_metrics({metric_name("alpha", block, "head0"): 1.3}, step)
    stage.finish("FINISHED")                      # also ends children left RUNNING

The default store is the SQLite file ``mlflow.db`` at the project's root: the git repository's
top level, or ``$DVC_ROOT``, the real repository of a ``dvc exp run --queue/--temp`` experiment,
which runs in a copy under ``.dvc/tmp/exps/`` (a store there would be thrown away with the copy).
Its experiments keep their artifacts in ``<directory of the DB>/mlartifacts/<experiment>``; a
project copied or moved with its store has its artifact locations moved along on first use. A
server (``MLFLOW_TRACKING_URI=http://...``) decides for itself.
Many tasks writing to one SQLite file can meet "database is locked": every write is retried with
exponential backoff, and metrics are buffered and written in batches.
"""

from __future__ import annotations

import getpass
import logging
import os
import platform
import random
import re
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

from components.errors import LearnableSparsityError
from components.settings import Settings, SettingsError

log = logging.getLogger(__name__)
T = TypeVar("T")

# MLflow's limits (mlflow.utils.validation).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_PARAM_VALUE_CHARS = 6000
MAX_NAME_CHARS = 250
STATUSES = ("FINISHED", "FAILED", "KILLED")
UNFINISHED = ("RUNNING", "FAILED", "KILLED")
GIT_COMMIT_TAG = "mlflow.source.git.commit"
GIT_DIRTY_TAG = "git.dirty"
GIT_COMMIT_ENV = "LEARNABLE_SPARSITY_GIT_COMMIT"
GIT_DIRTY_ENV = "LEARNABLE_SPARSITY_GIT_DIRTY"
DVC_EXPERIMENT_TAG = "dvc.experiment"
PROFILE_TAG = "profile"
PARENT_TAG = "mlflow.parentRunId"
RESUMED_TAG = "resumed"
END_REASON_TAG = "end_reason"
# Environment variables that pin the CPU kernels (README: "Rerunning on another machine").
PORTABILITY_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR")

# A smoke cell lasts from half a minute to a few minutes: a sample every 5 s draws its curve.
SYSTEM_METRICS_INTERVAL_S = 5.0
DATA_CONTEXT_TAG = "mlflow.data.context"

_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_\-./ ]")
_RETRY_ATTEMPTS = 10
_RETRY_FIRST_DELAY_S = 0.1
_RETRY_MAX_DELAY_S = 5.0


# Makes the MLflow UI open an experiment on its runs table (MLflow 3 defaults to the GenAI view).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
ARTIFACTS_FOLDER = "mlartifacts"
# The tables whose rows name artifact locations (mlflow.store.tracking.dbmodels.models).
_ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
)


def tracking_uri(start: Path) -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else the SQLite file ``mlflow.db`` at the project root
    around ``start`` (absolute; see :func:`project_root`)."""
    given = os.environ.get("MLFLOW_TRACKING_URI")
    return given or f"sqlite:///{project_root(start) / 'mlflow.db'}"


def project_root(start: Path) -> Path:
    """The repository whose store a run belongs in: ``$DVC_ROOT`` when DVC runs the stage (for a
    queued or ``--temp`` experiment that is the user's repository, not the copy the stage runs
    in), else the top level of the git repository around ``start``."""
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=start,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        top = ""
    if not top:
        raise LearnableSparsityError(
            f"{start.resolve()} is not inside the project's git repository, so there is no "
            "project store to log to (a Ray job runs in a copy of the working directory): set "
            "MLFLOW_TRACKING_URI to a tracking server (http://host:5000) or to "
            "sqlite:////absolute/path/mlflow.db"
        )
    return Path(top).resolve()


def prepare(uri: str, experiment: str) -> str:
    """Create the store (a new SQLite DB migrates its schema) and ``experiment``; its id.

    Call it once in the driver before fanning out: tasks that open a fresh SQLite DB at the same
    time race in the migration. Idempotent. A new experiment of a SQLite store gets the absolute
    artifact location ``<DB directory>/mlartifacts/<experiment>``.
    """
    if not isinstance(experiment, str) or not experiment.strip():
        raise LearnableSparsityError(
            f"mlflow.experiment must be a non-empty name, got {experiment!r}"
        )
    database = _sqlite_path(uri)
    location = None
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
        folder = re.sub(r"[^A-Za-z0-9_-]", "_", experiment)
        location = (database.parent / ARTIFACTS_FOLDER / folder).as_uri()
    client = MlflowClient(uri)
    found = _retry(client.get_experiment_by_name, experiment)
    if found is None:
        try:
            return _retry(client.create_experiment, experiment, location, tags=EXPERIMENT_KIND)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            # Created meanwhile by another driver.
            found = _retry(client.get_experiment_by_name, experiment)
    if database is not None and found.artifact_location != location:
        _relocate(database, found.artifact_location, location)
    for key, value in EXPERIMENT_KIND.items():
        if found.tags.get(key) != value:
            _retry(client.set_experiment_tag, found.experiment_id, key, value)
    if found.lifecycle_stage != "active":
        raise LearnableSparsityError(
            f"MLflow experiment {experiment!r} (id {found.experiment_id}) in {uri} is deleted; "
            f"restore it (mlflow experiments restore --experiment-id {found.experiment_id}) "
            "or choose another mlflow.experiment"
        )
    return found.experiment_id


def _relocate(database: Path, found: str, wanted: str) -> None:
    """Point the artifact locations of a store that was copied or moved with its project (they
    name ``<old root>/mlartifacts/...``) at the store's own ``mlartifacts`` folder, so that the
    copy does not write into the original. A location the user chose elsewhere is left alone."""
    old = found.rpartition(f"/{ARTIFACTS_FOLDER}/")[0]
    new = wanted.rpartition(f"/{ARTIFACTS_FOLDER}/")[0]
    if not old or not found.startswith("file://") or old == new:
        return
    old, new = f"{old}/{ARTIFACTS_FOLDER}/", f"{new}/{ARTIFACTS_FOLDER}/"
    with sqlite3.connect(database, timeout=60) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        for table, column in _ARTIFACT_COLUMNS:
            if table in tables:
                connection.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                    f"WHERE substr({column}, 1, ?) = ?",
                    (new, len(old) + 1, len(old), old),
                )
    log.warning("the MLflow store %s was moved: its artifacts now go to %s", database, new)


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:////abs/path`` URI; None for a server or other DB."""
    scheme, colon, _ = uri.partition(":")
    scheme = scheme if colon else ""
    if scheme in ("", "file"):
        raise LearnableSparsityError(
            f"tracking URI {uri!r} is a file store, which MLflow 3.17 refuses; use "
            "sqlite:////absolute/path/mlflow.db or a server (MLFLOW_TRACKING_URI=http://host:5000)"
        )
    if scheme != "sqlite":
        return None
    path = Path(uri.removeprefix("sqlite:///"))
    if not uri.startswith("sqlite:///") or not path.is_absolute():
        raise LearnableSparsityError(
            f"tracking URI {uri!r} must name the SQLite file by an absolute path "
            "(sqlite:////absolute/path/mlflow.db): tasks and DVC experiments run elsewhere"
        )
    return path


def metric_name(*parts: str) -> str:
    """A valid MLflow metric name from ``parts`` joined by "/", e.g. ``alpha/enc.l0/head3``.

    Characters other than letters, digits, ``_ - . /`` and space become ``_``; empty and ``.``
    path segments are dropped and ``..`` ones become ``__`` (MLflow refuses names that are not
    normalised paths).
    """
    return _sanitise("/".join(str(part) for part in parts), "metric")


def _sanitise(text: str, kind: str) -> str:
    segments = [s for s in _BAD_NAME_CHARS.sub("_", text).split("/") if s not in ("", ".")]
    name = "/".join("_" * len(s) if set(s) == {"."} else s for s in segments)
    _check_name(name, kind, text)
    return name


def _check_name(name: str, kind: str, original: str) -> None:
    """Raise unless ``name`` is one MLflow accepts for a metric (or param) key."""
    valid = (
        name
        and len(name) <= MAX_NAME_CHARS
        and not _BAD_NAME_CHARS.search(name)
        and "/".join(s for s in name.split("/") if s not in ("", ".", "..")) == name
    )
    if not valid:
        raise LearnableSparsityError(
            f"{kind} name {original!r} is not valid in MLflow (1 to {MAX_NAME_CHARS} of the "
            "characters A-Z a-z 0-9 _ - . / and space, no empty, '.' or '..' path segments); "
            "build it with pipelines.scaffold.tracking.metric_name"
        )


def flatten_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Nested ``params`` as MLflow params: dotted names, values as text within MLflow's limit.

    ``{"nmt": {"model": {"d_model": 64}}}`` becomes ``{"nmt.model.d_model": "64"}``; a value
    longer than 6000 characters (a long list) is cut and ends with a note of its full size.
    """
    flat: dict[str, str] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, Mapping) and value:
                walk(value, f"{name}.")
            else:
                flat[_sanitise(name, "param")] = _param_value(value)

    walk(params, "")
    return flat


def _param_value(value: Any) -> str:
    text = str(value)
    if len(text) <= MAX_PARAM_VALUE_CHARS:
        return text
    items = f"{len(value)} items, " if isinstance(value, list | tuple) else ""
    note = f" ... [truncated: {items}{len(text)} characters]"
    return text[: MAX_PARAM_VALUE_CHARS - len(note)] + note


def _transient(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a busy database or an unavailable server."""
    seen: BaseException | None = error
    while seen is not None:
        if (
            getattr(seen, "error_code", None) == "TEMPORARILY_UNAVAILABLE"
            or type(seen).__name__ == "OperationalError"
            or "database is locked" in str(seen)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _retry(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, retried with jittered exponential backoff while transient."""
    delay, attempt = _RETRY_FIRST_DELAY_S, 1
    while True:
        try:
            return call(*args, **kwargs)
        except Exception as error:
            if attempt == _RETRY_ATTEMPTS or not _transient(error):
                raise
            log.warning("MLflow busy (%s); attempt %d failed, retrying", error, attempt)
            time.sleep(delay * random.uniform(1.0, 2.0))
            delay, attempt = min(2 * delay, _RETRY_MAX_DELAY_S), attempt + 1


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True, kw_only=True)
class MlflowSettings(Settings):
    """Params ``mlflow``: the experiment every stage logs its runs to."""

    experiment: str

    def validate(self) -> None:
        if not self.experiment.strip():
            raise SettingsError("experiment", "must be a non-empty name")


class RunLogger:
    """Logs to one existing MLflow run; picklable, so it can be used in (or sent to) a Ray task.

    Metrics are buffered and written ``flush_every`` points at a time (and on :meth:`flush` /
    :meth:`finish`). As a context manager it finishes the run: FINISHED (also on a clean
    ``sys.exit``), or FAILED when the block raises (KILLED on KeyboardInterrupt, e.g. a cancelled
    task).
    """

    def __init__(self, uri: str, run_id: str, flush_every: int = 200) -> None:
        if isinstance(flush_every, bool) or not isinstance(flush_every, int) or flush_every < 1:
            raise LearnableSparsityError(f"flush_every must be an int >= 1, got {flush_every!r}")
        self.uri, self.run_id, self.flush_every = uri, run_id, flush_every
        self._buffer: list[Metric] = []
        self._client: MlflowClient | None = None

    @property
    def client(self) -> MlflowClient:
        """The MLflow client of this process (created on first use, never pickled)."""
        if self._client is None:
            self._client = MlflowClient(self.uri)
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, error: BaseException | None, *_: object
    ) -> None:
        # A clean sys.exit is how Ray Tune ends a trial its scheduler stopped early.
        clean_exit = isinstance(error, SystemExit) and error.code in (0, None)
        if exc_type is None or clean_exit:
            self.finish("FINISHED")
        else:
            self.finish("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Buffer ``metrics`` at ``step`` (timestamped now); names as made by metric_name."""
        timestamp = int(time.time() * 1000)
        for key, value in metrics.items():
            _check_name(key, "metric", key)
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise LearnableSparsityError(
                    f"metric {key!r} at step {step} is {value!r}, not a number"
                ) from None
            self._buffer.append(Metric(key, number, timestamp, int(step)))
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def latest(self, key: str) -> float | None:
        """The value of metric ``key`` at its latest step in this run (written ones only)."""
        history = _retry(self.client.get_metric_history, self.run_id, key)
        return max(history, key=lambda m: (m.step, m.timestamp)).value if history else None

    def flush(self) -> None:
        """Write the buffered metrics (batches of at most 1000)."""
        while self._buffer:
            batch = self._buffer[:MAX_METRICS_PER_BATCH]
            _retry(self.client.log_batch, self.run_id, metrics=batch)
            del self._buffer[: len(batch)]

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log nested ``params`` flattened (see :func:`flatten_params`)."""
        entries = [Param(key, value) for key, value in flatten_params(params).items()]
        for batch in _chunks(entries, MAX_PARAMS_TAGS_PER_BATCH):
            _retry(self.client.log_batch, self.run_id, params=batch)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set tags on the run (values as text)."""
        entries = [RunTag(key, str(value)) for key, value in tags.items()]
        for batch in _chunks(entries, MAX_PARAMS_TAGS_PER_BATCH):
            _retry(self.client.log_batch, self.run_id, tags=batch)

    def log_datasets(self, datasets: Collection[Dataset], context: str) -> None:
        """Record ``datasets`` as the run's inputs (the UI's Datasets column), used as
        ``context`` (e.g. the stage that read them)."""
        tags = [InputTag(DATA_CONTEXT_TAG, context)]
        inputs = [DatasetInput(dataset, tags) for dataset in datasets]
        if inputs:
            _retry(self.client.log_inputs, self.run_id, inputs)

    def log_dict(self, data: dict, artifact_file: str) -> None:
        """Save ``data`` as the artifact ``artifact_file`` (JSON, or YAML by extension)."""
        _retry(self.client.log_dict, self.run_id, data, artifact_file)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Copy the file or directory ``path`` into the run's artifacts (under artifact_path)."""
        if not Path(path).exists():
            raise LearnableSparsityError(f"artifact {path} does not exist")
        _retry(self.client.log_artifact, self.run_id, str(path), artifact_path)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Save a matplotlib ``figure`` as the artifact ``artifact_file`` (format by extension)."""
        _retry(self.client.log_figure, self.run_id, figure, artifact_file)

    def finish(self, status: str = "FINISHED") -> None:
        """Flush the metrics, then end the run with ``status`` (FAILED if the flush fails)."""
        if status not in STATUSES:
            raise LearnableSparsityError(f"run status must be one of {STATUSES}, got {status!r}")
        try:
            self.flush()
        except BaseException:
            _retry(self.client.set_terminated, self.run_id, "FAILED")
            raise
        _retry(self.client.set_terminated, self.run_id, status)


@contextmanager
def system_metrics(run: RunLogger, interval_s: float = SYSTEM_METRICS_INTERVAL_S) -> Iterator[None]:
    """Log this machine's CPU, memory, disk and network use (and the GPUs', where nvidia-ml-py
    finds one) as ``system/...`` metrics of ``run`` every ``interval_s`` while the block runs."""
    monitor = SystemMetricsMonitor(
        run.run_id, sampling_interval=interval_s, resume_logging=True, tracking_uri=run.uri
    )
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()


class StageRun(RunLogger):
    """The parent run of one stage invocation (made by :func:`stage_run`); picklable.

    The driver creates the children with :meth:`child`, so tasks never create runs
    concurrently. When the stage run ends, children still RUNNING (a task never started, or
    its worker died) are ended with the stage's status.
    """

    def __init__(
        self,
        uri: str,
        run_id: str,
        experiment_id: str,
        stage: str,
        inherited: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(uri, run_id)
        self.experiment_id, self.stage = experiment_id, stage
        self.inherited = dict(inherited or {})  # tags every child carries too (source, profile)
        self.children: list[str] = []

    def child(
        self, name: str, params: Mapping[str, Any], identity: Mapping[str, str] | None = None
    ) -> str:
        """A RUNNING nested run ``name`` with ``params``; its run id, for a task.

        ``identity`` (tags such as a grid cell's key and fingerprint) makes the run resumable:
        an unfinished run of this stage with the same identity (a cell interrupted under the
        same fingerprint, which resumes from its checkpoint) is resumed instead of creating a
        new one; it moves under this stage run and keeps its metric history.
        """
        tags = {
            **(identity or {}),
            PARENT_TAG: self.run_id,
            "stage": self.stage,
            **self.inherited,
            **driver_tags(),
        }
        earlier = None
        if identity:
            wanted = {**identity, "stage": self.stage}
            earlier = find_run(self.uri, self.experiment_id, wanted, UNFINISHED)
        if earlier is not None:
            _retry(self.client.update_run, earlier, status="RUNNING")
            RunLogger(self.uri, earlier).set_tags({**tags, RESUMED_TAG: "true"})
            self.children.append(earlier)
            return earlier
        run = _retry(self.client.create_run, self.experiment_id, tags=tags, run_name=name)
        run_id = run.info.run_id
        self.children.append(run_id)
        profile = {k: v for k, v in self.inherited.items() if k == PROFILE_TAG}
        RunLogger(self.uri, run_id).log_params({**profile, **params})
        return run_id

    def finish(self, status: str = "FINISHED") -> None:
        """End the children left RUNNING, then this run, with ``status``."""
        for run_id in self.children:
            if _retry(self.client.get_run, run_id).info.status == "RUNNING":
                _retry(self.client.set_terminated, run_id, status)
        super().finish(status)


def find_run(
    uri: str, experiment_id: str, tags: Mapping[str, str], statuses: Collection[str]
) -> str | None:
    """The newest run of ``experiment_id`` with all ``tags`` and one of the ``statuses``; None if
    there is none."""
    query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
    runs = _retry(
        MlflowClient(uri).search_runs,
        [experiment_id],
        query,
        order_by=["attributes.start_time DESC"],
        max_results=50,
    )
    return next((run.info.run_id for run in runs if run.info.status in statuses), None)


def experiment_of(uri: str, run_id: str) -> str:
    """The experiment id of run ``run_id``."""
    return _retry(MlflowClient(uri).get_run, run_id).info.experiment_id


def driver_tags() -> dict[str, str]:
    """Where this process runs: a run tagged with them and left RUNNING by a process that is
    gone was interrupted (see :func:`end_orphans`)."""
    return {"driver.host": socket.gethostname(), "driver.pid": str(os.getpid())}


def system_tags() -> dict[str, str]:
    """What decides the numbers besides code and settings: library versions and the CPU kernels
    torch and MKL pick (results differ in the last digits between kernel choices)."""
    tags = {
        "system.python": platform.python_version(),
        "system.torch": torch.__version__,
        "system.numpy": np.__version__,
        "system.machine": platform.machine(),
        "system.cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "system.threads": str(torch.get_num_threads()),
        "system.cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    }
    for variable in PORTABILITY_ENV:
        tags[f"system.{variable}"] = os.environ.get(variable, "unset")
    return tags


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_orphans(uri: str, experiment_id: str, stage: str) -> list[str]:
    """Mark KILLED the runs of ``stage`` left RUNNING by a driver of this host that is gone
    (killed with ``kill -9``, a lost machine...), with the reason as a tag; their ids."""
    host = socket.gethostname()
    runs = _retry(
        MlflowClient(uri).search_runs,
        [experiment_id],
        f"tags.stage = '{stage}' and tags.`driver.host` = '{host}' and "
        "attributes.status = 'RUNNING'",
        max_results=1000,
    )
    ended = []
    for run in runs:
        pid = int(run.data.tags.get("driver.pid", "0"))
        if pid and pid != os.getpid() and not _alive(pid):
            logger = RunLogger(uri, run.info.run_id)
            logger.set_tags({END_REASON_TAG: f"its driver (pid {pid} on {host}) is gone"})
            _retry(logger.client.set_terminated, run.info.run_id, "KILLED")
            ended.append(run.info.run_id)
    return ended


def _git(*args: str) -> str | None:
    """The output of ``git *args`` in the working directory; None outside a git checkout."""
    try:
        result = subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def source_tags(stage: str) -> dict[str, str]:
    """Where a run's code comes from, in the tags the MLflow UI shows (Source, Version, User):
    the stage's entrypoint, the git commit and branch of the checkout, whether tracked files had
    uncommitted changes (a DVC experiment's ``-S`` overrides change params.yaml), and the DVC
    experiment that ran it. Outside a git checkout (a Ray job's working directory), the commit
    and dirtiness the submitter put in ``$LEARNABLE_SPARSITY_GIT_COMMIT`` / ``_GIT_DIRTY``."""
    tags = {
        "mlflow.source.name": f"pipelines/{stage.partition('/')[0]}.py",
        "mlflow.source.type": "LOCAL",
        "mlflow.user": getpass.getuser(),
    }
    commit = _git("rev-parse", "HEAD")
    if not commit and os.environ.get(GIT_COMMIT_ENV):  # a Ray job's copy of the checkout
        tags[GIT_COMMIT_TAG] = os.environ[GIT_COMMIT_ENV]
        tags[GIT_DIRTY_TAG] = os.environ.get(GIT_DIRTY_ENV, "unknown")
    if commit:
        tags[GIT_COMMIT_TAG] = commit
        changed = _git("status", "--porcelain", "--untracked-files=no")
        tags[GIT_DIRTY_TAG] = "true" if changed else "false"
        branch = _git("rev-parse", "--abbrev-ref", "HEAD")
        if branch and branch != "HEAD":
            tags["mlflow.source.git.branch"] = branch
    if os.environ.get("DVC_EXP_NAME"):
        tags[DVC_EXPERIMENT_TAG] = os.environ["DVC_EXP_NAME"]
    return tags


def start_stage_run(uri: str, experiment: str, stage: str, params: Mapping[str, Any]) -> StageRun:
    """A new RUNNING parent run of one invocation of ``stage``: named ``stage``, tagged with the
    stage, its source (:func:`source_tags`) and the params profile, with ``params`` flattened.
    Its children get the same source and profile. End it with ``finish``."""
    experiment_id = prepare(uri, experiment)
    for run_id in end_orphans(uri, experiment_id, stage):
        log.warning("MLflow run %s of an interrupted %s marked KILLED", run_id, stage)
    inherited = source_tags(stage)
    if "profile" in params:
        inherited[PROFILE_TAG] = str(params["profile"])
    tags = {"stage": stage, **inherited, **driver_tags(), **system_tags()}
    client = MlflowClient(uri)
    run = _retry(client.create_run, experiment_id, tags=tags, run_name=stage)
    handle = StageRun(uri, run.info.run_id, experiment_id, stage, inherited)
    try:
        handle.log_params(params)
    except BaseException:
        handle.finish("FAILED")
        raise
    return handle


@contextmanager
def stage_run(
    uri: str, experiment: str, stage: str, params: Mapping[str, Any]
) -> Iterator[StageRun]:
    """:func:`start_stage_run` as a context: FINISHED, or FAILED if the block raises."""
    with start_stage_run(uri, experiment, stage, params) as handle:
        yield handle
