"""The library as ``pip install learnable-sparsity`` gives it, installed from the wheel (not the
source tree) on the newest other supported Python found (else on this one):

* it brings torch and nothing of the pipeline: no Ray, MLflow, DVC, transformers (or any other
  distribution of the pipeline extra), and site-packages gains ``learnable_sparsity`` alone (no
  top-level ``components`` or ``pipelines``);
* the core's oracle tests (``tests/core/test_normalizers.py``: every normalizer against the
  ``entmax`` package, brute force and gradcheck, on the fused C++ kernels, compiled at first use
  under that Python, and on the eager solvers) pass against the installed copy;
* every Python example of ``docs/library.md`` runs against it, the Hugging Face one once the
  ``hf`` extra has added transformers.

The environment is kept under ``~/.cache/learnable-sparsity/venvs``, one per Python and
``pyproject.toml``: pip takes the newest torch the project admits (on Linux PyPI's CUDA build,
about 6 GB installed and five minutes on 2 cores) with the tests' oracle and pytest. A changed
``pyproject.toml`` installs everything anew; otherwise only the wheel is reinstalled. The Triton
interpreter tests stay in CI's environment: they take minutes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.installs import ROOT, RUNNING, library_source, newest_other_python
from tests.test_install import PIPELINE_ONLY

PYPROJECT = ROOT / "pyproject.toml"
VENVS = Path.home() / ".cache/learnable-sparsity/venvs"
CORE_TESTS = "tests/core/test_normalizers.py"
LIBRARY_DOC = ROOT / "docs/library.md"
# What the tests need beside the library (the oracle and the runner), at the locks' versions.
TEST_TOOLS = ("entmax==1.3", "pytest>=9.2,<10")
PYTHON, VERSION = newest_other_python() or (sys.executable, RUNNING)


def _run(command: list[str | Path], timeout: int, cwd: Path | None = None) -> str:
    """Run ``command``; its output, or a failure that shows its end."""
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{output[-4000:]}"
    return output


def _wheel(destination: Path) -> Path:
    """The project's wheel, built from a copy of its source."""
    project = library_source(destination / "project")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", destination, project], 600)
    (wheel,) = destination.glob("learnable_sparsity-*.whl")
    return wheel


def _environment(wheel: Path) -> Path:
    """The kept environment of ``PYTHON`` for this ``pyproject.toml``, with ``wheel`` installed
    (and, where the environment is new, what it requires and the test tools)."""
    key = hashlib.sha256(PYPROJECT.read_bytes() + VERSION.encode()).hexdigest()[:16]
    venv = VENVS / f"py{VERSION}-{key}"
    if (venv / "installed").exists():
        _run([venv / "bin/pip", "install", "-q", "--no-deps", "--force-reinstall", wheel], 600)
        return venv
    for stale in VENVS.glob(f"py{VERSION}-*"):  # an older pyproject.toml's, or a failed install
        shutil.rmtree(stale)
    _run([PYTHON, "-m", "venv", venv], 300)
    _run([venv / "bin/pip", "install", "-q", wheel, *TEST_TOOLS], 1800)
    _run([venv / "bin/pip", "check"], 300)
    (venv / "installed").touch()
    return venv


def _installed(venv: Path) -> dict[str, str]:
    listed = _run([venv / "bin/pip", "list", "--format", "json"], 120)
    return {canonicalize_name(d["name"]): d["version"] for d in json.loads(listed)}


def _examples(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL)


@dataclass(frozen=True)
class Library:
    """The kept environment with the wheel installed, the wheel, and a folder outside the
    source tree to run from."""

    venv: Path
    wheel: Path
    outside: Path


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Library:
    wheel = _wheel(tmp_path_factory.mktemp("wheel"))
    return Library(_environment(wheel), wheel, tmp_path_factory.mktemp("outside"))


@contextmanager
def _with_extra(library: Library, extra: str) -> Iterator[None]:
    """The wheel's ``extra`` installed for the block, and what it added removed after it (the
    kept environment stays the light install)."""
    before = _installed(library.venv).keys()
    _run([library.venv / "bin/pip", "install", "-q", f"{library.wheel}[{extra}]"], 1800)
    try:
        yield
    finally:
        added = sorted(_installed(library.venv).keys() - before)
        if added:
            _run([library.venv / "bin/pip", "uninstall", "-q", "-y", *added], 600)


@pytest.mark.slow
def test_the_light_install_brings_torch_and_nothing_of_the_pipeline(library: Library) -> None:
    venv, outside = library.venv, library.outside
    installed = _installed(venv)
    assert "torch" in installed and "learnable-sparsity" in installed
    pulled = installed.keys() - {"torch", "learnable-sparsity", "entmax", "pytest"}
    assert not pulled & PIPELINE_ONLY, sorted(pulled & PIPELINE_ONLY)
    where = _run([venv / "bin/python", "-c", "import learnable_sparsity as m; print(m.__file__)"],
                 60, outside)  # fmt: skip
    site = Path(where.strip()).parents[1]
    assert site.is_relative_to(venv), where
    assert not {"components", "pipelines"} & {p.name for p in site.iterdir()}
    record = next(site.glob("learnable_sparsity-*.dist-info")) / "RECORD"
    tops = {line.split("/")[0] for line in record.read_text().splitlines()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"learnable_sparsity"}


@pytest.mark.slow
def test_the_core_passes_its_oracle_tests_installed(library: Library, tmp_path: Path) -> None:
    venv = library.venv
    suite = tmp_path / "suite"  # the tests alone: learnable_sparsity comes from the wheel
    shutil.copytree(ROOT / "tests", suite / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(PYPROJECT, suite)  # pytest's settings (markers)
    kernels = tmp_path / "kernels"
    done = subprocess.run(
        [venv / "bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", CORE_TESTS],
        cwd=suite,
        env={**os.environ, "LEARNABLE_SPARSITY_KERNEL_CACHE": str(kernels)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{CORE_TESTS} on Python {VERSION}:\n{output[-4000:]}"
    assert re.search(r"\b\d+ passed\b", output), output[-2000:]
    if shutil.which(os.environ.get("CXX", "g++")):
        assert list(kernels.glob("fused_cpu-*.so")), "the fused kernels were not compiled"


@pytest.mark.slow
def test_the_library_examples_run_against_the_installed_wheel(library: Library) -> None:
    examples = _examples(LIBRARY_DOC)
    light = [e for e in examples if "transformers" not in e]
    assert light and len(light) < len(examples), "docs/library.md lost its examples"

    def run(number: int, example: str) -> None:
        script = library.outside / f"example_{number}.py"
        script.write_text(example, encoding="utf-8")
        _run([library.venv / "bin/python", script], 600, library.outside)

    for number, example in enumerate(examples):
        if example in light:
            run(number, example)
    with _with_extra(library, "hf"):
        for number, example in enumerate(examples):
            if example not in light:
                run(number, example)
