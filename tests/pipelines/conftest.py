"""Fixtures for the pipeline tests: one local Ray for the whole session, MLflow in a temp dir.

Ray pickles task functions by reference, so a worker must be able to import the test module
that defines them: the folder of these tests goes on the workers' PYTHONPATH.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """A local Ray with 2 CPUs and no GPU, started once and shut down after the last test."""
    python_path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    ray.init(
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
