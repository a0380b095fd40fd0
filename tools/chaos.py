"""Faults at cluster scale: a sweep on a two-node Ray cluster, its worker node killed whole, then
its trial workers killed one by one, and what each fault lost.

    make chaos      # or: .venv/bin/python tools/chaos.py [--kill-every S] [--out FILE]

On this machine, with loopback addresses: a Ray head (``ray start --head``, token
authentication, ``HEAD_CPUS`` CPUs) and a worker node (``ray start --address``, a raylet of its
own with ``NODE_CPUS`` CPUs and its own temp dir), the tracking server as docs/tracking.md
starts it (``deploy/mlflow-server.sh``: basic authentication, no permission without a grant) with
a non-admin user holding EDIT on the experiment (``deploy/mlflow_user.py``), as whom the sweeps
and the checks log and read, and a copy of the project (its tracked files, on the ci profile,
with the digits its ``images`` stage makes). The sweep (``sweep_spec``: ``TRIALS`` trials of
``train_lvm@ssvae``, 4 methods × 6 seeds, each checkpointing as it trains) is submitted three
times as a user submits it,
``python -m pipelines.sweeps.run SPEC --submit DASHBOARD``, each under a name of its own:

* ``twin``: no fault, the reference every other trial is compared with;
* ``node_death``: once a quarter of the trials finished and a trial on the worker node has
  written a checkpoint, the worker node is SIGKILLed whole (its ``ray start``, raylet, agents and
  every worker: the process tree of its ``ray start`` and whatever names its temp dir), left down
  ``--node-down`` seconds, then started again;
* ``worker_kills``: every ``--kill-every`` seconds one Ray worker process running a trial, chosen
  at random on either node, is SIGKILLed, until the sweep ends; once fewer trials run than the
  cluster's slots, a tick kills with probability running / slots (each worker keeps the hazard
  of a full cluster: ``choose_victim``).

Each faulted sweep is checked against the twin: its job SUCCEEDED with every trial finished
(its retries counted from the job's log), every metric point of every trial's MLflow run there
exactly once (the twin's points, by metric and step; MLflow's own ``system/`` samples and the
wall time ``task_seconds`` aside), no run of the store left RUNNING, and each trial's cell result
(its ``done.json``: metrics, curves, the checkpoint's digest) and metric values equal to its
twin's. The counts go to reports/measurements/chaos/result.json; the command exits 1 if a check
failed, 2 if it could not run. It refuses to start where something listens on any of its ports,
on any address (a Ray it did not start; the head's Ray Client server included), and stops every
process it started, whatever happens, within ``--timeout``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import yaml

from learnable_sparsity.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "reports/measurements/chaos/result.json"
PYTHON = sys.executable
RAY = str(Path(PYTHON).with_name("ray"))  # the environment's `ray` command
HOST = "127.0.0.1"
EXPERIMENT = "learnable-sparsity"  # params.yaml's mlflow.experiment
SERVER_SCRIPT = ROOT / "deploy/mlflow-server.sh"  # the documented tracking server
USER_SCRIPT = ROOT / "deploy/mlflow_user.py"  # the documented user and grant
USER = "chaos"  # the non-admin user the sweeps log as: EDIT on EXPERIMENT only
# What the stages write: the copy of the project starts without them (as tests/conftest.py's).
OUTPUTS = ("data/corpora", "data/bpe", "data/images", "models/", "results/")

# The cluster: the head takes one trial at a time, the worker node two, so that most trials run
# on the node that dies.
HEAD_CPUS, NODE_CPUS = 1, 2
SLOTS = HEAD_CPUS + NODE_CPUS  # trials running at once: each takes one CPU
OBJECT_STORE_BYTES = 100 * 1024**2  # per node; the trials pass no objects (Ray's minimum: 75 MiB)
# Ports Ray would otherwise take at their defaults on both nodes (and another Ray's on this
# machine): each node gets free ones.
NODE_PORTS = (
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
)

# The sweep: 4 methods × 6 seeds of the ci-sized semi-supervised VAE. A trial logs its 6 curves
# every LOG_EVERY steps and checkpoints every CHECKPOINT_EVERY, flushing its points first: a
# resumed trial logs again only what followed its checkpoint, which MLflow never received.
METHODS = ("dense", "sparsemax", "sfe", "gumbel")
SEEDS = tuple(range(6))
TRIALS = len(METHODS) * len(SEEDS)
STEPS, LOG_EVERY, CHECKPOINT_EVERY = 300, 10, 50
# Retries per trial. A kill every 15 s among the 3 trials running hits each every ~45 s on
# average, and each attempt first spends ~15 s starting (a Ray worker, imports, MLflow) before it
# trains on from its checkpoint. At the pace of the 6168f6c record (a trial ~85 s, 6 checkpoints)
# a simulation of that process gives a trial more than 5 kills 15% of the time (2 of its 24
# trials failed so), more than 20 under 0.01% (any of 24 trials: 0.1-0.4%). Retries are what
# the run tests, not their number: every trial must still finish, every point once.
MAX_FAILURES = 20
# The process title of a Ray worker running a trial: Tune wraps a function trainable
# (pipelines.sweeps.trials.run_trial) in its class ImplicitFunc, the actor's class.
TRIAL_WORKER = "ray::ImplicitFunc"
# Not MLflow points of a trial's own: MLflow's system samples (one per interval of wall time)
# and the cell's wall time (logged at each checkpoint).
UNCOUNTED = re.compile(r"system/|task_seconds$")

STARTUP_TIMEOUT_S = 180
SAMPLE_S = 0.5  # how often the process trees are looked at
# pipelines.sweeps.trials.SweepProgress's warning per retried trial: its id and name.
RETRIED = re.compile(r"trial \S+ \[(.+?)\] failed \(.*retrying it")
PHASES = ("twin", "node_death", "worker_kills")


class ChaosError(Exception):
    """The command could not do what it set out to (a check that fails is no error)."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def refuse_taken(ports: dict[str, int]) -> None:
    """Refuse to start where something already listens on one of ``ports`` (option → port), on
    any address: Ray binds some servers to every interface and others to the host's address
    only, so the port is bound on all of them, not probed on loopback."""
    for option, port in ports.items():
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no one
            try:
                probe.bind(("", port))
            except OSError:
                raise ChaosError(
                    f"something listens on port {port} (--{option}): a Ray cluster or server "
                    "this command did not start? Stop it (`ray stop`) or choose another port"
                ) from None


@dataclass
class Group:
    """A command run in a session of its own, and every process it leads to: its process tree,
    and any process whose command line names the path ``marker`` or a path under it (one that
    left the tree)."""

    command: list[str]
    marker: str
    log: Path
    env: dict[str, str] | None = None
    process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def processes(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                leader = psutil.Process(self.process.pid)
                for process in [leader, *leader.children(recursive=True)]:
                    found[process.pid] = process
        # The marker as a path of its own, or a folder above one (not /a/node in /a/nodes).
        names = re.compile(re.escape(self.marker) + "(?=/|$)")
        for process in psutil.process_iter(["cmdline"]):
            if any(names.search(part) for part in process.info["cmdline"] or ()):
                found.setdefault(process.pid, process)
        found.pop(os.getpid(), None)
        return list(found.values())

    def kill(self) -> int:
        """SIGKILL every process of the group at once; how many there were."""
        processes = self.processes()
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(processes, timeout=30)
        if self.process is not None:
            self.process.wait(timeout=30)
        return len(processes)

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM the group, SIGKILL what is left after ``grace_s``."""
        processes = self.processes()
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.terminate()
        _, alive = psutil.wait_procs(processes, timeout=grace_s)
        if alive or self.processes():
            self.kill()
        elif self.process is not None:
            self.process.wait(timeout=30)


@dataclass
class Cluster:
    """The head, the worker node and the tracking server, in ``folder``."""

    folder: Path
    gcs_port: int
    dashboard_port: int
    mlflow_port: int
    client_port: int
    env: dict[str, str] = field(init=False)
    head: Group = field(init=False)
    node: Group = field(init=False)
    server: Group = field(init=False)
    node_starts: int = 0

    def __post_init__(self) -> None:
        token = self.folder / "token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_USAGE_STATS_ENABLED": "0",
            "MLFLOW_TRACKING_URI": self.tracking_uri,
            "PYTHONUNBUFFERED": "1",
        }
        head, node = self.folder / "head", self.folder / "node"  # neither a prefix of the other
        head.mkdir()
        node.mkdir()
        self.head = Group(
            [
                *(RAY, "start", "--head", "--block", f"--node-ip-address={HOST}"),
                *(f"--port={self.gcs_port}", f"--dashboard-host={HOST}"),
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={self.client_port}",
                *self._node_options(HEAD_CPUS, head),
            ],
            str(head),
            self.folder / "head.log",
            self.env,
        )
        self.node = Group(
            [
                *(RAY, "start", f"--address={HOST}:{self.gcs_port}", "--block"),
                f"--node-ip-address={HOST}",
                *self._node_options(NODE_CPUS, node),
            ],
            str(node),
            self.folder / "node.log",
            self.env,
        )
        # The tracking server as docs/tracking.md starts it (basic authentication, nobody sees
        # an experiment without a grant); the sweeps log as a user with EDIT on theirs only.
        store = self.folder / "mlflow"
        self.server = Group(
            ["bash", str(SERVER_SCRIPT), str(store), str(self.mlflow_port)],
            str(store),
            self.folder / "mlflow.log",
            {**os.environ, "PATH": f"{Path(PYTHON).parent}:{os.environ.get('PATH', '')}"},
        )

    @staticmethod
    def _node_options(cpus: int, temp: Path) -> list[str]:
        return [
            *(f"--num-cpus={cpus}", "--num-gpus=0", f"--temp-dir={temp}"),
            *(f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats"),
        ]

    @property
    def dashboard(self) -> str:
        return f"http://{HOST}:{self.dashboard_port}"

    @property
    def tracking_uri(self) -> str:
        return f"http://{HOST}:{self.mlflow_port}"

    def start(self) -> None:
        self.server.start()
        self._wait_for_server()
        self._log_in()
        self._fresh_ports(self.head)
        self.head.start()
        self._wait(lambda: self._runs_a_job(), "the Ray head runs no job")
        self.start_node()

    def _log_in(self) -> None:
        """The admin (its first-start credentials) makes the user ``USER`` with EDIT on
        ``EXPERIMENT`` (deploy/mlflow_user.py); this process, the nodes and the submissions
        then use that user's credentials, as a machine that logs does."""
        admin = self.folder / "admin"
        (admin / ".mlflow").mkdir(parents=True)
        shutil.copy(self.folder / "mlflow" / "admin.credentials", admin / ".mlflow/credentials")
        credentials = self.folder / f"{USER}.credentials"
        env = {k: v for k, v in self.server.env.items() if not k.startswith("MLFLOW_TRACKING_")}
        done = subprocess.run(
            [
                *(PYTHON, str(USER_SCRIPT), self.tracking_uri, USER, EXPERIMENT),
                *("--permission", "EDIT", "--credentials", str(credentials)),
            ],
            env={**env, "HOME": str(admin)},
            capture_output=True,
            text=True,
            timeout=STARTUP_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise ChaosError(f"the MLflow user was not made: {done.stderr[-2000:]}")
        parsed = dict(
            line.split(" = ", 1) for line in credentials.read_text().splitlines() if " = " in line
        )
        login = {
            "MLFLOW_TRACKING_USERNAME": parsed["mlflow_tracking_username"],
            "MLFLOW_TRACKING_PASSWORD": parsed["mlflow_tracking_password"],
        }
        self.env.update(login)  # the nodes' and the submissions' (Group.env is this dict)
        os.environ.update(login)  # this process's checks'
        (self.folder / "mlflow" / "admin.credentials").unlink()

    def start_node(self) -> None:
        """Start the worker node (again) and wait until the head counts two nodes alive."""
        self._fresh_ports(self.node)
        self.node.start()
        self.node_starts += 1
        self._wait(lambda: self.alive_nodes() == 2, "the worker node did not join")

    def stop(self) -> None:
        """Stop every process this cluster started, the nodes together."""
        threads = [
            threading.Thread(target=group.stop) for group in (self.node, self.head, self.server)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def alive_nodes(self) -> int:
        done = subprocess.run(
            [
                *(RAY, "list", "nodes", "--address", self.dashboard),
                *("--format", "json", "--filter", "state=ALIVE"),
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return len(json.loads(done.stdout)) if done.returncode == 0 else 0

    @staticmethod
    def _fresh_ports(group: Group) -> None:
        group.command = [c for c in group.command if c.split("=")[0][2:] not in NODE_PORTS]
        group.command += [f"--{name}={free_port()}" for name in NODE_PORTS]

    def _runs_a_job(self) -> bool:
        done = subprocess.run(
            [RAY, "job", "submit", "--address", self.dashboard, "--", "python", "-c", "pass"],
            env=self.env,
            capture_output=True,
            timeout=120,
        )
        return done.returncode == 0

    def _wait_for_server(self) -> None:
        def healthy() -> bool:
            try:
                urllib.request.urlopen(f"{self.tracking_uri}/health", timeout=2).close()
            except (urllib.error.URLError, OSError):
                return False
            return True

        self._wait(healthy, "the MLflow server did not start")

    def _wait(self, ready: Callable[[], bool], failure: str) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not ready():
            for group in (self.server, self.head, self.node):
                if group.process is not None and group.process.poll() is not None:
                    raise ChaosError(f"{failure}: {group.command[0]} exited, see {group.log}")
            if time.monotonic() > deadline:
                raise ChaosError(f"{failure} in {STARTUP_TIMEOUT_S} s")
            time.sleep(1)


class Watcher(threading.Thread):
    """Looks at both nodes' process trees every ``SAMPLE_S`` seconds: on which node (``head``,
    ``node``, ``node#2`` once restarted...) each trial worker seen ran (``seen``: pid → node)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster, self.seen, self.done = cluster, {}, threading.Event()

    def trial_workers(self) -> list[tuple[str, psutil.Process]]:
        nodes = {"head": self.cluster.head, self._node_label(): self.cluster.node}
        workers = []
        for label, group in nodes.items():
            for process in group.processes():
                with contextlib.suppress(psutil.Error):
                    if " ".join(process.cmdline()).startswith(TRIAL_WORKER):
                        workers.append((label, process))
        return workers

    def _node_label(self) -> str:
        starts = self.cluster.node_starts
        return "node" if starts <= 1 else f"node#{starts}"

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            for label, process in self.trial_workers():
                self.seen.setdefault(process.pid, label)


def sweep_spec(storage: Path) -> dict[str, Any]:
    return {
        "stages": ["train_lvm@ssvae"],
        "profile": "ci",
        "params": {
            "lvm.ssvae.steps": STEPS,
            "lvm.ssvae.log_every": LOG_EVERY,
            "lvm.ssvae.checkpoint_every": CHECKPOINT_EVERY,
        },
        "search": {
            "lvm.ssvae.methods": {"grid": list(METHODS)},
            "lvm.ssvae.seeds": {"grid": list(SEEDS)},
        },
        "metric": "accuracy",
        "mode": "max",
        "max_failures": MAX_FAILURES,
        "storage": str(storage),
    }


def make_project(folder: Path, env: dict[str, str]) -> Path:
    """A copy of the project's files (as a clone has them, without the stages' outputs, a git
    checkout) on the ci profile, with the data its ``images`` stage makes."""
    project = folder / "project"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file() and not name.startswith(OUTPUTS):
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, project / name)
    # A git checkout, as a clone is: --submit packs the files git tracks or would track.
    subprocess.run(["git", "init", "-q"], cwd=project, check=True, capture_output=True)
    for command in (["pipelines.commands.profile", "ci"], ["pipelines.stages.lvm.images"]):
        done = subprocess.run(
            [PYTHON, "-m", *command], cwd=project, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise ChaosError(f"{' '.join(command)} failed in {project}:\n{done.stderr[-2000:]}")
    return project


@dataclass
class Sweep:
    """One submission of the sweep under ``name``, in ``project``; Ray Tune's state and the
    trials' folders in ``storage``/``name``."""

    name: str
    project: Path
    cluster: Cluster
    storage: Path
    deadline: float
    process: subprocess.Popen | None = None
    started: float = 0.0
    started_epoch: float = 0.0  # the same moment on the clock MLflow's run times are on
    ended: float = 0.0  # when the submitter was first seen to have ended

    @property
    def log(self) -> Path:
        return self.cluster.folder / f"{self.name}.log"

    def submit(self) -> None:
        spec = self.project / "sweeps" / f"{self.name}.yaml"
        spec.write_text(yaml.safe_dump(sweep_spec(self.storage.parent), sort_keys=False))
        command = [PYTHON, "-m", "pipelines.sweeps.run", f"sweeps/{self.name}.yaml"]
        self.started, self.started_epoch = time.monotonic(), time.time()
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [*command, "--submit", self.cluster.dashboard],
                cwd=self.project,
                env=self.cluster.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the submitter ended (at most ``timeout`` s, or until the deadline, when
        it is stopped: an error); whether it ended."""
        remaining = self.deadline - time.monotonic()
        try:
            self.process.wait(timeout=remaining if timeout is None else min(timeout, remaining))
        except subprocess.TimeoutExpired:
            if time.monotonic() < self.deadline:
                return False
            self.stop()
            raise ChaosError(f"sweep {self.name} did not end within --timeout") from None
        self.ended = self.ended or time.monotonic()
        return True

    def stop(self) -> None:
        if self.running():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def trial_runs(self, client: Any) -> list[Any]:
        """The MLflow runs of this sweep's trials, as they are now."""
        found = client.get_experiment_by_name(EXPERIMENT)  # the first job creates it
        if found is None:
            return []
        query = f"tags.stage = 'sweep/{self.name}'"
        runs = client.search_runs([found.experiment_id], query, max_results=1000)
        return [run for run in runs if "trial" in run.data.tags]  # not the parent run


def kill_node_mid_sweep(
    sweep: Sweep, client: Any, watcher: Watcher, down_s: float
) -> list[dict[str, Any]]:
    """Once a quarter of the trials finished and a trial on the worker node has written a
    checkpoint (flushed that many points), SIGKILL the node whole; ``down_s`` later, start it
    again. The kill: when, how many processes, which trials were running on the node."""
    points_at_checkpoint = CHECKPOINT_EVERY // LOG_EVERY
    while sweep.running():
        on_node = {p.pid for label, p in watcher.trial_workers() if label != "head"}
        runs = sweep.trial_runs(client)
        finished = sum(run.info.status == "FINISHED" for run in runs)
        running = [
            run
            for run in runs
            if run.info.status == "RUNNING" and int(run.data.tags["driver.pid"]) in on_node
        ]
        checkpointed = any(
            len(client.get_metric_history(run.info.run_id, "loss")) >= points_at_checkpoint
            for run in running
        )
        if 4 * finished >= TRIALS and checkpointed:
            at = time.monotonic() - sweep.started
            processes = sweep.cluster.node.kill()
            log(f"{sweep.name}: worker node SIGKILLed at {at:.0f} s ({processes} processes)")
            time.sleep(down_s)
            sweep.cluster.start_node()
            log(f"{sweep.name}: worker node started again after {down_s:.0f} s")
            return [
                {
                    "at_s": round(at, 1),
                    "processes": processes,
                    "trials_running_on_node": sorted(run.info.run_name for run in running),
                    "down_s": down_s,
                }
            ]
        time.sleep(SAMPLE_S)
    raise ChaosError(f"sweep {sweep.name} ended before the worker node could be killed mid-sweep")


def choose_victim(workers: list[Any], rng: random.Random) -> Any | None:
    """The trial worker to kill at a tick, or None: one of ``workers`` with probability
    ``len(workers) / SLOTS``, so that every worker keeps the hazard it has in a full cluster
    (one kill per ``SLOTS`` ticks on average), however few trials are left. Killing one at
    every tick would kill the last trial of a draining sweep every tick, faster than a retried
    trial starts and reports: at e9a6a1e (2026-11-29) the last trial was killed 10 times in a
    row, 15 s apart, none of those attempts reaching its cell, until its 20 retries ran out."""
    if not workers or rng.random() >= len(workers) / SLOTS:
        return None
    return rng.choice(workers)


def kill_workers_throughout(
    sweep: Sweep, watcher: Watcher, every_s: float, rng: random.Random
) -> tuple[list[dict[str, Any]], list[tuple[float, int]]]:
    """Every ``every_s`` seconds until the sweep ends, SIGKILL the trial worker of either node
    that ``choose_victim`` picks, if any. The kills: when, which node, which process, and how
    many trial workers were running; and every tick's (when, trial workers running), so that a
    record shows whether the faults lasted as long as the trials."""
    kills, ticks = [], []
    while not sweep.wait(timeout=every_s):
        workers = watcher.trial_workers()
        ticks.append((round(time.monotonic() - sweep.started, 1), len(workers)))
        chosen = choose_victim(workers, rng)
        if chosen is None:
            continue
        label, victim = chosen
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.kill()
            at = time.monotonic() - sweep.started
            kills.append(
                {"at_s": round(at, 1), "node": label, "pid": victim.pid, "running": len(workers)}
            )
            log(f"{sweep.name}: trial worker {victim.pid} on {label} SIGKILLed at {at:.0f} s")
    return kills, ticks


def trial_record(client: Any, run: Any, storage: Path) -> dict[str, Any]:
    """A finished trial as the checks compare it: its status, its counted MLflow points (metric →
    [(step, value)], in the order logged) and its cell's ``done.json``."""
    points = {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in sorted(run.data.metrics)
        if not UNCOUNTED.match(key)
    }
    trial = run.data.tags["trial"]
    done = sorted((storage / "trials" / trial).glob("models/lvm/ssvae/*/*/done.json"))
    return {
        "status": run.info.status,
        "pid": int(run.data.tags["driver.pid"]),
        "points": points,
        "done": json.loads(done[0].read_text()) if len(done) == 1 else None,
    }


def point_counts(trials: dict[str, dict], twin: dict[str, dict]) -> dict[str, int]:
    """The twin's points (trial, metric, step): how many; of those, how many ``trials`` holds
    once, not at all, more than once; how many points ``trials`` holds in all, and that the twin
    has not."""

    def points(records: dict[str, dict]) -> Counter:
        return Counter(
            (name, key, step)
            for name, record in records.items()
            for key, logged in record["points"].items()
            for step, _ in logged
        )

    expected, found = points(twin), points(trials)
    return {
        "expected": len(expected),
        "found_once": sum(found[point] == 1 for point in expected),
        "missing": sum(found[point] == 0 for point in expected),
        "duplicated": sum(found[point] > 1 for point in expected),
        "found": sum(found.values()),
        "unexpected": sum(n for point, n in found.items() if point not in expected),
    }


def running_runs(client: Any) -> int:
    """Runs of the store (every experiment) left RUNNING."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_runs(experiments, "attributes.status = 'RUNNING'", max_results=1000))


def phase_outcome(
    sweep: Sweep, client: Any, watcher: Watcher, twin: dict[str, dict] | None
) -> tuple[dict[str, Any], dict[str, dict]]:
    """The counts of a sweep that ended, and its trials' records (by trial name)."""
    text = sweep.log.read_text()
    retried = RETRIED.findall(text)
    runs = sweep.trial_runs(client)
    trials = {run.info.run_name: trial_record(client, run, sweep.storage) for run in runs}
    statuses = Counter(t["status"] for t in trials.values())
    outcome: dict[str, Any] = {
        # The sweep, from its submission to the submitter's end; then the checks, which read
        # every trial's points back from the server (about 3 minutes at 4230b81, 2 cores).
        "wall_s": round(sweep.ended - sweep.started, 1),
        "checks_s": round(time.monotonic() - sweep.ended, 1),
        "job": "SUCCEEDED" if sweep.process.returncode == 0 else "not SUCCEEDED",
        "trials": len(trials),
        "finished": statuses["FINISHED"],
        "failed": statuses["FAILED"],
        "retries": len(retried),
        "retried_trials": len(set(retried)),
        "running_runs": running_runs(client),
        "trials_started_on": dict(
            sorted(Counter(watcher.seen.get(t["pid"], "unseen") for t in trials.values()).items())
        ),
        "trial_workers_seen": dict(sorted(Counter(watcher.seen.values()).items())),
    }
    ends = [run.info.end_time for run in runs if run.info.end_time]
    # When the last trial's run ended, after the submission: the rest of wall_s is the job's
    # report and the submitter's fetch of it.
    outcome["last_trial_ended_s"] = (
        round(max(ends) / 1000 - sweep.started_epoch, 1) if ends else None
    )
    reference = twin or trials
    outcome["metric_points"] = point_counts(trials, reference)
    if twin is not None:
        outcome["equal_to_twin"] = sum(same(t, twin.get(name)) for name, t in trials.items())
        equal = sum(same(trials.get(name), twin.get(name)) for name in set(retried))
        outcome["retried_equal_to_twin"] = f"{equal} of {len(set(retried))}"
        outcome["unequal_to_twin"] = {
            name: differences(t, twin.get(name))
            for name, t in sorted(trials.items())
            if not same(t, twin.get(name))
        }
    return outcome, trials


def same(trial: dict | None, twin: dict | None) -> bool:
    """Whether a trial's record equals its twin's (which ran in another process)."""
    return (
        trial is not None
        and twin is not None
        and trial["done"] is not None
        and trial | {"pid": None} == twin | {"pid": None}
    )


def differences(trial: dict | None, twin: dict | None) -> list[str]:
    """What of a trial's record differs from its twin's: its status, each metric whose points
    differ (where first, or only in their order), each part of its ``done.json`` that differs
    (one level down). The two records of e9a6a1e's and 6168f6c's runs that were neither failed
    nor equal could not be told apart after the fact; a record names them now."""
    if trial is None or twin is None:
        return ["no trial" if trial is None else "no twin"]
    found = []
    if trial["status"] != twin["status"]:
        found.append(f"status {trial['status']} (twin {twin['status']})")
    for key in sorted(trial["points"].keys() | twin["points"].keys()):
        mine, theirs = trial["points"].get(key, []), twin["points"].get(key, [])
        if mine == theirs:
            continue
        if sorted(mine) == sorted(theirs):
            found.append(f"points of {key}: their order")
            continue
        first = next((a for a, b in zip(mine, theirs, strict=False) if a != b), None)
        where = f"at (step, value) {first}" if first else f"{len(mine)} vs the twin's {len(theirs)}"
        found.append(f"points of {key}: {where}")
    done, done_twin = trial["done"], twin["done"]
    if done is None or done_twin is None:
        if done is not done_twin:
            found.append("done.json missing" if done is None else "the twin's done.json missing")
        return found
    for part in sorted(done.keys() | done_twin.keys()):
        mine, theirs = done.get(part), done_twin.get(part)
        if mine == theirs:
            continue
        if isinstance(mine, dict) and isinstance(theirs, dict):
            keys = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
            found.extend(f"done.json {part}.{key}" for key in keys)
        else:
            found.append(f"done.json {part}")
    return found


def own_points_ok(trials: dict[str, dict]) -> bool:
    """The twin's own points: every trial's loss at each logged step once, as the spec says."""
    steps = list(range(LOG_EVERY - 1, STEPS, LOG_EVERY))
    return len(trials) == TRIALS and all(
        sorted(step for step, _ in t["points"]["loss"]) == steps and t["done"] is not None
        for t in trials.values()
    )


def passed(outcome: dict[str, Any]) -> bool:
    points = outcome["metric_points"]
    return (
        outcome["job"] == "SUCCEEDED"
        and outcome["trials"] == outcome["finished"] == TRIALS
        and outcome["running_runs"] == 0
        and points["found_once"] == points["expected"]
        and points["unexpected"] == 0
        and outcome.get("equal_to_twin", TRIALS) == TRIALS
    )


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} chaos: {message}", flush=True)


def git(*arguments: str) -> str:
    return subprocess.run(
        ["git", *arguments], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Start the cluster in ``folder``, run the three sweeps, stop the cluster; the record."""
    from mlflow import MlflowClient

    deadline = time.monotonic() + args.timeout
    cluster = Cluster(folder, args.port, args.dashboard_port, args.mlflow_port, args.client_port)
    watcher = Watcher(cluster)
    phases: dict[str, Any] = {}
    sweep: Sweep | None = None
    try:
        cluster.start()
        project = make_project(folder, cluster.env)
        log(f"cluster up: head ({HEAD_CPUS} CPU) and worker node ({NODE_CPUS} CPUs), {folder}")
        watcher.start()
        client = MlflowClient(cluster.tracking_uri)
        twin: dict[str, dict] | None = None
        rng = random.Random(args.seed)
        for name in PHASES:
            sweep = Sweep(name, project, cluster, folder / "storage" / name, deadline)
            watcher.seen.clear()  # the trial workers of this sweep only
            sweep.submit()
            log(f"{name}: submitted")
            if name == "node_death":
                kills = kill_node_mid_sweep(sweep, client, watcher, args.node_down)
            elif name == "worker_kills":
                kills, ticks = kill_workers_throughout(sweep, watcher, args.kill_every, rng)
            else:
                kills = []
            sweep.wait()
            outcome, trials = phase_outcome(sweep, client, watcher, twin)
            outcome["kills"] = kills
            if name == "worker_kills":
                outcome["ticks"] = ticks
            if twin is None:
                outcome["points_as_specified"] = own_points_ok(trials)
                twin = trials
            killed = {n for kill in kills for n in kill.get("trials_running_on_node", ())}
            if killed:
                equal = sum(same(trials.get(n), twin.get(n)) for n in killed)
                outcome["killed_cells_equal_to_twin"] = f"{equal} of {len(killed)}"
            outcome["passed"] = passed(outcome) and outcome.get("points_as_specified", True)
            phases[name] = outcome
            counts = {k: v for k, v in outcome.items() if k not in ("kills", "ticks")}
            log(f"{name}: {json.dumps(counts)}")
    finally:
        watcher.done.set()
        if sweep is not None:
            sweep.stop()
        cluster.stop()
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kill-every", type=float, default=30.0, help="seconds between worker kills (30)"
    )
    parser.add_argument(
        "--node-down", type=float, default=20.0, help="seconds the dead node stays down (20)"
    )
    parser.add_argument(
        # Alone on 2 cores (2026-11-29, c58dbac) the twin took 720 s and the node death 820 s,
        # and the worker kills had not ended after 1385 s when 3000 s in all ran out: each of
        # the 24 trials is killed every ~45 s and restarts from its last checkpoint, up to 20
        # times. Checking every point reads each run's histories through basic auth.
        "--timeout",
        type=float,
        default=5400.0,
        help="seconds for everything (5400)",
    )
    parser.add_argument("--port", type=int, default=6479, help="the head's GCS port (6479)")
    parser.add_argument("--dashboard-port", type=int, default=8365, help="its dashboard's (8365)")
    parser.add_argument("--mlflow-port", type=int, default=5055, help="the tracking server's")
    parser.add_argument(
        "--client-port", type=int, default=10001, help="the head's Ray Client server's (10001)"
    )
    parser.add_argument("--seed", type=int, default=0, help="of the choice of worker to kill")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs)")
    args = parser.parse_args()
    for option in ("kill_every", "timeout"):
        if not getattr(args, option) > 0:
            parser.error(f"--{option.replace('_', '-')} must be > 0, got {getattr(args, option)}")
    if not args.node_down >= 0:
        parser.error(f"--node-down must be >= 0, got {args.node_down}")
    ports = {"port": args.port, "dashboard-port": args.dashboard_port}
    ports |= {"mlflow-port": args.mlflow_port, "client-port": args.client_port}
    for option, port in ports.items():
        if not 1024 <= port <= 65535:
            parser.error(f"--{option} must be a port in 1024-65535, got {port}")
    if len(set(ports.values())) < len(ports):
        parser.error(f"the ports must differ, got {ports}")
    try:
        refuse_taken(ports)
    except ChaosError as error:
        parser.exit(2, f"chaos: {error}\n")
    # A SIGTERM (a CI's timeout, `kill`) stops the cluster too, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    folder = Path(tempfile.mkdtemp(prefix="chaos-", dir="/tmp"))  # short: Ray's socket paths
    started = time.monotonic()
    try:
        phases = run(args, folder)
    except ChaosError as error:
        parser.exit(2, f"chaos: {error} (logs in {folder})\n")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    out = args.out.resolve()
    own = out.relative_to(ROOT).as_posix() if out.is_relative_to(ROOT) else None
    changed = [line[3:] for line in git("status", "--porcelain").splitlines()]
    record = {
        "command": " ".join(["python tools/chaos.py", *sys.argv[1:]]),
        "commit": git("rev-parse", "HEAD").strip(),
        "uncommitted_changes": any(path != own for path in changed),
        "wall_s": round(time.monotonic() - started, 1),
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version()},
        "versions": {name: metadata.version(name) for name in ("ray", "mlflow", "torch")},
        "cluster": {"head_cpus": HEAD_CPUS, "node_cpus": NODE_CPUS},
        "tracking": {
            "server": f"{SERVER_SCRIPT.relative_to(ROOT)} (basic authentication, NO_PERMISSIONS)",
            "user": f"{USER}: not an admin, EDIT on {EXPERIMENT} ({USER_SCRIPT.relative_to(ROOT)})",
        },
        "sweep": sweep_spec(Path("<storage>")) | {"trials": TRIALS},
        "kill_every_s": args.kill_every,
        "passed": all(phase["passed"] for phase in phases.values()),
        "phases": phases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(record, indent=2) + "\n")
    log(f"wrote {args.out}: {'passed' if record['passed'] else 'FAILED'}")
    raise SystemExit(0 if record["passed"] else 1)


if __name__ == "__main__":
    main()
