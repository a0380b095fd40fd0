"""Fixtures for the pipeline tests: one local Ray for the whole session, MLflow in a temp dir.

Ray pickles task functions by reference, so a worker must be able to import the test module
that defines them: the folder of these tests goes on the workers' PYTHONPATH.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray

HERE = Path(__file__).resolve().parent
STARTUP_TIMEOUT_S = 120
RAY = str(Path(sys.executable).with_name("ray"))  # the environment's `ray` command
AGENT_PORTS = (
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
)


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """A local Ray with 2 CPUs and no GPU, started once and shut down after the last test."""
    python_path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    ray.init(
        address="local",  # not a cluster that `ray start` may have left on this machine
        num_cpus=2,
        num_gpus=0,
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"PYTHONPATH": python_path}},
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An absolute SQLite tracking URI shared by the session (the schema migrates once, ~4 s);
    tests keep apart by using their own experiment names."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow').resolve() / 'mlflow.db'}"


def _start_server(
    folder: Path, *options: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` on 127.0.0.1 (SQLite in ``folder``, proxied artifacts in
    ``folder/artifacts``) with ``options``, once it answers /health: (process, URI)."""
    port = free_port()
    command = [
        *(sys.executable, "-m", "mlflow", "server", *options),
        *("--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}"),
        *("--artifacts-destination", str(folder / "artifacts")),
        *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
    ]
    # Without MLflow's job execution for GenAI jobs: eight processes (~240 MB each) no test uses.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    wait_for_health(process, uri, "mlflow server")
    return process, uri


def wait_for_health(process: subprocess.Popen, uri: str, name: str) -> None:
    """Return once the server ``process`` started answers ``uri``/health; fail if it exits or
    does not answer within STARTUP_TIMEOUT_S."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        assert process.poll() is None, f"{name} exited"
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).close()
            return
        except (urllib.error.URLError, OSError):
            assert time.monotonic() < deadline, f"{name} did not start"
            time.sleep(0.5)


def _stop_server(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)  # the server and its web workers
    process.wait(timeout=30)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real `mlflow server` on 127.0.0.1 (SQLite backend, proxied artifacts, as on a
    cluster), shared by the session; (its URI, its artifacts folder)."""
    folder = tmp_path_factory.mktemp("server")
    process, uri = _start_server(folder)
    yield uri, folder / "artifacts"
    _stop_server(process)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class RayCluster:
    """A Ray cluster started with `ray start --head`: its dashboard (the Jobs API) and the
    environment its clients need (token authentication)."""

    dashboard: str
    env: dict[str, str]


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """A real single-node Ray cluster on 127.0.0.1 as `ray start --head` makes one, with token
    authentication (RAY_AUTH_MODE=token, its own token), 2 CPUs and no GPU. Its own temp
    directory (short: Ray's socket paths are limited) keeps it out of `ray.init()`'s way."""
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    token = tmp_path_factory.mktemp("ray-token") / "token"
    token.write_text(secrets.token_hex(32))
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    dashboard_port = free_port()
    command = [
        *(RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1"),
        f"--port={free_port()}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        *("--num-cpus=2", "--num-gpus=0", f"--temp-dir={temp}", "--disable-usage-stats"),
        # Ports of its own: the session's local Ray (ray_local) already holds the defaults of
        # the agents (52365 for the job agent, which then never comes up).
        *(f"--{name}={free_port()}" for name in AGENT_PORTS),
    ]
    log = open(temp / "head.log", "w")  # noqa: SIM115 (open while the head runs)
    head = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    cluster = RayCluster(f"http://127.0.0.1:{dashboard_port}", env)
    # Ready once it runs a job: its dashboard answers before the job agent does ("No available
    # agent to submit job").
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        assert head.poll() is None, "ray start --head exited"
        ready = subprocess.run(
            [RAY, "job", "submit", "--address", cluster.dashboard, "--", "python", "-c", "pass"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if ready.returncode == 0:
            break
        assert time.monotonic() < deadline, f"the Ray head runs no job: {ready.stderr[-800:]}"
        time.sleep(2)
    yield cluster
    os.killpg(head.pid, signal.SIGTERM)  # `--block` takes the cluster's processes down with it
    try:
        head.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=30)
    log.close()
    shutil.rmtree(temp, ignore_errors=True)
