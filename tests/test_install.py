"""The install as researchers get it: the project resolved by a plain pip on PyPI, and the locks
`make` installs from.

* Resolution: with this machine's pip configuration bypassed (``--isolated``, no config file, no
  ``PIP_*`` variables: no local wheels, mirrors or constraints), pip resolves the light install
  (``learnable-sparsity``: torch and nothing of the pipeline) and ``.[dev]`` (everything) on
  PyPI, in a dry run, for CI's Python and for the newest other supported Python found. PyPI's
  Linux torch is its CUDA build, which pins its own Triton: a ``triton`` pin of ours that
  disagrees makes ``.[dev]`` unresolvable, which is what a user's pip met before these tests.
* Locks: ``requirements/cuda.txt`` pins every distribution with its hashes; ``cpu.txt`` is the
  same without torch and what only its CUDA build needs; ``torch-cpu.txt`` pins the same torch
  release's CPU build; and ``make lock`` on a copy of the project makes exactly the committed
  files (a changed ``pyproject.toml`` without a refreshed lock fails here).

The tests that ask PyPI are skipped, with the reason, where it cannot be reached.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.installs import ROOT, RUNNING, library_source, newest_other_python
from tests.loopback import serving

REQUIREMENTS = ROOT / "requirements"
LOCK_FILES = ("cuda.txt", "cpu.txt", "torch-cpu.txt", "cpu-overrides.txt")
# What the light install must not bring: the pipeline's stack.
PIPELINE_ONLY = {
    "ray", "mlflow", "dvc", "transformers", "sacrebleu", "sentencepiece", "scipy",
    "scikit-learn", "matplotlib", "h5py", "diptest", "hydra-core", "pyarrow",
}  # fmt: skip
# What .[dev] must bring (the pipeline, the tests' oracles and tools).
DEV_NEEDS = {"torch", "ray", "mlflow", "dvc", "transformers", "sacrebleu", "entmax", "pytest"}
# A pin, and a hash line of a pin, as uv writes them.
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)
_BLOCK = re.compile(r"^(?=[A-Za-z0-9])", re.MULTILINE)


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
    except OSError:
        return False
    return True


needs_pypi = pytest.mark.skipif(not _pypi_reachable(), reason="PyPI (pypi.org:443) is unreachable")


def _plain_environment() -> dict[str, str]:
    """The environment of a pip that knows only PyPI: none of this machine's ``PIP_*`` settings
    and no configuration file."""
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return plain | {"PIP_CONFIG_FILE": os.devnull}


def _resolve(python: str, requirement: str, workdir: Path) -> dict[str, str]:
    """Distribution name → version that a plain pip of ``python`` would install for
    ``requirement`` into an empty environment (``pip install --dry-run --report``)."""
    venv = workdir / "venv"
    subprocess.run([python, "-m", "venv", venv], check=True, timeout=300)
    report = workdir / "report.json"
    command = [
        venv / "bin/pip", "--isolated", "--disable-pip-version-check", "install", "--dry-run",
        "--ignore-installed", "--quiet", "--report", report, requirement,
    ]  # fmt: skip
    done = subprocess.run(
        command, env=_plain_environment(), capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, f"a plain pip cannot resolve {requirement}:\n{done.stderr[-3000:]}"
    installs = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


PYTHONS = [(sys.executable, RUNNING)]
if (other := newest_other_python()) is not None:
    PYTHONS.append(other)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, str]]:
    """(Python version, "light" | "dev") → what a plain pip resolves, all resolved at once."""
    source = library_source(tmp_path_factory.mktemp("install") / "source")
    requirements = {"light": str(source), "dev": f"{source}[dev]"}
    jobs = [(python, version, name) for python, version in PYTHONS for name in requirements]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {
            (version, name): pool.submit(
                _resolve, python, requirements[name], tmp_path_factory.mktemp(f"{version}-{name}")
            )
            for python, version, name in jobs
        }
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.slow
@needs_pypi
@pytest.mark.parametrize("version", [v for _, v in PYTHONS])
def test_a_plain_pip_resolves_the_light_install_and_dev_on_pypi(
    version: str, resolved: dict[tuple[str, str], dict[str, str]]
) -> None:
    light, dev = resolved[version, "light"], resolved[version, "dev"]
    assert "learnable-sparsity" in light and "torch" in light
    assert not PIPELINE_ONLY & light.keys(), f"Python {version}: the light install pulls {light}"
    assert dev.keys() >= DEV_NEEDS, f"Python {version}: .[dev] lacks {DEV_NEEDS - dev.keys()}"
    if sys.platform == "linux":
        assert "triton" in dev  # the interpreter tests' Triton: the one PyPI's torch requires


def _pins(text: str) -> dict[str, str]:
    return {canonicalize_name(name): version for name, version in _PIN.findall(text)}


def _lock(name: str) -> str:
    return (REQUIREMENTS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["cuda.txt", "cpu.txt"])
def test_a_lock_pins_every_distribution_with_its_hashes(name: str) -> None:
    blocks = [b for b in _BLOCK.split(_lock(name)) if _PIN.match(b)]
    assert len(blocks) > 150, f"{name} pins {len(blocks)} distributions"
    unhashed = [b.split()[0] for b in blocks if "--hash=sha256:" not in b]
    assert not unhashed, f"{name} pins {unhashed} without hashes"


def test_the_cpu_lock_is_the_cuda_lock_without_torch_and_its_cuda_libraries() -> None:
    cuda, cpu = _pins(_lock("cuda.txt")), _pins(_lock("cpu.txt"))
    assert cpu.keys() <= cuda.keys()
    assert {name: cuda[name] for name in cpu} == cpu, "the two locks disagree on a version"
    dropped = cuda.keys() - cpu.keys()
    assert "torch" in dropped
    assert all(name.startswith(("nvidia-", "cuda-")) for name in dropped - {"torch"}), dropped
    overrides = [line for line in _lock("cpu-overrides.txt").splitlines() if line[:1].isalnum()]
    overridden = {canonicalize_name(line.split(";")[0].strip()) for line in overrides}
    assert overridden <= dropped
    assert "nvidia-ml-py" in cpu  # ours (MLflow's GPU metrics), not torch's


def test_the_cpu_build_of_torch_is_the_release_the_cuda_lock_pins() -> None:
    torch_cpu = _pins(_lock("torch-cpu.txt"))
    assert torch_cpu == {"torch": f"{_pins(_lock('cuda.txt'))['torch']}+cpu"}
    assert "--index-url https://download.pytorch.org/whl/cpu" in _lock("torch-cpu.txt")


@pytest.mark.slow
@needs_pypi
def test_make_lock_makes_the_committed_locks(tmp_path: Path) -> None:
    """`make lock` (uv on PyPI) on a copy of the project rewrites the locks byte for byte: the
    committed locks are those of today's pyproject.toml."""
    project = tmp_path / "project"
    (project / "requirements").mkdir(parents=True)
    for name in ("pyproject.toml", "Makefile"):
        shutil.copy2(ROOT / name, project / name)
    for name in LOCK_FILES:
        shutil.copy2(REQUIREMENTS / name, project / "requirements" / name)
    done = subprocess.run(
        ["make", "-C", project, "lock", f"PYTHON={sys.executable}"],
        env=_plain_environment() | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for name in LOCK_FILES:
        made = (project / "requirements" / name).read_text(encoding="utf-8")
        assert made == _lock(name), f"make lock changes requirements/{name}: run make lock"


def _hashes(name: str) -> set[str]:
    return set(re.findall(r"--hash=sha256:([0-9a-f]{64})", _lock(name)))


def _local_cpu_wheels() -> list[Path]:
    """torch's CPU wheels of the pinned release in the folders pip's configuration links to
    (``find-links``: where this machine keeps the wheel it installs)."""
    release = _pins(_lock("torch-cpu.txt"))["torch"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    folders = re.findall(r"find-links='([^']+)'", done.stdout)
    return sorted(
        wheel
        for folder in folders
        for wheel in Path(folder).glob(f"torch-{release}-*.whl")
        if Path(folder).is_dir()
    )


def test_the_cpu_build_of_torch_is_pinned_by_hash_for_every_supported_linux_python() -> None:
    """One published digest per supported Python (3.11-3.13) and Linux platform (x86_64,
    aarch64); every CPU wheel of the release found on this machine is one of them."""
    assert len(_hashes("torch-cpu.txt")) == 6
    wheels = _local_cpu_wheels()
    if not wheels:
        pytest.skip("no torch CPU wheel of the pinned release in pip's find-links here")
    for wheel in wheels:
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() in _hashes("torch-cpu.txt"), wheel


def _project_copy(tmp_path: Path, cpu_index: str | None = None) -> Path:
    project = tmp_path / "project"
    (project / "requirements").mkdir(parents=True)
    shutil.copy2(ROOT / "Makefile", project / "Makefile")
    shutil.copy2(ROOT / "pyproject.toml", project / "pyproject.toml")
    for name in LOCK_FILES:
        shutil.copy2(REQUIREMENTS / name, project / "requirements" / name)
    if cpu_index is not None:
        pins = project / "requirements" / "torch-cpu.txt"
        text = pins.read_text(encoding="utf-8")
        pins.write_text(text.replace("https://download.pytorch.org/whl/cpu", cpu_index))
    return project


def _make(project: Path, *arguments: str) -> subprocess.CompletedProcess:
    environment = _plain_environment() | {"PATH": os.environ["PATH"]}
    return subprocess.run(
        ["make", "-C", project, *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_stops_in_seconds_with_the_fix_where_the_cpu_index_lacks_torch(
    tmp_path: Path,
) -> None:
    """A pip that knows only PyPI and an index without torch's CPU build (a loopback one):
    the environment step stops before any other download, naming the command to run instead."""
    with serving() as index:
        index.files["/simple/"] = b"<html><body></body></html>"
        project = _project_copy(tmp_path, index.url("/simple"))
        start = time.monotonic()
        done = _make(project, ".venv/.locked-cpu", f"PYTHON={sys.executable}", "TORCH=cpu")
        elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert "make: could not install torch==2.13.0+cpu from PyTorch's CPU index" in done.stderr
    assert "make .venv/.locked-cpu TORCH=cuda" in done.stderr
    assert "torch's cpu build: TORCH=cpu given" in done.stdout
    assert not list((project / ".venv").glob("lib/python*/site-packages/numpy")), "went on"
    assert elapsed < 90, elapsed
    assert any(path.startswith("/simple/torch") for path, _ in index.requests)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["TORCH=gpu"], 'TORCH must be cpu or cuda, got "gpu"'),
        (
            [".venv/.locked-cpu", "PYTHON=python3.9-missing"],
            "make: python3.9-missing is missing or not Python 3.11-3.13",
        ),
    ],
)
def test_make_refuses_a_bad_torch_or_python_naming_the_fix(
    tmp_path: Path, arguments: list[str], message: str
) -> None:
    done = _make(_project_copy(tmp_path), *arguments)
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert not (tmp_path / "project" / ".venv").exists()
