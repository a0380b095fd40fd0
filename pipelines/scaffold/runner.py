"""Run a grid of independent cells as Ray tasks: locally by default, on a cluster on request.

A *task* is a function ``task(cell) -> dict``; cells are picklable objects and results plain
picklable dicts. The task must be a **top-level function of an importable module** (e.g.
``pipelines.scaffold.stage.execute_cell``): Ray pickles it by reference and each worker
imports its module, so lambdas, closures and bound methods are not supported.

Where the workers find the project's code: a local Ray (started by :func:`connect`) starts its
workers in the driver's working directory with that directory first on their ``sys.path``, so
``learnable_sparsity`` / ``pipelines`` are imported from the same checkout as in the driver
(also in a DVC experiment's temporary copy), with the editable install as fall-back. On a cluster,
submit the driver with ``ray job submit --working-dir . -- python -m pipelines.<stage>`` so
that the code travels with the job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch
from tqdm import tqdm

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import Settings, setting

log = logging.getLogger(__name__)

# Remote tracebacks are coloured with ANSI escape sequences; error messages keep plain text.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TRACEBACK_LINES = 8
_CELL_REPR_CHARS = 1000
_CONNECT_TIMEOUT_S = 5.0
LOG_FORMAT = "%(asctime)s %(name)s %(message)s"


@dataclass(frozen=True, kw_only=True)
class Resources(Settings):
    """What one task of a grid asks Ray for; ``num_cpus`` is also its number of torch threads
    (at least 1)."""

    num_cpus: float = setting(1.0, at_least=0)
    num_gpus: float = setting(0.0, at_least=0)


@dataclass(frozen=True, kw_only=True)
class RaySettings(Settings):
    """Params ``ray``: where grid cells run and what each asks for.

    ``address``: None for a local Ray of ``num_cpus`` CPUs (or ``$RAY_ADDRESS`` if set), else a
    cluster ("auto", "ray://host:10001"); ``task_cpus`` / ``task_gpus`` per grid cell (GPU
    counts stay 0 where the cluster has no GPU: such a task would wait forever).
    """

    address: str | None = None
    num_cpus: int = setting(2, at_least=1)
    task_cpus: float = setting(1.0, above=0)
    task_gpus: float = setting(0.0, at_least=0)

    @property
    def resources(self) -> Resources:
        return Resources(num_cpus=self.task_cpus, num_gpus=self.task_gpus)


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    """Make sure this process is connected to Ray.

    An already initialised Ray is reused as it is. Otherwise ``address`` (params
    ``ray.address``, e.g. ``"auto"`` or ``"ray://host:10001"``), else the environment variable
    ``RAY_ADDRESS``, names a running cluster to connect to. Without either, a local Ray is
    started with ``num_cpus`` CPUs (default: all of this machine's), the GPUs torch sees (none on
    a CPU build, so GPU requests fail fast instead of waiting) and no dashboard.
    """
    if ray.is_initialized():
        return
    with _own_sigterm_handler():
        _start_or_join(address, num_cpus)


@contextlib.contextmanager
def _own_sigterm_handler() -> Iterator[None]:
    """Keep this process's SIGTERM handler across ``ray.init``, which installs Ray's: under Ray
    2.60 a ``kill`` then aborted the driver (rc 134) while it waited on a task, so a stage's
    handler never ran and its MLflow runs ended FAILED instead of KILLED."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and handler is not None:
            signal.signal(signal.SIGTERM, handler)


def _start_or_join(address: str | None, num_cpus: int | None) -> None:
    source = "params ray.address"
    if not address:
        address, source = os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS"
    if address:
        _connect_cluster(address, source)
        return
    cpus = (os.cpu_count() or 1) if num_cpus is None else num_cpus
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
        raise LearnableSparsityError(f"ray.num_cpus must be an int >= 1, got {num_cpus!r}")
    gpus = torch.cuda.device_count()
    # address="local": a new Ray of its own, even where `ray start` left a cluster on this machine
    ray.init(
        address="local",
        num_cpus=cpus,
        num_gpus=gpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    log.info("started a local Ray with %d CPUs and %d GPUs", cpus, gpus)


def _connect_cluster(address: str, source: str) -> None:
    """``ray.init(address=...)``, failing fast with an explanation when it cannot be reached."""
    hint = (
        f"cannot reach the Ray cluster at {address!r} (from {source})"
        "; is it running? A cluster started with `ray start --head` uses token authentication:"
        " run this driver on a machine that has its token, with RAY_AUTH_MODE=token set. Or "
        "leave ray.address null and RAY_ADDRESS unset to start a local Ray."
    )
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        # ray.init retries an unreachable address for minutes; a refused TCP connection is fast.
        try:
            socket.create_connection((host, int(port)), timeout=_CONNECT_TIMEOUT_S).close()
        except OSError as error:
            raise LearnableSparsityError(f"{hint} ({error})") from None
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except ConnectionError as error:
        raise LearnableSparsityError(f"{hint} ({error})") from None
    log.info("connected to the Ray cluster at %s: %s", address, ray.cluster_resources())


def run_grid(
    task: Callable[[Any], dict],
    cells: Sequence[Any],
    *,
    resources: Resources,
    description: str,
    max_retries: int = 2,
    address: str | None = None,
    num_cpus: int | None = None,
) -> list[dict]:
    """``[task(cell) for cell in cells]``, one Ray task per cell, results in the order of cells.

    Connects first (see :func:`connect` for ``address`` / ``num_cpus``). Each task gets
    ``resources`` and that many torch threads; a task whose worker process dies (killed, out of
    memory) is retried up to ``max_retries`` times, while an exception raised by ``task`` is
    final. A progress bar counts finished cells. If cells fail, the others still run to the
    end; then a :class:`LearnableSparsityError` lists every failed cell with its error.
    """
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise LearnableSparsityError(f"max_retries must be an int >= 0, got {max_retries!r}")
    if not cells:
        return []
    connect(address, num_cpus)
    check_feasible(resources)
    remote = ray.remote(_run_cell)
    refs = [
        remote.options(
            num_cpus=resources.num_cpus,
            num_gpus=resources.num_gpus,
            max_retries=max_retries,
            retry_exceptions=False,
            name=f"{description}[{index}]",
        ).remote(task, cell, resources.num_cpus)
        for index, cell in enumerate(cells)
    ]
    index_of = {ref: index for index, ref in enumerate(refs)}
    results: list[dict | None] = [None] * len(cells)
    failures: list[str] = []
    pending = list(refs)
    start = time.perf_counter()
    with tqdm(total=len(cells), desc=description, unit="cell") as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            index = index_of[done[0]]
            try:
                results[index] = ray.get(done[0])
            except ray.exceptions.RayError as error:
                failures.append(_describe_failure(index, cells[index], error))
                bar.set_postfix(failed=len(failures))
            bar.update()
    log.info(
        "%s: %d cells in %.1f s, %d failed",
        description,
        len(cells),
        time.perf_counter() - start,
        len(failures),
    )
    if failures:
        raise LearnableSparsityError(
            f"{description}: {len(failures)} of {len(cells)} cells failed:\n" + "\n".join(failures)
        )
    return results


def _run_cell(task: Callable[[Any], dict], cell: Any, num_cpus: float) -> dict:
    """The Ray task around ``task``: log lines with times; torch gets as many threads as the
    task has CPUs."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, force=True)
    torch.set_num_threads(max(1, int(num_cpus)))
    return task(cell)


def check_feasible(resources: Resources) -> None:
    """Refuse a request no node of the connected Ray can satisfy: Ray would queue such a task
    forever."""
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    _check_nodes(nodes, resources, ray.cluster_resources().get("GPU", 0))


def _check_nodes(nodes: list[dict[str, float]], resources: Resources, gpus: float) -> None:
    if not any(node.get("GPU", 0) >= resources.num_gpus for node in nodes):
        raise LearnableSparsityError(
            f"each task asks for num_gpus={resources.num_gpus} but no GPU is available: no node "
            f"of the Ray cluster has that many (cluster: {gpus} GPUs); set num_gpus (params "
            "ray.task_gpus) to 0, or connect to a cluster with GPU workers (ray.address / "
            "RAY_ADDRESS)"
        )
    if not any(node.get("CPU", 0) >= resources.num_cpus for node in nodes):
        raise LearnableSparsityError(
            f"each task asks for num_cpus={resources.num_cpus} but no node of the Ray cluster "
            f"has that many (largest: {max(node.get('CPU', 0) for node in nodes)}); lower "
            "num_cpus (params ray.task_cpus) or raise ray.num_cpus"
        )


def check_ready(settings: RaySettings) -> None:
    """Refuse a per-cell request (``ray.task_cpus``, ``ray.task_gpus``) no node can give. A
    stage calls it first, whether or not a cell remains to run (a setting that cannot run must
    not pass, and land in ``dvc.lock``, because every cell was reused), and before it creates its
    cells' MLflow runs and directories: :func:`run_grid` checks too, but only once those exist
    (they would end FAILED for a mere setting). A connected Ray or a cluster is asked; a local
    Ray not started yet is judged by what :func:`connect` would give it (``ray.num_cpus`` or
    this machine's CPUs, the GPUs torch sees) without starting it."""
    if ray.is_initialized() or settings.address or os.environ.get("RAY_ADDRESS"):
        connect(settings.address, settings.num_cpus)
        check_feasible(settings.resources)
        return
    local = {"CPU": settings.num_cpus, "GPU": torch.cuda.device_count()}
    _check_nodes([local], settings.resources, local["GPU"])


def _describe_failure(index: int, cell: Any, error: ray.exceptions.RayError) -> str:
    """One failed cell for the error message: its error first (a full disk, named, is the
    line a user reads), then the cell and the end of its remote traceback."""
    shown = repr(cell)
    if len(shown) > _CELL_REPR_CHARS:
        shown = shown[:_CELL_REPR_CHARS] + " ...}"
    if isinstance(error, ray.exceptions.RayTaskError):
        # The first line names the Ray worker (ray::_run_cell() (pid=..)); the rest is the
        # traceback of the task's exception, which ends with "Type: message".
        lines = _ANSI.sub("", str(error)).strip().splitlines()[1:]
        cause = error.cause
        headline = f"{type(cause).__name__}: {cause}" if cause is not None else lines[-1]
    else:  # the worker died (out of retries), the task was cancelled, ...
        lines = _ANSI.sub("", str(error)).strip().splitlines()
        headline = f"{type(error).__name__}: {lines[0] if lines else ''}"
        lines = lines[1:]
    detail = "".join(f"\n      {line}" for line in lines[-_TRACEBACK_LINES:])
    return f"  - cell {index}: {headline}\n      the cell: {shown}{detail}"
