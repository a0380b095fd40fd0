"""MLflow runs: one parent run per stage invocation, one child run per grid cell.

Usage pattern (driver, then Ray tasks; ``pipelines.scaffold.stage`` does this for every stage)::

    uri = tracking_uri(Path.cwd())
    stage = start_stage_run(uri, experiment, "train_nmt", params)   # prepares the store once
    run_id = stage.child(cell_key, cell_params)   # children are created by the driver
    ...                                           # hand RunLogger(uri, run_id) to the Ray task
    # in the task:
    with RunLogger(uri, run_id) as run:
        run.log_metrics({metric_name("alpha", block, "head0"): 1.3}, step)
    stage.finish("FINISHED")                      # also ends children left RUNNING

Metrics are buffered and written in batches; every call to the store is retried while it is busy
(:func:`pipelines.scaffold.tracking.store.retry`). A stage's runs left RUNNING by a driver that is
gone (``kill -9``) are ended KILLED when the stage next starts (:func:`end_orphans`).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag

from learnable_sparsity.errors import LearnableSparsityError
from pipelines.scaffold.tracking.provenance import source_tags, system_tags
from pipelines.scaffold.tracking.store import prepare, retry

log = logging.getLogger(__name__)
T = TypeVar("T")

# MLflow's limits (mlflow.utils.validation).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_PARAM_VALUE_CHARS = 6000
MAX_NAME_CHARS = 250
STATUSES = ("FINISHED", "FAILED", "KILLED")
UNFINISHED = ("RUNNING", "FAILED", "KILLED")
PROFILE_TAG = "profile"
PARENT_TAG = "mlflow.parentRunId"
RESUMED_TAG = "resumed"
END_REASON_TAG = "end_reason"
DATA_CONTEXT_TAG = "mlflow.data.context"

_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_\-./ ]")


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
            "build it with pipelines.scaffold.tracking.runs.metric_name"
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


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


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
        # (metric, step) points the run held when skip_written was called: not written again.
        self._written: frozenset[tuple[str, int]] = frozenset()

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
            if (key, int(step)) not in self._written:
                self._buffer.append(Metric(key, number, timestamp, int(step)))
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def latest(self, key: str) -> float | None:
        """The value of metric ``key`` at its latest step in this run (written ones only)."""
        history = retry(self.client.get_metric_history, self.run_id, key)
        return max(history, key=lambda m: (m.step, m.timestamp)).value if history else None

    def skip_written(self, *, except_keys: Collection[str] = ()) -> None:
        """From now on, drop every point at a (metric, step) the run already holds, but those of
        ``except_keys`` (running totals re-logged at one step on purpose). A resumed attempt
        re-logs the points after its checkpoint, and an earlier attempt may have written some
        of them (its buffer flushed between checkpoints): each point is then in the run once."""
        run = retry(self.client.get_run, self.run_id)
        self._written = frozenset(
            (key, point.step)
            for key in run.data.metrics
            if key not in except_keys
            for point in retry(self.client.get_metric_history, self.run_id, key)
        )

    def flush(self) -> None:
        """Write the buffered metrics (batches of at most 1000)."""
        while self._buffer:
            batch = self._buffer[:MAX_METRICS_PER_BATCH]
            retry(self.client.log_batch, self.run_id, metrics=batch)
            del self._buffer[: len(batch)]

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log nested ``params`` flattened (see :func:`flatten_params`)."""
        entries = [Param(key, value) for key, value in flatten_params(params).items()]
        for batch in _chunks(entries, MAX_PARAMS_TAGS_PER_BATCH):
            retry(self.client.log_batch, self.run_id, params=batch)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set tags on the run (values as text)."""
        entries = [RunTag(key, str(value)) for key, value in tags.items()]
        for batch in _chunks(entries, MAX_PARAMS_TAGS_PER_BATCH):
            retry(self.client.log_batch, self.run_id, tags=batch)

    def log_datasets(self, datasets: Collection[Dataset], context: str) -> None:
        """Record ``datasets`` as the run's inputs (the UI's Datasets column), used as
        ``context`` (e.g. the stage that read them)."""
        tags = [InputTag(DATA_CONTEXT_TAG, context)]
        inputs = [DatasetInput(dataset, tags) for dataset in datasets]
        if inputs:
            retry(self.client.log_inputs, self.run_id, inputs)

    def log_dict(self, data: dict, artifact_file: str) -> None:
        """Save ``data`` as the artifact ``artifact_file`` (JSON, or YAML by extension)."""
        retry(self.client.log_dict, self.run_id, data, artifact_file)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Copy the file or directory ``path`` into the run's artifacts (under artifact_path)."""
        if not Path(path).exists():
            raise LearnableSparsityError(f"artifact {path} does not exist")
        retry(self.client.log_artifact, self.run_id, str(path), artifact_path)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Save a matplotlib ``figure`` as the artifact ``artifact_file`` (format by extension)."""
        retry(self.client.log_figure, self.run_id, figure, artifact_file)

    def finish(self, status: str = "FINISHED") -> None:
        """Flush the metrics, then end the run with ``status`` (FAILED if the flush fails)."""
        if status not in STATUSES:
            raise LearnableSparsityError(f"run status must be one of {STATUSES}, got {status!r}")
        try:
            self.flush()
        except BaseException:
            retry(self.client.set_terminated, self.run_id, "FAILED")
            raise
        retry(self.client.set_terminated, self.run_id, status)


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
        self,
        name: str,
        params: Mapping[str, Any],
        identity: Mapping[str, str] | None = None,
        resume: Collection[str] = UNFINISHED,
    ) -> str:
        """A RUNNING nested run ``name`` with ``params``; its run id, for a task.

        ``identity`` (tags such as a grid cell's key and fingerprint) makes the run resumable:
        a run of this stage with the same identity and one of the statuses ``resume`` (by
        default an unfinished one: a cell interrupted under the same fingerprint, which resumes
        from its checkpoint) is resumed instead of creating a new one; it moves under this stage
        run and keeps its metric history.
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
            earlier = find_run(self.uri, self.experiment_id, wanted, resume)
        if earlier is not None:
            retry(self.client.update_run, earlier, status="RUNNING")
            RunLogger(self.uri, earlier).set_tags({**tags, RESUMED_TAG: "true"})
            self.children.append(earlier)
            return earlier
        run = retry(self.client.create_run, self.experiment_id, tags=tags, run_name=name)
        run_id = run.info.run_id
        self.children.append(run_id)
        profile = {k: v for k, v in self.inherited.items() if k == PROFILE_TAG}
        RunLogger(self.uri, run_id).log_params({**profile, **params})
        return run_id

    def finish(self, status: str = "FINISHED") -> None:
        """End the children left RUNNING, then this run, with ``status``."""
        for run_id in self.children:
            if retry(self.client.get_run, run_id).info.status == "RUNNING":
                retry(self.client.set_terminated, run_id, status)
        super().finish(status)


def find_run(
    uri: str, experiment_id: str, tags: Mapping[str, str], statuses: Collection[str]
) -> str | None:
    """The newest run of ``experiment_id`` with all ``tags`` and one of the ``statuses``; None if
    there is none."""
    query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
    runs = retry(
        MlflowClient(uri).search_runs,
        [experiment_id],
        query,
        order_by=["attributes.start_time DESC"],
        max_results=50,
    )
    return next((run.info.run_id for run in runs if run.info.status in statuses), None)


def driver_tags() -> dict[str, str]:
    """Where this process runs: a run tagged with them and left RUNNING by a process that is
    gone was interrupted (see :func:`end_orphans`)."""
    return {"driver.host": socket.gethostname(), "driver.pid": str(os.getpid())}


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
    runs = retry(
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
            retry(logger.client.set_terminated, run.info.run_id, "KILLED")
            ended.append(run.info.run_id)
    return ended


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
    run = retry(client.create_run, experiment_id, tags=tags, run_name=stage)
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
