"""Test-session settings and fixtures shared by every test module."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# The unit tests use small tensors, for which intra-op threads cost more than they save (and CI
# has 2 cores shared with other processes).
torch.set_num_threads(1)

CHROMIUM = shutil.which("chromium")
# Debian's Chromium headless in a closed network (flags from the machine's notes): no sandbox as
# root, no background connections that the network refuses.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
    "--virtual-time-budget=20000",  # let the page's scripts fetch and render the runs
)


@pytest.fixture
def browse(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Path], str]:
    """``browse(address, screenshot)``: the DOM of ``address`` once rendered by headless
    Chromium, with a screenshot saved at ``screenshot``. Skips the test without Debian's
    chromium (``make test`` installs it where it can)."""
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (make test installs it)")

    def render(address: str, screenshot: Path) -> str:
        for mode in ([f"--screenshot={screenshot}"], ["--dump-dom"]):
            profile = tmp_path_factory.mktemp("chromium")
            done = subprocess.run(
                [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *mode, address],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
        return done.stdout

    return render
