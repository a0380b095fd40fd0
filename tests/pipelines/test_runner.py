"""The Ray grid runner: order, failures, retries of crashed workers, resources, connection."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import pipelines
from learnable_sparsity.errors import LearnableSparsityError
from pipelines.scaffold.runner import Resources, run_grid

ROOT = Path(__file__).resolve().parents[2]

# Ray tasks must be top-level functions of an importable module (conftest puts this folder on the
# workers' PYTHONPATH).


def square(cell: dict) -> dict:
    time.sleep(cell.get("sleep", 0.0))
    return {"x": cell["x"], "square": cell["x"] ** 2}


def square_or_fail(cell: dict) -> dict:
    if cell["x"] == 1:
        raise ValueError("cell one is broken")
    time.sleep(0.3)  # the others finish after the failure
    Path(cell["marker"]).touch()
    return {"x": cell["x"]}


def crash_once(cell: dict) -> dict:
    marker = Path(cell["marker"])
    if not marker.exists():
        marker.touch()
        os._exit(1)  # the worker process dies, as when killed or out of memory
    return {"attempt": "retried"}


def torch_threads(cell: dict) -> dict:
    return {"threads": torch.get_num_threads()}


def where_am_i(cell: dict) -> dict:
    return {"cwd": os.getcwd(), "pipelines": pipelines.__file__}


def test_results_come_back_in_cell_order(ray_local: None) -> None:
    # Later cells sleep less, so they finish first.
    cells = [{"x": x, "sleep": 0.05 * (5 - x)} for x in range(6)]
    results = run_grid(square, cells, resources=Resources(), description="order")
    assert results == [{"x": x, "square": x * x} for x in range(6)]


def test_a_failing_cell_is_reported_after_the_others_finish(
    ray_local: None, tmp_path: Path
) -> None:
    cells = [{"x": x, "marker": str(tmp_path / f"done{x}")} for x in range(4)]
    with pytest.raises(LearnableSparsityError) as caught:
        run_grid(square_or_fail, cells, resources=Resources(), description="failing")
    message = str(caught.value)
    assert "failing: 1 of 4 cells failed" in message
    assert f"cell 1: ValueError: cell one is broken\n      the cell: {cells[1]!r}" in message
    assert 'raise ValueError("cell one is broken")' in message  # the remote traceback
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done0", "done2", "done3"]


def test_a_gpu_request_on_a_cpu_cluster_fails_at_once(ray_local: None) -> None:
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            run_grid(square, [{"x": 1}], resources=Resources(num_gpus=1), description="gpu")
        except BaseException as error:
            errors.append(error)

    start = time.perf_counter()
    thread = threading.Thread(target=submit, daemon=True)  # a hang fails the test, not the run
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "run_grid waits for a GPU that the cluster does not have"
    assert time.perf_counter() - start < 10
    assert len(errors) == 1 and isinstance(errors[0], LearnableSparsityError)
    assert "no GPU is available" in str(errors[0])
    assert "set num_gpus (params ray.task_gpus) to 0" in str(errors[0])


def test_more_cpus_per_task_than_a_node_has_is_refused(ray_local: None) -> None:
    with pytest.raises(LearnableSparsityError, match=r"num_cpus=3\b.*ray\.task_cpus"):
        run_grid(square, [{"x": 1}], resources=Resources(num_cpus=3), description="cpus")


def test_a_crashed_worker_is_retried(ray_local: None, tmp_path: Path) -> None:
    cells = [{"marker": str(tmp_path / "crashed")}]
    results = run_grid(crash_once, cells, resources=Resources(), description="crash", max_retries=1)
    assert results == [{"attempt": "retried"}]


def test_a_crashed_worker_without_retries_is_a_failed_cell(ray_local: None, tmp_path: Path) -> None:
    cells = [{"marker": str(tmp_path / "crashed")}]
    with pytest.raises(
        LearnableSparsityError, match=r"1 of 1 cells failed:\n  - cell 0: WorkerCrashedError"
    ):
        run_grid(crash_once, cells, resources=Resources(), description="crash", max_retries=0)


@pytest.mark.parametrize(("num_cpus", "threads"), [(1, 1), (2, 2), (0.5, 1)])
def test_torch_threads_in_a_task_follow_its_cpus(
    ray_local: None, num_cpus: float, threads: int
) -> None:
    results = run_grid(
        torch_threads, [{}], resources=Resources(num_cpus=num_cpus), description="threads"
    )
    assert results == [{"threads": threads}]


def test_workers_run_the_drivers_checkout_in_its_directory(ray_local: None) -> None:
    [result] = run_grid(where_am_i, [{}], resources=Resources(), description="import")
    assert result == {"cwd": os.getcwd(), "pipelines": pipelines.__file__}


def test_an_empty_grid_needs_no_ray() -> None:
    assert run_grid(square, [], resources=Resources(), description="empty") == []


@pytest.mark.parametrize(
    ("field", "value"), [("num_cpus", -1), ("num_gpus", -0.5), ("num_cpus", float("nan"))]
)
def test_invalid_resources_are_refused(field: str, value: float) -> None:
    with pytest.raises(LearnableSparsityError, match=rf"{field} .* got {value!r}"):
        Resources(**{field: value})


def test_an_unreachable_cluster_is_a_clear_error() -> None:
    # A fresh process: connect() reuses a Ray that is already initialised.
    script = (
        "from learnable_sparsity.errors import LearnableSparsityError\n"
        "from pipelines.scaffold.runner import connect\n"
        "for address in ('127.0.0.1:1', None):\n"
        "    try:\n"
        "        connect(address)\n"
        "    except LearnableSparsityError as error:\n"
        "        print(error)\n"
    )
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert time.perf_counter() - start < 30
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert "'127.0.0.1:1' (from params ray.address)" in lines[0]
    assert "'127.0.0.1:1' (from RAY_ADDRESS)" in lines[1]
    assert all("RAY_AUTH_MODE=token" in line for line in lines)
