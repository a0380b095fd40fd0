"""Test-session settings and fixtures shared by every test module."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from learnable_sparsity.errors import LearnableSparsityError
from tests.loopback import LoopbackServer, serving

# The devices a test of "every device" runs on: the CPU always, CUDA when torch can use it.
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]

# Without a GPU, Triton's interpreter runs the core's Triton kernels on the CPU (tests/core/
# test_triton.py). It must be chosen before triton is first imported: triton's own library
# functions (tl.sum, ...) are jit'd at that import.
if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"


# The unit tests use small tensors, for which intra-op threads cost more than they save (and CI
# has 2 cores shared with other processes).
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
# What the stages write: a copy of the project starts without them.
OUTPUTS = ("data/corpora", "data/bpe", "data/images", "models/", "results/")


def refused(message: str) -> pytest.RaisesExc:
    """Bad input refused with exactly ``message``, word for word."""
    return pytest.raises(LearnableSparsityError, match=f"^{re.escape(message)}$")


def load_script(relative: str) -> ModuleType:
    """A script of the tree outside the packages (tools/, benchmarks/) as a module named by its
    file: its folder on sys.path while it loads (for its helpers), the module in sys.modules (its
    dataclasses look their module up), loaded once."""
    path = ROOT / relative
    loaded = sys.modules.get(path.stem)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def copy_project(destination: Path) -> None:
    """The project's files as a user's clone has them (those git tracks or would track), without
    the stages' outputs, copied into ``destination``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file() and not name.startswith(OUTPUTS):
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)


@pytest.fixture(scope="session")
def project_files() -> Callable[[Path], None]:
    """:func:`copy_project`, for test modules in other folders (which cannot import this one)."""
    return copy_project


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
# No network for a page that must work offline: no host name resolves, and every connection goes
# to a proxy that is not there (file:// pages still load).
CHROMIUM_OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9")


@pytest.fixture
def browse(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """``browse(address, screenshot, offline=False)``: the DOM of ``address`` once rendered by
    headless Chromium (without network if ``offline``), with a screenshot saved at
    ``screenshot``. Skips the test without Debian's chromium (``make test`` installs it where it
    can)."""
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (make test installs it)")

    def render(address: str, screenshot: Path, *, offline: bool = False) -> str:
        flags = [*CHROMIUM_FLAGS, *(CHROMIUM_OFFLINE if offline else ())]
        for mode in ([f"--screenshot={screenshot}"], ["--dump-dom"]):
            profile = tmp_path_factory.mktemp("chromium")
            done = subprocess.run(
                [CHROMIUM, *flags, f"--user-data-dir={profile}", *mode, address],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
        return done.stdout

    return render


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    """A loopback HTTP server (tests/loopback.py) for the download and preflight tests."""
    with serving() as httpd:
        yield httpd
