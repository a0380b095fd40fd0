"""Settings of the core's tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "eager_solvers: runs on the eager solvers only (looks at their internals)"
    )
