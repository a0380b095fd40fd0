"""The MLflow UI on the project's store, on its runs table: ``python -m pipelines.commands.ui``.

``mlflow ui`` started in the repository would do, with three catches this command removes: the
store must be named by its absolute path (``sqlite:////.../mlflow.db``); MLflow 3.17 opens an
experiment in its GenAI view unless the address asks for the classic one
(``?workflowType=machine_learning``; the experiment's ``mlflow.experimentKind`` tag is not enough
in this version); and it starts four web workers and a job execution of eight processes that a
runs browser does not use. With ``MLFLOW_TRACKING_URI`` naming a server it only prints that server's
address of the experiment.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from learnable_sparsity.errors import LearnableSparsityError
from pipelines.scaffold.params import load_params
from pipelines.scaffold.runner import LOG_FORMAT
from pipelines.scaffold.tracking.store import MlflowSettings, prepare, tracking_uri

log = logging.getLogger(__name__)
RUNS_TABLE = "workflowType=machine_learning"
STARTUP_TIMEOUT_S = 60.0
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"  # mlflow.environment_variables


def experiment_address(base: str, experiment_id: str) -> str:
    """The UI address of an experiment's runs table."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{RUNS_TABLE}"


def start_ui(uri: str, host: str, port: int) -> subprocess.Popen:
    """``mlflow ui`` on the SQLite store ``uri``, once it answers (an error if it does not):
    one web worker, no job execution."""
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri]
    # One web worker serves one person's browser (mlflow's default of 4 takes 4× the memory and,
    # on a busy machine, minutes to start).
    command += ["--host", host, "--port", str(port), "--workers", "1"]
    # MLflow 3.17 also starts its job execution (a runner and seven Huey consumers, ~240 MB
    # each) for GenAI jobs (prompt optimisation, scorers) that a runs browser never runs.
    env = {**os.environ, JOB_EXECUTION_ENV: "false"}
    # Its own process group: stopping it stops the web workers it starts too.
    server = subprocess.Popen(command, env=env, start_new_session=True)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise LearnableSparsityError(
                f"mlflow ui exited with status {server.returncode} (is port {port} of {host} "
                "in use? choose another with --port)"
            )
        try:
            urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2).close()
            return server
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    stop(server)
    raise LearnableSparsityError(f"mlflow ui did not answer on {host}:{port} within a minute")


def stop(server: subprocess.Popen) -> None:
    """Stop ``mlflow ui`` and its workers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        experiment = load_params().settings("mlflow", MlflowSettings).experiment
        uri = tracking_uri(Path.cwd())
        experiment_id = prepare(uri, experiment)
        if not uri.startswith("sqlite:"):
            print(f"runs of {experiment!r}: {experiment_address(uri, experiment_id)}")
            return
        server = start_ui(uri, args.host, args.port)
    except LearnableSparsityError as error:
        log.error("%s", error)
        raise SystemExit(1) from None
    base = f"http://{args.host}:{args.port}"
    print(f"runs of {experiment!r}: {experiment_address(base, experiment_id)}")
    print("Ctrl-C stops the UI", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` stops the server too
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(server)


if __name__ == "__main__":
    main()
