"""Provenance of a run: what besides code and settings decides its numbers, where its code comes
from, and what the machine did while it ran.

* :func:`source_tags` — the stage's entrypoint, git commit, branch and dirtiness, DVC experiment
  (the MLflow UI's Source, Version and User);
* :func:`system_tags` — library versions, the lock the environment was installed from (and whether
  it still matches it) and the CPU kernels torch and MKL pick;
* :func:`system_metrics` — CPU, memory, disk, network (and GPU) use sampled as ``system/...``
  metrics while a cell runs.
"""

from __future__ import annotations

import functools
import getpass
import os
import platform
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

from pipelines.scaffold.tracking.lock import locked_environment
from pipelines.stages import MODULES

if TYPE_CHECKING:
    from pipelines.scaffold.tracking.runs import RunLogger

GIT_COMMIT_TAG = "mlflow.source.git.commit"
GIT_DIRTY_TAG = "git.dirty"
GIT_COMMIT_ENV = "LEARNABLE_SPARSITY_GIT_COMMIT"
GIT_DIRTY_ENV = "LEARNABLE_SPARSITY_GIT_DIRTY"
DVC_EXPERIMENT_TAG = "dvc.experiment"
# Environment variables that pin the CPU kernels (docs/pipeline.md, "Rerunning on another machine").
PORTABILITY_ENV = (
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
)
# A smoke cell lasts from half a minute to a few minutes: a sample every 5 s draws its curve.
SYSTEM_METRICS_INTERVAL_S = 5.0


def _git(*args: str) -> str | None:
    """The output of ``git *args`` in the working directory; None outside a git checkout."""
    try:
        result = subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def entrypoint(stage: str) -> str:
    """The file that runs ``stage`` (``train_lvm/ssvae``: ``pipelines/stages/lvm/train_lvm.py``;
    ``sweep``: ``pipelines/sweeps/run.py``); a name no module runs (a test's grid) as it is."""
    name = stage.partition("/")[0]
    module = {**MODULES, "sweep": "pipelines.sweeps.run"}.get(name)
    return f"{module.replace('.', '/')}.py" if module else name


def source_tags(stage: str) -> dict[str, str]:
    """Where a run's code comes from, in the tags the MLflow UI shows (Source, Version, User):
    the stage's entrypoint, the git commit and branch of the checkout, whether tracked files had
    uncommitted changes (a DVC experiment's ``-S`` overrides change params.yaml), and the DVC
    experiment that ran it. Outside a git checkout (a Ray job's working directory), the commit
    and dirtiness the submitter put in ``$LEARNABLE_SPARSITY_GIT_COMMIT`` / ``_GIT_DIRTY``."""
    tags = {
        "mlflow.source.name": entrypoint(stage),
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


def system_tags() -> dict[str, str]:
    """What decides the numbers besides code and settings: library versions, the environment's
    lock (:mod:`pipelines.scaffold.tracking.lock`) and the CPU kernels torch and MKL pick (results
    differ in the last digits between kernel choices)."""
    tags = {
        **_environment_tags(),
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


@functools.cache
def _environment_tags() -> dict[str, str]:
    """The lock tags, read once per process (the installed distributions do not change)."""
    return locked_environment().tags()


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
