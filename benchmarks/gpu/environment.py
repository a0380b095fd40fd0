"""Facts about the machine and the code a GPU run measured, as one JSON object.

Written by step (a) of ``benchmarks/gpu/run.sh``: the date (UTC), Python, torch (and its CUDA,
cuDNN), Triton, NumPy, adasplash, entmax and transformers versions; the GPU (name, memory,
compute capability; driver, clocks and power limit from ``nvidia-smi``); whether
``learnable_sparsity.core.fused_triton`` imports and is available; which ``learnable_sparsity`` was
imported; whether ray, mlflow and dvc are importable (the GPU machine has none, and the benchmarks
must not need them); and which code ran: the git commit (``git rev-parse HEAD`` where git and the
repository are there), else the stamp file ``.whl/COMMIT`` written beforehand on the development
machine (``--stamp``; beside the carried wheels, outside the tree, so that it never makes the
code look changed), plus ``code_digest``: a SHA-256 over the files under
``learnable_sparsity/``, ``tests/core``, ``tests/devices`` and ``benchmarks/gpu`` (paths and
contents), compared with the stamp's digest, so uncommitted work is identified too.

    python benchmarks/gpu/environment.py --out env.json      # on the GPU machine
    python benchmarks/gpu/environment.py --stamp             # here: write .whl/COMMIT
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAMP = ROOT / ".whl" / "COMMIT"
DIGESTED = ("learnable_sparsity", "tests/core", "tests/devices", "benchmarks/gpu")
SUFFIXES = {".py", ".cpp", ".h", ".cu", ".sh", ".yaml", ".toml"}


def code_digest() -> tuple[str, int]:
    """SHA-256 of the sorted (path, contents) of the code files under ``DIGESTED``; file count."""
    digest = hashlib.sha256()
    files = sorted(
        path
        for folder in DIGESTED
        if (ROOT / folder).is_dir()
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
    )
    for path in files:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest(), len(files)


def _run(*command: str) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.rstrip() if done.returncode == 0 else None


def git_facts() -> dict[str, object]:
    """Commit and the changed files' names (``git status --porcelain``), or empty without git."""
    commit = _run("git", "rev-parse", "HEAD")
    if commit is None:
        return {}
    status = _run("git", "status", "--porcelain", "--untracked-files=all") or ""
    return {"commit": commit, "changed_files": status.splitlines()}


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _absent(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ImportError:
        return True


def _gpu_facts() -> dict[str, object]:
    import torch

    facts: dict[str, object] = {
        "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            gpu=props.name,
            gpu_count=torch.cuda.device_count(),
            gpu_memory_bytes=props.total_memory,
            compute_capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
        )
    query = "name,driver_version,memory.total,clocks.max.sm,clocks.sm,power.limit,temperature.gpu"
    smi = _run("nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader")
    facts["nvidia_smi"] = {"query": query, "rows": smi.splitlines() if smi else None}
    if smi:
        facts["driver"] = smi.splitlines()[0].split(",")[1].strip()
    return facts


def _ours_facts() -> dict[str, object]:
    sys.path.insert(0, str(ROOT))
    import learnable_sparsity

    facts: dict[str, object] = {"learnable_sparsity": str(Path(learnable_sparsity.__file__).parent)}
    try:
        from learnable_sparsity.core import fused_triton

        facts["fused_triton_module"] = True
        facts["fused_triton_available"] = bool(fused_triton.available())
    except Exception as error:
        facts["fused_triton_module"] = False
        facts["fused_triton_import_error"] = f"{type(error).__name__}: {error}"
    try:
        from learnable_sparsity.core import fused

        facts["cpu_kernels_available"] = bool(fused.available())
    except Exception as error:
        facts["cpu_kernels_error"] = f"{type(error).__name__}: {error}"
    return facts


def environment(progress: Callable[[dict[str, object]], None] | None = None) -> dict[str, object]:
    """The facts; ``progress(facts)`` gets them as they grow, after each section (the GPU's
    facts need CUDA initialised, ours may build the C++ kernels: seconds each)."""
    digest, count = code_digest()
    stamp = json.loads(STAMP.read_text()) if STAMP.is_file() else None
    facts: dict[str, object] = {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cxx": shutil.which(os.environ.get("CXX", "g++")),
        "versions": {
            name: _version(name)
            for name in (
                "torch",
                "triton",
                "numpy",
                "scipy",
                "adasplash",
                "entmax",
                "transformers",
                "pytest",
            )
        },
        "absent_as_required": {name: _absent(name) for name in ("ray", "mlflow", "dvc")},
        "git": git_facts(),
        "stamp": stamp,
        "code_digest": digest,
        "code_digest_files": count,
        "code_digest_matches_stamp": None if stamp is None else stamp.get("code_digest") == digest,
    }
    git = facts["git"]
    facts["commit"] = (git or {}).get("commit") or (stamp or {}).get("commit")  # type: ignore[union-attr]
    for section in (_gpu_facts, _ours_facts):
        if progress is not None:
            progress(facts)
        facts.update(section())
    return facts


def write_stamp() -> None:
    """Write ``.whl/COMMIT`` (commit, changed files, code digest) for the GPU copy."""
    digest, count = code_digest()
    stamp = {
        **git_facts(),
        "code_digest": digest,
        "code_digest_files": count,
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    STAMP.parent.mkdir(exist_ok=True)
    STAMP.write_text(json.dumps(stamp, indent=2) + "\n")
    print(f"wrote {STAMP}: commit {stamp.get('commit')}, digest {digest[:16]} of {count} files")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where to write the JSON (default: stdout)")
    parser.add_argument("--stamp", action="store_true", help=f"write {STAMP.relative_to(ROOT)}")
    args = parser.parse_args()
    if args.stamp:
        write_stamp()
        return
    if args.out is None:
        print(json.dumps(environment(), indent=2, default=str))
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write(facts: dict[str, object]) -> None:  # after every section: a cut keeps the rest
        args.out.write_text(json.dumps(facts, indent=2, default=str) + "\n")

    facts = environment(write)
    write(facts)
    print(json.dumps(facts, indent=2, default=str), flush=True)


if __name__ == "__main__":
    main()
