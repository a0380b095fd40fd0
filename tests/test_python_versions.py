"""The package on a supported Python other than CI's 3.11: it installs there, from a copy of the
project and not editable (so what the wheel lacks is missing), and the core's oracle tests pass
against that installed copy, the fused C++ kernels compiled at first use under that Python.

A test rather than a Makefile step so that it runs in CI's one test command, reports a skip with
its reason in pytest's summary, and can be run alone. The subset is ``test_normalizers.py``:
every normalizer against the ``entmax`` oracle, brute force and gradcheck, on the fused kernels
and the eager solvers (about a minute). The Triton interpreter tests stay on 3.11: they take
minutes, and torch's CUDA build brings a Triton (3.7.1) whose interpreter they fail.

The environment is kept under ``~/.cache/learnable-sparsity/venvs``, one per Python and
``pyproject.toml``: on 3.12 and 3.13 pip takes PyPI's CUDA build of torch (about 6 GB installed,
five minutes on 2 cores) and the package index here sends nothing pip's cache keeps. A changed
``pyproject.toml`` installs everything anew; otherwise only the project is reinstalled.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
VENVS = Path.home() / ".cache/learnable-sparsity/venvs"
CORE_TESTS = "tests/core/test_normalizers.py"


def _version(python: str) -> str | None:
    """``python``'s ``major.minor``, or None where it does not run (a pyenv shim of a version
    that is not selected answers with an error)."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _other_supported_python() -> tuple[str, str] | None:
    """(path, version) of the newest Python on the machine that ``requires-python`` admits, other
    than the one running the tests: ``python3.X`` on PATH, then pyenv's versions."""
    requires = tomllib.loads(PYPROJECT.read_text())["project"]["requires-python"]
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    newest_first = (f"3.{minor}" for minor in range(30, 7, -1))
    wanted = [v for v in newest_first if v in SpecifierSet(requires)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for version in (v for v in wanted if v != running):
        found = [shutil.which(f"python{version}")]
        found += sorted(map(str, pyenv.glob(f"{version}.*/bin/python{version}")), reverse=True)
        for python in filter(None, found):
            if _version(python) == version:
                return python, version
    return None


OTHER = _other_supported_python()


def _run(command: list[str | Path], timeout: int, cwd: Path | None = None) -> str:
    """Run ``command``; its output, or a failure that shows its end."""
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{output[-4000:]}"
    return output


def _environment(python: str, version: str, project: Path) -> Path:
    """The kept environment of ``python`` for this ``pyproject.toml``, with ``project`` installed
    (with everything ``[dev]`` names, where the environment is new)."""
    key = hashlib.sha256(PYPROJECT.read_bytes() + version.encode()).hexdigest()[:16]
    venv = VENVS / f"py{version}-{key}"
    if (venv / "installed").exists():
        _run([venv / "bin/pip", "install", "-q", "--no-deps", "--force-reinstall", project], 600)
        return venv
    for stale in VENVS.glob(f"py{version}-*"):  # an older pyproject.toml's, or a failed install
        shutil.rmtree(stale)
    _run([python, "-m", "venv", venv], 300)
    _run([venv / "bin/pip", "install", "-q", f"{project}[dev]"], 1800)
    _run([venv / "bin/pip", "check"], 300)
    (venv / "installed").touch()
    return venv


@pytest.mark.slow
@pytest.mark.skipif(
    OTHER is None,
    reason="no Python other than this one that requires-python admits is on this machine "
    "(looked for python3.X on PATH and under pyenv's versions)",
)
def test_the_core_passes_its_oracle_tests_installed_on_another_python(
    tmp_path: Path, project_files: Callable[[Path], None]
) -> None:
    assert OTHER is not None
    python, version = OTHER
    project = tmp_path / "project"
    project_files(project)
    venv = _environment(python, version, project)
    # The tests alone, so that `learnable_sparsity` is imported from the installed package.
    suite = tmp_path / "suite"
    shutil.copytree(project / "tests", suite / "tests")
    shutil.copy2(PYPROJECT, suite)  # pytest's settings (markers)
    where = _run(
        [
            venv / "bin/python",
            "-c",
            "import learnable_sparsity; print(learnable_sparsity.__file__)",
        ],
        60,
        suite,
    )
    assert Path(where.strip()).is_relative_to(venv), where
    kernels = tmp_path / "kernels"
    environment = {**os.environ, "LEARNABLE_SPARSITY_KERNEL_CACHE": str(kernels)}
    done = subprocess.run(
        [venv / "bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", CORE_TESTS],
        cwd=suite,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{CORE_TESTS} on Python {version}:\n{output[-4000:]}"
    assert re.search(r"\b\d+ passed\b", output), output[-2000:]
    if shutil.which(os.environ.get("CXX", "g++")):
        assert list(kernels.glob("fused_cpu-*.so")), "the fused kernels were not compiled"
