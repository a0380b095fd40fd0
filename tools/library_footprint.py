"""What the light install costs beside ``entmax``: distributions, disk, import time.

Two fresh environments of this Python, each with one library and the same torch (this
environment's release, so that torch's own size does not differ between them): ``entmax``
(``--entmax``, default 1.3) and this project's wheel (built here, no extras). For each:

* the distributions installed, and those beyond torch and what torch requires;
* the size on disk of the library's own files (its ``RECORD``) and of the whole site-packages;
* import time, in fresh processes: ``import <module>`` from nothing (torch included) and after
  ``import torch`` (the library's own share), in ``--rounds`` interleaved rounds
  (``learnable_sparsity.timing``: a new seeded order each round, ratios to entmax within each
  round, median, quartiles, spread).

    python tools/library_footprint.py   # the table; the JSON into reports/measurements/

Installs use this machine's pip configuration (its mirrors and wheels); torch is constrained to
the running release, from PyTorch's CPU index where that release is a CPU build.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from learnable_sparsity.files import atomic_write_text
from learnable_sparsity.timing import interleaved_rounds, machine

ROOT = Path(__file__).resolve().parents[1]
# Committed: docs/library.md quotes it.
RESULTS = ROOT / "reports/measurements/library_footprint/footprint.json"
# The module each library's users import first.
MODULES = {"entmax": "entmax", "learnable-sparsity": "learnable_sparsity.core.normalizers"}
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Prints the seconds an import takes in a fresh process (after torch's, for "after torch").
_TIMER = (
    "import time{torch}; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
)


def _run(command: list[str | Path], cwd: Path | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, command))} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def _wheel(destination: Path) -> Path:
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", destination, ROOT])
    return next(destination.glob("learnable_sparsity-*.whl"))


def _environment(folder: Path, requirement: str, torch_version: str) -> Path:
    """A new environment with ``requirement`` and exactly this torch release; its python."""
    _run([sys.executable, "-m", "venv", folder])
    pip = [folder / "bin/pip", "install", "-q", "--disable-pip-version-check"]
    if "+cpu" in torch_version:
        pip += ["--extra-index-url", CPU_INDEX]
    _run([*pip, requirement, f"torch=={torch_version}"])
    return folder / "bin/python"


def _site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(_run([python, "-c", code]).strip())


def _footprint(python: Path, distribution: str) -> dict[str, object]:
    """Distributions, those beyond torch's closure, and sizes in bytes (``footprint_probe.py``)."""
    found = json.loads(_run([python, Path(__file__).with_name("footprint_probe.py"), distribution]))
    site = _site_packages(python)
    found["site_packages_bytes"] = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    return found


def _import_seconds(python: Path, module: str, after_torch: bool) -> Callable[[], float]:
    code = _TIMER.format(torch="; import torch" if after_torch else "", module=module)
    return lambda: float(_run([python, "-c", code], cwd=Path(tempfile.gettempdir())).strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entmax", default="1.3", help="entmax release to compare with")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if args.rounds < 1:  # before minutes of installs
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    torch_version = metadata.version("torch")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        requirements = {
            "entmax": f"entmax=={args.entmax}",
            "learnable-sparsity": str(_wheel(work / "wheel")),
        }
        pythons, footprints = {}, {}
        for name, requirement in requirements.items():
            print(f"installing {name} (torch {torch_version}) ...", flush=True)
            pythons[name] = _environment(work / name, requirement, torch_version)
            footprints[name] = _footprint(pythons[name], name)
        measures = {
            name: {
                "import": _import_seconds(python, MODULES[name], after_torch=False),
                "import_after_torch": _import_seconds(python, MODULES[name], after_torch=True),
            }
            for name, python in pythons.items()
        }
        rounds = interleaved_rounds(
            measures,
            "entmax",
            rounds=args.rounds,
            on_round=lambda i: print(f"round {i + 1}/{args.rounds}", flush=True),
        )
    rows = []
    for name, footprint in footprints.items():
        rows.append(
            {
                "library": name,
                "module": MODULES[name],
                "torch": torch_version,
                **footprint,
                "distributions_count": len(footprint["distributions"]),
                **{
                    f"{quantity}_seconds_median": rounds.median_sample(name, quantity, float)
                    for quantity in ("import", "import_after_torch")
                },
                "ratio_to_entmax": {q: s.to_dict() for q, s in rounds.summary[name].items()},
            }
        )
    print(f"\n{'library':20} {'dists':>5} {'beyond torch':>13} {'own kB':>8} {'site MB':>8} "
          f"{'import s':>9} {'after torch ms':>15}")  # fmt: skip
    for row in rows:
        print(
            f"{row['library']:20} {row['distributions_count']:>5} {len(row['beyond_torch']):>13} "
            f"{row['own_bytes'] / 1e3:>8.0f} {row['site_packages_bytes'] / 1e6:>8.0f} "
            f"{row['import_seconds_median']:>9.2f} "
            f"{1e3 * row['import_after_torch_seconds_median']:>15.1f}"
        )
    atomic_write_text(RESULTS, json.dumps({**machine(), "results": rows}, indent=2))


if __name__ == "__main__":
    main()
