"""Settings of the core's tests."""

from __future__ import annotations

import os
import shutil

import pytest

# Without a C++ compiler the fused kernels cannot be built: only the eager solvers are tested.
NO_COMPILER = (
    None
    if shutil.which(os.environ.get("CXX", "g++"))
    else "no C++ compiler ($CXX, default g++): the fused kernels are not built"
)
needs_compiler = pytest.mark.skipif(NO_COMPILER is not None, reason=str(NO_COMPILER))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "eager_solvers: runs on the eager solvers only (looks at their internals)"
    )
