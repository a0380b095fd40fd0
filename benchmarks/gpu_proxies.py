"""CPU proxies of the GPU path's cost, before and after (issue 37): one command, in CI.

    python benchmarks/gpu_proxies.py [--baseline REV] [--quick] [--sections NAME ...] [--out FILE]

Every section script ``benchmarks/gpu/proxy_<name>.py`` runs twice as a subprocess, each time
printing one JSON object on stdout: once with ``PYTHONPATH`` at the working tree ("after") and
once at an export of the baseline's ``learnable_sparsity`` (``git archive REV learnable_sparsity``
into a temporary folder: "before"; the section scripts themselves are the working tree's, so both
sides are measured the same way). The output, written atomically:

    {"baseline": REV, "commit": HEAD (+ "-dirty"), "quick": ..., "environment": {...},
     "sections": {name: {"before": {...}, "after": {...}}}}

Default FILE: results/benchmarks/gpu_proxies.json. A section that fails records
``{"error": "<its stderr's tail>"}`` on that side; the command exits non-zero after writing the
rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The last code before the GPU-path work of issue 37.
DEFAULT_BASELINE = "c90cde1"
OUT = ROOT / "results" / "benchmarks" / "gpu_proxies.json"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def _export(rev: str, into: Path) -> None:
    """The baseline's ``learnable_sparsity`` under ``into``."""
    archive = subprocess.run(
        ["git", "archive", rev, "learnable_sparsity"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def _run(script: Path, package_root: Path, quick: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(package_root), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, str(script), *(["--quick"] if quick else [])]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        return {"error": result.stderr[-3000:] or f"exit status {result.returncode}"}
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"no JSON object on stdout: {result.stdout[-500:]!r}"}


def _environment() -> dict[str, str]:
    versions = {"python": platform.python_version(), "machine": platform.machine()}
    for name in ("torch", "triton"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = "not installed"
    return versions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="the 'before' revision")
    parser.add_argument("--quick", action="store_true", help="passed on to every section")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--sections", nargs="*", help="only these section names")
    args = parser.parse_args()
    scripts = sorted((ROOT / "benchmarks" / "gpu").glob("proxy_*.py"))
    if args.sections:
        known = {s.stem.removeprefix("proxy_") for s in scripts}
        unknown = sorted(set(args.sections) - known)
        if unknown:
            parser.error(f"--sections {unknown}: no such section (known: {sorted(known)})")
        scripts = [s for s in scripts if s.stem.removeprefix("proxy_") in args.sections]
    baseline = _git("rev-parse", "--short", args.baseline)
    dirty = "-dirty" if _git("status", "--porcelain", "--untracked-files=no") else ""
    sections: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-proxies-") as before_root:
        _export(baseline, Path(before_root))
        for script in scripts:
            name = script.stem.removeprefix("proxy_")
            print(f"[gpu_proxies] {name} ...", file=sys.stderr, flush=True)
            sections[name] = {
                "before": _run(script, Path(before_root), args.quick),
                "after": _run(script, ROOT, args.quick),
            }
    result = {
        "baseline": baseline,
        "commit": _git("rev-parse", "--short", "HEAD") + dirty,
        "quick": args.quick,
        "environment": _environment(),
        "sections": sections,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=args.out.parent, delete=False, suffix=".tmp") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(f.name, args.out)
    failed = [f"{n}/{side}" for n, s in sections.items() for side in s if "error" in s[side]]
    print(f"[gpu_proxies] wrote {args.out}; failed: {failed or 'none'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
