"""Do pinned CPU kernels give the same bytes whatever the instruction set, and what do they cost?

    python tools/kernel_settings.py [--profile ci] [--targets ...] [--settings ...] [--rounds 2]

torch (``ATEN_CPU_CAPABILITY``), MKL (``MKL_CBWR``, ``MKL_ENABLE_INSTRUCTIONS``) and oneDNN
(``ONEDNN_MAX_CPU_ISA``) pick their kernels by the CPU's instruction set unless told which to use;
telling them a smaller set than the CPU has is how one machine runs the kernels another machine
would pick. Each run here is a fresh copy of the committed checkout on ``--profile`` (a git
repository, as the end-to-end test makes one; the data stages' outputs copied in from one
preparatory run) whose ``dvc repro --no-run-cache <targets>`` runs under one setting of
:data:`SETTINGS`; ``--rounds`` more runs of ``native`` and ``portable``, interleaved, time the
pinned kernels against the native ones. The targets leave out the stages that measure wall time
(``speed``, ``benchmark_normalizers``), whose outputs differ on every run.

Writes ``reports/measurements/kernel_settings/<profile>.json``: the commit, the CPU, per run the
setting, its wall seconds and the SHA-256 of every file under ``results/`` and ``reports/`` and of
``dvc.lock`` (which holds the digests of the models); the settings whose outputs are identical
byte for byte, grouped; and per round the ratio of ``portable``'s seconds to ``native``'s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from learnable_sparsity.files import atomic_write_text, sha256_of

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "reports" / "measurements" / "kernel_settings"
# make repro's pins (Makefile, PORTABLE_KERNELS). A cap is a maximum: an AVX2 machine capped at
# SSE4.1 runs the SSE4.1 kernels this CPU runs under the same cap, so the pins override the
# emulation.
PORTABLE = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
}
# What another x86 machine's kernels look like from here: an AVX2 machine's torch, MKL and oneDNN
# code paths, then each library alone; the pinned setting of docs/pipeline.md under both.
AVX2_MACHINE = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
SETTINGS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2_machine": AVX2_MACHINE,
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten_default": {"ATEN_CPU_CAPABILITY": "default"},
    "mkl_avx2": {"MKL_CBWR": "AVX2"},
    "onednn_avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "portable": PORTABLE,
    "portable_on_avx2_machine": {**AVX2_MACHINE, **PORTABLE},
}
DATA_STAGES = ("corpora", "bpe", "images")
TARGETS = ("evaluate_nmt", "analyze_heads", "train_lvm", "evaluate_ape")
TIMED = ("native", "portable")
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {cwd}:\n{done.stderr[-4000:]}")


def _environment(repo: Path, kernels: dict[str, str]) -> dict[str, str]:
    """The stages' environment: this Python's tools, the copy's code, a local Ray, MLflow in a
    SQLite file beside the copy, and exactly ``kernels`` of the kernel variables."""
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_ENV}
    return {
        **env,
        **kernels,
        "MLFLOW_TRACKING_URI": f"sqlite:///{repo.parent / 'mlflow.db'}",
        "PYTHONPATH": str(repo),
        "RAY_ADDRESS": "",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    }


def prepare(work: Path, profile: str) -> Path:
    """The committed checkout cloned into ``work/base`` on ``profile``, its data stages run."""
    base = work / "base" / "repo"
    base.parent.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(base)], check=True)
    env = _environment(base, {})
    _run([sys.executable, "-m", "pipelines.commands.profile", profile], base, env)
    _run(["dvc", "repro", "--no-run-cache", *DATA_STAGES], base, env)
    return base


def outputs(repo: Path) -> dict[str, str]:
    """SHA-256 of every file under ``results/`` and ``reports/`` and of ``dvc.lock``."""
    files = [repo / "dvc.lock", *(repo / "results").rglob("*"), *(repo / "reports").rglob("*")]
    return {
        str(path.relative_to(repo)): sha256_of(path) for path in sorted(files) if path.is_file()
    }


def run_setting(base: Path, work: Path, name: str, targets: list[str]) -> dict[str, object]:
    """``dvc repro`` of ``targets`` in a fresh copy of ``base`` under setting ``name``."""
    repo = work / name / "repo"
    shutil.copytree(base, repo, symlinks=True)
    env = _environment(repo, SETTINGS[name])
    start = time.perf_counter()
    _run(["dvc", "repro", "--no-run-cache", *targets], repo, env)
    seconds = time.perf_counter() - start
    print(f"{name}: {seconds:.0f} s", flush=True)
    record = {"setting": name, "env": SETTINGS[name], "seconds": seconds, "outputs": outputs(repo)}
    shutil.rmtree(repo.parent)
    return record


def identical_groups(runs: list[dict]) -> list[list[str]]:
    """The settings whose outputs are byte-identical, grouped (a setting run twice in one group
    when its runs agree)."""
    groups: dict[str, list[str]] = {}
    for run in runs:
        key = hashlib.sha256(json.dumps(run["outputs"], sort_keys=True).encode()).hexdigest()
        groups.setdefault(key, []).append(run["setting"])
    return sorted(groups.values())


def differing_files(runs: list[dict], first: str, second: str) -> list[str]:
    """The files whose bytes differ between the first runs of settings ``first`` and ``second``."""
    a, b = (next(r["outputs"] for r in runs if r["setting"] == s) for s in (first, second))
    return sorted(path for path in a.keys() | b.keys() if a.get(path) != b.get(path))


def _cpu_model() -> str:
    """The CPU's model name and the vector extensions that decide the kernels."""
    info = Path("/proc/cpuinfo")
    text = info.read_text() if info.exists() else ""
    name = next(
        (
            line.split(":", 1)[1].strip()
            for line in text.splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")),
        [],
    )
    return f"{name} ({', '.join(f for f in ('avx2', 'avx512f', 'amx_tile') if f in flags)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument(
        "--rounds", type=int, default=2, help="interleaved native/portable rounds (0: none)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.rounds < 0:
        parser.error(f"--rounds must be 0 or more, got {args.rounds}")
    out = args.out or RESULTS / f"{args.profile}.json"
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="kernel-settings-") as folder:
        work = Path(folder)
        base = prepare(work, args.profile)
        runs = [run_setting(base, work, name, args.targets) for name in args.settings]
        for _ in range(args.rounds):
            runs += [run_setting(base, work, name, args.targets) for name in TIMED]
    seconds = {name: [r["seconds"] for r in runs if r["setting"] == name] for name in TIMED}
    # The interleaved rounds only (the last of each setting's runs), not a setting's first run
    rounds = {name: times[len(times) - args.rounds :] for name, times in seconds.items()}
    ratios = [p / n for n, p in zip(rounds["native"], rounds["portable"], strict=True)]
    record = {
        "command": " ".join(["python", "tools/kernel_settings.py", *sys.argv[1:]]),
        "commit": commit,
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "profile": args.profile,
        "targets": args.targets,
        "identical": identical_groups(runs),
        "native_vs_avx2_machine": differing_files(runs, "native", "avx2_machine")
        if {"native", "avx2_machine"} <= set(args.settings)
        else None,
        "portable_seconds_over_native": {
            "per_round": ratios,
            "median": statistics.median(ratios),
        }
        if ratios
        else None,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("identical", "portable_seconds_over_native")}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
