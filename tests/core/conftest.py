"""Settings of the core's tests, and the device they run on.

Every test that computes something runs on the CPU and, where PyTorch sees a GPU, again on CUDA
(the ``device`` fixture; ``test_normalizers.py`` derives its own from the solvers it tests).
Inputs are drawn on the CPU from seeded generators and then moved, so that both devices see the
same numbers (not the estimators' noise, which they draw on the scores' device).
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

# Without a C++ compiler the fused kernels cannot be built: only the eager solvers are tested.
NO_COMPILER = (
    None
    if shutil.which(os.environ.get("CXX", "g++"))
    else "no C++ compiler ($CXX, default g++): the fused kernels are not built"
)
needs_compiler = pytest.mark.skipif(NO_COMPILER is not None, reason=str(NO_COMPILER))

CUDA = torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "eager_solvers: runs on the eager solvers only (looks at their internals)"
    )


# Without CUDA the fixture is not parametrised, so that test ids stay those of a CPU-only run.
@pytest.fixture(params=["cpu", "cuda"] if CUDA else None)
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device a test builds its tensors and modules on: the CPU, then CUDA where present."""
    return torch.device(getattr(request, "param", "cpu"))
