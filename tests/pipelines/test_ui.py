"""`python -m pipelines.commands.ui` (`make ui`) on a small store: a runs browser, without the
processes of MLflow's job execution (a job runner and seven Huey consumers of ~240 MB each in MLflow
3.17),
that still serves the runs table. The e2e test opens it on the store of a real `dvc repro`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient

from pipelines.scaffold.params import PARAMS_FILE, load_params
from pipelines.scaffold.tracking.store import MlflowSettings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What the command lines of MLflow's job execution hold: `python -m mlflow.server.jobs._job_runner`
# and its `python -m huey.bin.huey_consumer mlflow.server.jobs....`.
JOB_PROCESSES = "mlflow.server.jobs"
RUN_NAME = "a run to browse"


def test_the_ui_serves_the_runs_table_without_job_consumers(
    tmp_path: Path, browse: Callable[[str, Path], str]
) -> None:
    shutil.copy(ROOT / PARAMS_FILE, tmp_path / PARAMS_FILE)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = load_params(ROOT / PARAMS_FILE).settings("mlflow", MlflowSettings).experiment
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment(experiment), run_name=RUN_NAME)
    client.set_terminated(run.info.run_id)
    # In a folder of its own (mlflow ui may make its artifacts folder there), this tree's code.
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ui = subprocess.Popen(
        [sys.executable, "-m", "pipelines.commands.ui", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        # It prints the address once the server answers, after it started what it starts.
        line = ui.stdout.readline()
        while line and "http://" not in line:
            line = ui.stdout.readline()
        address = line[line.index("http://") :].strip()
        processes = psutil.Process(ui.pid).children(recursive=True)
        commands = [" ".join(process.cmdline()) for process in processes]
        assert any(" mlflow ui " in command for command in commands), commands
        assert not [command for command in commands if JOB_PROCESSES in command]
        page = browse(address, tmp_path / "runs.png")
        assert ">Runs<" in page and RUN_NAME in page
    finally:
        ui.terminate()
        ui.wait(timeout=30)
