"""What the tests that install the project share: the supported Pythons found on this machine, and
the library's source copied out of the checkout (pip builds a directory in place)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
REQUIRES_PYTHON = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
RUNNING = f"{sys.version_info.major}.{sys.version_info.minor}"


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


def newest_other_python() -> tuple[str, str] | None:
    """(path, version) of the newest Python on the machine that ``requires-python`` admits, other
    than the one running the tests: ``python3.X`` on PATH, then pyenv's versions."""
    newest_first = (f"3.{minor}" for minor in range(30, 7, -1))
    wanted = [v for v in newest_first if v in SpecifierSet(REQUIRES_PYTHON)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for version in (v for v in wanted if v != RUNNING):
        found = [shutil.which(f"python{version}")]
        found += sorted(map(str, pyenv.glob(f"{version}.*/bin/python{version}")), reverse=True)
        for python in filter(None, found):
            if _version(python) == version:
                return python, version
    return None


def library_source(destination: Path) -> Path:
    """What building the distribution reads, copied to ``destination``: a build there leaves
    the checkout clean."""
    destination.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, destination / name)
    shutil.copytree(
        ROOT / "learnable_sparsity",
        destination / "learnable_sparsity",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return destination
