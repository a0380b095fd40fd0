"""Mutation testing of what decides a claim's verdict: how many mutants its tests kill.

mutmut (``MUTMUT``) changes the code one small edit at a time (an operator, a constant, a
comparison, an argument dropped) and runs the tests on each mutant: a mutant the tests pass on
"survived", an edit they cannot tell from the code. What it mutates and which tests it runs are
``[tool.mutmut]`` of pyproject.toml: every module that decides a verdict (the checks modules,
``preregistered.py``, ``report.py`` and ``catalog.py`` of ``learnable_sparsity/claims``,
``learnable_sparsity/analysis/alpha.py``, ``learnable_sparsity/timing.py``; claims.yaml's values
are held by tests/claims/test_threshold_edges.py, not mutated), ``tests/claims`` with the tests
of alpha.py and timing.py (less the gates' slow simulations, see there). mutmut is no
dependency of the project: it runs from its own environment ``.mutmut/`` (made on first use,
outside the lock), which reads the project's distributions from this one (a .pth file) and pins
the distributions both need (pytest, ...) to this one's versions. One worker (``--workers``),
from scratch (``mutants/``, mutmut's copy of the code and its results, is made anew).

    make mutation      # or: .venv/bin/python tools/mutation.py [--workers N] [--out FILE]

writes reports/measurements/claims_mutation/counts.json: per file the mutants, killed, survived,
timeouts, any other outcome and the survivors' names (``.mutmut/bin/mutmut show NAME`` prints a
survivor's edit), with the tool, its version, the commit and whether the tree had changes.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from collections import Counter
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT = "3.8.1"
TOOL_ENV = ROOT / ".mutmut"
MUTANTS = ROOT / "mutants"
RESULTS = ROOT / "reports/measurements/claims_mutation/counts.json"
# mutmut's outcome of each exit code of a mutant's test run (mutmut.stats.status_by_exit_code;
# codes it does not list are "suspicious"), as JSON: keys are strings, "None" is "not checked".
_OUTCOMES = (
    "import json; from mutmut.stats import status_by_exit_code as s; "
    "print(json.dumps({str(code): outcome for code, outcome in s.items()}))"
)
COUNTED = ("killed", "survived", "timeout")


def _run(command: list[str | Path]) -> str:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, command))} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def _tool_environment() -> Path:
    """``TOOL_ENV`` with mutmut ``MUTMUT`` (made anew when it holds another release), reading
    the project's distributions from this environment; the environment's python."""
    python = TOOL_ENV / "bin/python"
    marker = TOOL_ENV / f".installed-mutmut-{MUTMUT}"
    if marker.exists():
        return python
    print(f"installing mutmut {MUTMUT} in {TOOL_ENV} ...", flush=True)
    _run([sys.executable, "-m", "venv", "--clear", TOOL_ENV])
    pins = sorted(
        f"{dist.metadata['Name']}=={dist.version}"
        for dist in metadata.distributions()
        if dist.metadata["Name"] != "learnable-sparsity"
    )
    with tempfile.TemporaryDirectory() as scratch:
        constraints = Path(scratch) / "constraints.txt"
        constraints.write_text("\n".join(pins) + "\n")
        pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run([*pip, f"mutmut=={MUTMUT}", "-c", constraints])
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    Path(site.strip(), "learnable_sparsity_project.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    marker.touch()
    return python


def summarize(mutants: Path, outcomes: dict[str, str]) -> dict[str, dict[str, object]]:
    """Per mutated file (its path in the repository), from mutmut's results under ``mutants``
    (``<path>.meta``: each mutant's exit code): the number of mutants, of each of
    :data:`COUNTED`'s outcomes, of any ``other`` outcome, and the survivors' names."""
    files: dict[str, dict[str, object]] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        outcome = {name: outcomes.get(str(code), "suspicious") for name, code in codes.items()}
        counts = Counter(outcome.values())
        files[meta.relative_to(mutants).as_posix().removesuffix(".meta")] = {
            "mutants": len(codes),
            **{name: counts.pop(name, 0) for name in COUNTED},
            "other": dict(sorted(counts.items())),
            "survivors": sorted(name for name, found in outcome.items() if found == "survived"),
        }
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1, help="mutants tested at once")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    python = _tool_environment()
    outcomes = json.loads(_run([python, "-c", _OUTCOMES]))
    shutil.rmtree(MUTANTS, ignore_errors=True)  # mutmut would reuse the results it kept there
    start = time.perf_counter()
    subprocess.run(
        [python, "-m", "mutmut", "run", "--max-children", str(args.workers)], cwd=ROOT, check=True
    )
    seconds = time.perf_counter() - start
    files = summarize(MUTANTS, outcomes)
    if not files:
        raise SystemExit(f"mutmut left no results in {MUTANTS}")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    total = {key: sum(f[key] for f in files.values()) for key in ("mutants", *COUNTED)}
    out = args.out.resolve()
    own = out.relative_to(ROOT).as_posix() if out.is_relative_to(ROOT) else None
    changed = [line[3:] for line in _run(["git", "status", "--porcelain"]).splitlines()]
    record = {
        "tool": "mutmut",
        "version": MUTMUT,
        "commit": _run(["git", "rev-parse", "HEAD"]).strip(),
        "uncommitted_changes": any(path != own for path in changed),  # its own output aside
        "mutated": config["only_mutate"],
        "tests": config["pytest_add_cli_args_test_selection"],
        "workers": args.workers,
        "wall_seconds": round(seconds, 1),
        "python": platform.python_version(),
        "total": total,
        "files": files,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"\n{'file':45} {'mutants':>8} {'killed':>7} {'survived':>9} {'timeout':>8}")
    for path, row in files.items():
        print(
            f"{path:45} {row['mutants']:>8} {row['killed']:>7} {row['survived']:>9} "
            f"{row['timeout']:>8}"
        )
    print(f"wrote {args.out} ({seconds / 60:.1f} min)")


if __name__ == "__main__":
    main()
