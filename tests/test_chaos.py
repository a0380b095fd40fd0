"""The pieces of the chaos command (tools/chaos.py, `make chaos`: minutes, so not run here;
its last result is reports/measurements/chaos/result.json): its refusals before anything starts,
the killing of a node's processes, and the counting of metric points against the twin."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools/chaos.py"
chaos = load_script("tools/chaos.py")


def run_chaos(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--kill-every", "0"], "--kill-every must be > 0, got 0.0"),
        (["--node-down", "-1"], "--node-down must be >= 0, got -1.0"),
        (["--port", "80"], "--port must be a port in 1024-65535, got 80"),
        (["--port", "5055"], "the ports must differ"),
    ],
)
def test_bad_arguments_are_refused(arguments: list[str], message: str) -> None:
    done = run_chaos(*arguments)
    assert done.returncode == 2
    assert message in done.stderr


def test_a_port_something_listens_on_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        before = set(Path("/tmp").glob("chaos-*"))
        ports = ["--port", str(chaos.free_port()), "--mlflow-port", str(chaos.free_port())]
        out = ["--out", str(tmp_path / "result.json")]
        done = run_chaos(*ports, "--dashboard-port", str(port), *out)
    assert done.returncode == 2
    assert f"something listens on port {port} (--dashboard-port)" in done.stderr
    assert "did not start" in done.stderr
    assert set(Path("/tmp").glob("chaos-*")) == before  # no working folder, no cluster
    assert not (tmp_path / "result.json").exists()


def test_a_port_taken_on_another_address_only_is_refused(tmp_path: Path) -> None:
    """Ray binds its Ray Client server (10001 by default) to the host's address, not loopback:
    a listener there is found too (--client-port)."""
    addresses = [
        a.address
        for family in psutil.net_if_addrs().values()
        for a in family
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    if not addresses:
        pytest.skip("this machine has no IPv4 address but loopback")
    with socket.socket() as listener:
        listener.bind((addresses[0], 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = run_chaos("--client-port", str(port), "--out", str(tmp_path / "result.json"))
    assert done.returncode == 2
    assert f"something listens on port {port} (--client-port)" in done.stderr


def test_the_cluster_logs_as_a_non_admin_user_of_the_documented_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tracking server chaos starts is deploy/mlflow-server.sh's (authentication, nothing
    visible without a grant); the user it makes (deploy/mlflow_user.py) is no admin, holds EDIT
    on the experiment, and is what the nodes, the submissions and the checks log in as."""
    from mlflow import MlflowClient
    from mlflow.server import get_app_client

    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(name, "restored after the test")
    folder = tmp_path / "c"
    folder.mkdir()
    ports = [chaos.free_port() for _ in range(4)]
    cluster = chaos.Cluster(folder, *ports)
    try:
        cluster.server.start()
        cluster._wait_for_server()
        cluster._log_in()
        assert cluster.env["MLFLOW_TRACKING_USERNAME"] == chaos.USER
        assert "admin_password" not in (folder / "mlflow" / "basic_auth.ini").read_text()
        assert not (folder / "mlflow" / "admin.credentials").exists()
        auth = get_app_client("basic-auth", tracking_uri=cluster.tracking_uri)
        assert not auth.get_user(chaos.USER).is_admin
        client = MlflowClient(cluster.tracking_uri)
        experiment = client.get_experiment_by_name(chaos.EXPERIMENT).experiment_id
        permission = auth.get_user_permission(chaos.USER, "experiment", experiment)
        assert permission.permission == "EDIT"
        run = client.create_run(experiment)
        client.log_metric(run.info.run_id, "loss", 1.0, step=0)
        assert "ray-client-server-port" in " ".join(cluster.head.command)
    finally:
        cluster.server.stop()


def test_a_group_kills_its_process_tree_and_what_names_its_marker(tmp_path: Path) -> None:
    """A node's processes: the tree of its command (here a shell and its two children) and a
    process outside the tree whose command line names the node's folder; not another one."""
    marker = tmp_path / "node"
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    shell = ["bash", "-c", "sleep 300 & sleep 300 & wait"]
    group = chaos.Group(shell, str(marker), tmp_path / "log")
    group.start()
    outside = subprocess.Popen([*sleeper, str(marker)], start_new_session=True)
    other = subprocess.Popen([*sleeper, str(tmp_path / "nodes")], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(group.processes()) < 4:  # the shell forks its children
            assert time.monotonic() < deadline, group.processes()
            time.sleep(0.1)
        pids = {process.pid for process in group.processes()}
        assert {group.process.pid, outside.pid} <= pids and other.pid not in pids
        assert group.kill() == 4
        for pid in pids:  # gone, or a child of this test not yet reaped
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        assert other.poll() is None
        assert group.processes() == []
    finally:
        for process in (outside, other):
            process.kill()
            process.wait()


def test_points_are_counted_against_the_twin() -> None:
    """One point missing, one logged twice, one the twin has not."""
    twin = {"a": {"points": {"loss": [(9, 1.0), (19, 2.0)], "results/accuracy": [(0, 0.5)]}}}
    trials = {"a": {"points": {"loss": [(9, 1.0), (9, 1.0), (29, 3.0)], "other": [(0, 1.0)]}}}
    assert chaos.point_counts(trials, twin) == {
        "expected": 3,
        "found_once": 0,
        "missing": 2,
        "duplicated": 1,
        "found": 4,
        "unexpected": 2,
    }
    assert chaos.point_counts(twin, twin)["found_once"] == 3


def test_each_worker_keeps_the_hazard_of_a_full_cluster_as_the_sweep_drains() -> None:
    """A full cluster: a kill at every tick. One trial left: a kill at about one tick in SLOTS,
    not at every tick (the last trial of e9a6a1e's record, killed every 15 s, never finished)."""
    rng = random.Random(0)
    full = [("head", i) for i in range(chaos.SLOTS)]
    assert all(chaos.choose_victim(full, rng) in full for _ in range(200))
    assert chaos.choose_victim([], rng) is None
    last = [("node", 7)]
    kills = sum(chaos.choose_victim(last, rng) is not None for _ in range(3000))
    assert chaos.SLOTS == 3 and abs(kills / 3000 - 1 / 3) < 0.03


def test_a_trial_unequal_to_its_twin_is_named_with_what_differs() -> None:
    twin = {
        "status": "FINISHED",
        "pid": 1,
        "points": {"loss": [(9, 1.0), (19, 2.0)], "accuracy": [(0, 0.5)], "elbo": [(0, 1.0)]},
        "done": {"fingerprint": "f", "result": {"accuracy": 0.5, "curves": [1]}, "files": "d"},
    }
    trial = {
        "status": "FAILED",
        "pid": 2,
        "points": {"loss": [(19, 2.0), (9, 1.0)], "accuracy": [(0, 0.25)], "elbo": [(0, 1.0)]},
        "done": {"fingerprint": "f", "result": {"accuracy": 0.5, "curves": [2]}, "files": "e"},
    }
    assert chaos.differences(trial, twin) == [
        "status FAILED (twin FINISHED)",
        "points of accuracy: at (step, value) (0, 0.25)",
        "points of loss: their order",
        "done.json files",
        "done.json result.curves",
    ]
    assert chaos.differences(twin | {"pid": 5}, twin) == []
    assert chaos.differences(twin | {"done": None}, twin)[-1] == "done.json missing"
    assert chaos.differences(None, twin) == ["no trial"]


def test_every_tick_is_kept_with_the_trial_workers_running() -> None:
    """A record shows whether the kills lasted as long as the trials: a tick that finds no
    trial worker (or spares one) is kept, not only the kills."""

    class Sweep:
        name, started = "worker_kills", time.monotonic()
        ends = iter([False, False, False, True])

        def wait(self, timeout: float) -> bool:
            return next(self.ends)

    class Watcher:
        running = iter([[], [("head", psutil.Process())], []])

        def trial_workers(self) -> list:
            return next(self.running)

    never = random.Random(0)
    never.random = lambda: 1.0  # a tick with one worker of SLOTS spares it
    kills, ticks = chaos.kill_workers_throughout(Sweep(), Watcher(), 15.0, never)
    assert kills == []
    assert [running for _, running in ticks] == [0, 1, 0]


def test_a_sweeps_wall_time_ends_with_its_submitter_not_with_the_checks(tmp_path: Path) -> None:
    """The checks read every trial's points back afterwards (minutes): not the sweep's time."""
    sweep = chaos.Sweep("twin", tmp_path, None, tmp_path, deadline=time.monotonic() + 60)
    sweep.started = time.monotonic()
    sweep.process = subprocess.Popen([sys.executable, "-c", "pass"])
    assert sweep.wait()
    ended = sweep.ended
    time.sleep(0.2)
    assert sweep.wait() and sweep.ended == ended  # a second wait keeps the first end
    assert 0 < ended - sweep.started < 30
