"""Keep the current run as an evidence record: ``python -m pipelines.commands.record <name>``.

A record is a run too long for ``make repro`` (the ``evidence`` profile's, say) kept in git under
``reports/<name>/``, so that a reader sees what it showed without rerunning it:

* ``results.json`` — the results the claims read (the claims stage's
  ``results/claims/results.json``);
* ``record.json`` — the profile, when it was kept, the commit of the code that kept it (and
  whether ``learnable_sparsity/`` or ``pipelines/`` had uncommitted changes), the environment's
  lock and digest (and whether the environment matched it:
  :mod:`pipelines.scaffold.tracking.lock`), and every claim threshold it was judged with;
* ``index.md``, ``tables.md``, ``tables/``, ``figures/`` — the report of the run, with every link
  relative and resolving inside the record (figures re-encoded as small PNGs, so that git holds
  them); its claims section points to ``claims.md``.

``python -m pipelines.commands.record <name> --from-gpu <dir>`` keeps instead the output of the
prepared device run of an NMT grid (``pipelines/commands/ast_grid.py``: ``grid.json`` and
``grid.tar.gz``, docs/gpu-records.md): ``results.json`` gathered from its cells by the claims
stage's own loaders, ``record.json`` with the device, environment, commit, the length (rule, probe,
decision), the kernels and every cell's seconds and throughput, ``index.md`` and ``figures/``; every
cell is logged as an MLflow run of stage ``train_nmt`` (tag ``record``) with its full metric
history, its test scores and head metrics, beside the CPU runs in the runs table.

The verdicts themselves are not kept: stage ``rejudge@<name>`` (``dvc repro``) writes
``claims.md`` / ``claims.json`` from ``results.json`` with today's checks, so a record never shows
verdicts its code no longer gives. A record folder's own ``README.md`` (provenance in words,
investigations) is left as it is.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import logging
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from PIL import Image

from learnable_sparsity.analysis.figures import alpha_histograms
from learnable_sparsity.claims import Results, load_claims, results_to_json
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.files import atomic_write_bytes, atomic_write_text
from learnable_sparsity.nmt.cell_evaluation import cell_scores
from learnable_sparsity.nmt.cells import NmtCell
from pipelines.cells.heads import analysis_metrics
from pipelines.lvm_experiments import LVM
from pipelines.scaffold import layout
from pipelines.scaffold.files import png, read_json, write_json
from pipelines.scaffold.imports import ROOT, git
from pipelines.scaffold.params import load_params
from pipelines.scaffold.tracking.lock import locked_environment
from pipelines.scaffold.tracking.runs import RunLogger, metric_name, start_stage_run
from pipelines.scaffold.tracking.store import tracking_uri
from pipelines.verdicts.inputs import head_results, nmt_results

log = logging.getLogger(__name__)

# Figures are kept at most this wide (pixels) in a 256-colour palette: a few tens of kB each,
# still legible (the stages draw them at 150 dpi for the MLflow UI).
FIGURE_WIDTH = 1000
FIGURE_COLOURS = 256
# What a record keeps of a run's report (relative to reports/), besides the figures it links.
REPORT_FILES = (Path("index.md"), Path("tables.md"))
_LINK = re.compile(r"\]\(([^)#\s]+)\)")
# The claims sections (the matrix of every run, this run's table): one pointer replaces them.
_CLAIMS_SECTION = re.compile(r"(?:^## The papers' claims.*?(?=^## ))+", re.DOTALL | re.MULTILINE)


def relative_links(markdown: str) -> list[str]:
    """The relative link targets of a Markdown text (no URLs, anchors or absolute paths)."""
    return [
        target
        for target in _LINK.findall(markdown)
        if "://" not in target and not target.startswith(("/", "mailto:"))
    ]


def small_png(path: Path) -> bytes:
    """The PNG at ``path`` at most :data:`FIGURE_WIDTH` pixels wide, in a palette."""
    with Image.open(path) as image:
        image = image.convert("RGB")
        if image.width > FIGURE_WIDTH:
            height = round(image.height * FIGURE_WIDTH / image.width)
            image = image.resize((FIGURE_WIDTH, height), Image.Resampling.LANCZOS)
        buffer = io.BytesIO()
        image.quantize(FIGURE_COLOURS).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def _report_text(source: Path, name: str) -> str:
    """A report file of the run, with the claims sections (verdicts that would go stale: the
    matrix and the table) replaced by a pointer to the record's re-judged ``claims.md``."""
    text = source.read_text(encoding="utf-8")
    pointer = (
        "## The papers' claims\n\n"
        f"Judged with today's checks by stage `rejudge@{name}` (`dvc repro`): see "
        f"[claims.md]({layout.RECORD_CLAIMS_REPORT}).\n\n"
    )
    return _CLAIMS_SECTION.sub(lambda _: pointer, text, count=1)


def keep(name: str) -> Path:
    """Copy the current run's results and report into ``reports/<name>/`` (see the module)."""
    _check_name(name)
    results = layout.results("claims") / "results.json"
    claims = layout.results("claims") / "claims.json"
    sources = [results, claims, *(layout.REPORTS / f for f in REPORT_FILES)]
    absent = [str(path) for path in sources if not path.exists()]
    if absent:
        raise LearnableSparsityError(
            f"nothing to keep: {', '.join(absent)} missing (run `make repro` on the profile first)"
        )
    texts = {f: _report_text(layout.REPORTS / f, name) for f in REPORT_FILES}
    linked = sorted({t for text in texts.values() for t in relative_links(text)})
    unresolved = [
        t for t in linked if t != layout.RECORD_CLAIMS_REPORT and not (layout.REPORTS / t).exists()
    ]
    if unresolved:
        raise LearnableSparsityError(f"the report links files that are not there: {unresolved}")
    folder = layout.record(name)
    for stale in ("index.md", "tables.md", "tables", "figures", layout.RECORD_RESULTS):
        target = folder / stale
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    for relative in linked:
        source, target = layout.REPORTS / relative, folder / relative
        if relative == layout.RECORD_CLAIMS_REPORT:
            continue
        data = small_png(source) if source.suffix == ".png" else source.read_bytes()
        atomic_write_bytes(target, data)
    for relative, text in texts.items():
        atomic_write_text(folder / relative, text)
    shutil.copyfile(results, folder / layout.RECORD_RESULTS)
    # The code only: params.yaml differs from the commit's by design (the profile applied).
    changed = git("status", "--porcelain", "--", "learnable_sparsity", "pipelines", checkout=ROOT)
    write_json(
        folder / layout.RECORD_META,
        {
            "profile": read_json(claims)["profile"],
            "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": git("rev-parse", "HEAD", checkout=ROOT),
            "uncommitted_code_changes": bool(changed) if changed is not None else None,
            "environment": locked_environment().as_record(),
            "thresholds": thresholds(),
        },
    )
    return folder


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name) or name in ("tables", "figures"):
        raise LearnableSparsityError(f"record name {name!r}: use lower-case letters, digits, _ -")


def thresholds() -> dict[str, dict[str, Any]]:
    """Every claim's thresholds as they are now (a record keeps those it was judged with)."""
    return {
        claim.id: {key: t.value for key, t in claim.thresholds.items()}
        for claim in load_claims()
        if claim.thresholds
    }


# What a GPU record of the NMT grid does not hold, and why (the checks that read it say so).
GPU_RECORD_LACKS = "a GPU record of the NMT grid (pipelines/commands/ast_grid.py) runs no {what}"


def gpu_results(cells: Path) -> tuple[Results, dict[str, list[float]]]:
    """The claims' results of the finished cells under ``cells`` (``<corpus>/<variant>/seed<k>/``
    as the GPU run packs them), read by the claims stage's loaders from files of the stages'
    form written beside them; and the final α per block pooled over seeds."""
    keys = sorted(str(f.parent.relative_to(cells)) for f in cells.glob("*/*/*/cell.json"))
    if not keys:
        raise LearnableSparsityError(f"no finished cell under {cells}")
    metrics = {key: read_json(cells / key / "metrics.json") for key in keys}
    done = {key: read_json(cells / key / "cell.json") for key in keys}
    bleu = {
        "cells": {key: cell_scores(metrics[key], done[key]["empty_hypotheses"]) for key in keys},
        "signatures": {name: m["signature"] for name, m in metrics[keys[0]].items()},
    }
    heads = {key: read_json(cells / key / "analysis.json")["summary"] for key in keys}
    alphas = {key: read_json(cells / key / "history.json")["alphas"] for key in keys}
    files = cells.parent
    write_json(files / "bleu.json", bleu)
    write_json(files / "heads.json", heads)
    write_json(files / "alpha_trajectories.json", {k: a for k, a in alphas.items() if a})
    results = Results()
    nmt_results(results, files / "bleu.json", cells)
    per_block = head_results(results, files / "heads.json", files / "alpha_trajectories.json")
    results.missing["speed"] = GPU_RECORD_LACKS.format(what="speed stage")
    results.missing["ape"] = GPU_RECORD_LACKS.format(what="APE stages")
    for experiment in LVM:
        results.missing[experiment] = GPU_RECORD_LACKS.format(what="latent-variable experiments")
    return results, per_block


def metric_history(path: Path) -> dict[int, dict[str, float]]:
    """Step → every metric logged at it, from a cell's ``metrics.jsonl`` (a resumed cell logs
    the steps after its checkpoint again: the last value of a (metric, step) is kept)."""
    by_step: dict[int, dict[str, float]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        step = int(entry.pop("step"))
        by_step.setdefault(step, {}).update({metric_name(k): v for k, v in entry.items()})
    return by_step


def log_gpu_runs(name: str, cells: Path, grid: dict[str, Any], experiment: str, uri: str) -> int:
    """One MLflow run of stage ``train_nmt`` per finished cell under a parent run, tagged with
    the record: its params, every metric it logged by step, its test scores and head metrics.
    Returns the runs logged."""
    settings = grid["settings"]
    params = {"profile": settings["profile"], "nmt": settings["nmt"]}
    parent = start_stage_run(uri, experiment, "train_nmt", params)
    record_tags = {"record": name, "device": str(grid["environment"].get("gpu", "cpu"))}
    parent.set_tags(record_tags)
    logged = 0
    with parent:
        for key, cell in sorted(grid["cells"].items()):
            if cell["status"] != "finished":
                continue
            run = RunLogger(uri, parent.child(key, {"cell": key}, {"cell": key, **record_tags}))
            with run:
                for step, metrics in sorted(metric_history(cells / key / "metrics.jsonl").items()):
                    run.log_metrics(metrics, step)
                scores = cell_scores(
                    read_json(cells / key / "metrics.json"), cell["empty_hypotheses"]
                )
                summary = read_json(cells / key / "analysis.json")["summary"]
                run.log_metrics(
                    {
                        **{metric_name("test", k): v for k, v in scores.items()},
                        **analysis_metrics(summary),
                        "task_seconds": sum(cell["seconds"].values()),
                        "train_target_tokens_per_s": cell["train_target_tokens_per_s"],
                    },
                    step=0,
                )
            logged += 1
    return logged


def _index(name: str, grid: dict[str, Any], figures: list[str]) -> str:
    """The record's ``index.md``: every cell's numbers and the figures."""
    rows = [
        "| cell | status | test BLEU | final valid NLL | target tokens | train tokens/s | s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, cell in sorted(grid["cells"].items()):
        if cell["status"] != "finished":
            rows.append(f"| {key} | {cell['status']} | | | | | |")
            continue
        status = "finished, stopped early" if cell.get("short") else "finished"
        rows.append(
            f"| {key} | {status} | {cell['bleu']:.2f} | "
            f"{cell['summary']['final_valid_nll']:.3f} | {cell['target_tokens']:,.0f} | "
            f"{cell['train_target_tokens_per_s']:,.0f} | {sum(cell['seconds'].values()):.0f} |"
        )
    environment, length = grid["environment"], grid["length"]
    decision, rule, rates = length["decision"], length["rule"], length["inputs"]["rates"]
    lines = [
        f"# Record `{name}`: the `{grid['settings']['profile']}` grid on "
        f"{environment.get('gpu', environment['device'])}",
        "",
        f"Length: {decision['rung']:,} target tokens per model "
        f"({length['train']['max_steps']} steps), the rung of the pre-registered ladder "
        f"{', '.join(f'{rung:,}' for rung in rule['ladder'])} that the rule chose from the probed "
        f"rates ({min(rates.values()):,.0f}–{max(rates.values()):,.0f} target tokens/s per cell, "
        f"safety {rule['safety']}, {length['inputs']['seconds']:.0f} s left to train)"
        + ("" if decision["fits"] else ": no rung fitted, the smallest was trained")
        + f". Kernels: {grid['kernels']['kernels']}. Wall time {grid['wall_s']:.0f} s of the "
        f"call's {grid['times']['limit_s']:.0f} s, {grid['parallel']} cells at a time.",
        "",
        *rows,
        "",
        "## The papers' claims",
        "",
        f"Judged with today's checks by stage `rejudge@{name}` (`dvc repro`): see "
        f"[claims.md]({layout.RECORD_CLAIMS_REPORT}).",
        "",
        "## Figures",
        "",
        *(f"- [{figure}]({figure})" for figure in figures),
        "",
    ]
    return "\n".join(lines)


def keep_gpu(
    name: str,
    source: Path,
    reports: Path = layout.REPORTS,
    tracking: tuple[str, str] | None = None,
) -> tuple[Path, int]:
    """Keep the GPU run in ``source`` (``grid.json``, ``grid.tar.gz``) as ``reports/<name>/``
    (see the module) and, with ``tracking`` (MLflow experiment, tracking URI), log its cells
    (:func:`log_gpu_runs`); the folder and the runs logged."""
    _check_name(name)
    absent = [str(source / f) for f in ("grid.json", "grid.tar.gz") if not (source / f).is_file()]
    if absent:
        raise LearnableSparsityError(f"no GPU run to keep: {', '.join(absent)} missing")
    grid = read_json(source / "grid.json")
    folder = reports / name
    with tempfile.TemporaryDirectory() as staging:
        with tarfile.open(source / "grid.tar.gz") as tar:
            tar.extractall(staging, filter="data")
        cells = Path(staging) / "cells"
        results, per_block = gpu_results(cells)
        for key, cell in grid["cells"].items():
            if cell["status"] == "finished":
                cell["bleu"] = read_json(cells / key / "metrics.json")["bleu"]["score"]
        if (folder / "figures").exists():
            shutil.rmtree(folder / "figures")
        figures = []
        for path in sorted(cells.glob("*/*/*/figures/*.png")):
            cell = NmtCell.from_key(str(path.parents[1].relative_to(cells)))
            relative = f"figures/{cell.corpus}/seed{cell.seed}/{path.name}"
            atomic_write_bytes(folder / relative, small_png(path))
            figures.append(relative)
        if per_block:
            relative = "figures/claims/alpha_histograms.png"
            figure = alpha_histograms(per_block)
            atomic_write_bytes(folder / relative, png(figure))
            figures.append(relative)
        runs = log_gpu_runs(name, cells, grid, *tracking) if tracking else 0
    write_json(folder / layout.RECORD_RESULTS, results_to_json(results))
    code = grid.get("code") or {}
    write_json(
        folder / layout.RECORD_META,
        {
            "profile": grid["settings"]["profile"],
            "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "ran": grid["started"],
            "commit": code.get("commit"),
            "uncommitted_code_changes": code.get("uncommitted_code_changes"),
            "device": grid["environment"].get("gpu", grid["environment"]["device"]),
            "environment": grid["environment"],
            "length": grid["length"],
            "kernels": grid["kernels"]["kernels"],
            "preflight": grid["kernels"],
            "times": grid["times"],
            "wall_s": grid["wall_s"],
            "parallel": grid["parallel"],
            "cells": grid["cells"],
            "settings": grid["settings"],
            "thresholds": thresholds(),
        },
    )
    atomic_write_text(folder / "index.md", _index(name, grid, figures))
    return folder, runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the record's folder under reports/ (e.g. evidence)")
    parser.add_argument(
        "--from-gpu",
        type=Path,
        metavar="DIR",
        help="keep the GPU grid run in DIR (grid.json, grid.tar.gz) instead of the current run",
    )
    args = parser.parse_args(argv)
    name = args.name
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.from_gpu is None:
            folder = keep(name)
        else:
            experiment = load_params().get("mlflow.experiment", str)
            tracking = (experiment, tracking_uri(ROOT))
            folder, runs = keep_gpu(name, args.from_gpu, tracking=tracking)
            log.info("logged %d cells as MLflow runs of train_nmt (tag record=%s)", runs, name)
    except LearnableSparsityError as error:
        log.error("record: %s", error)
        raise SystemExit(1) from None
    log.info(
        "kept %s; judge it with `dvc repro rejudge@%s` (a new record: add %r to the foreach of "
        "stage rejudge in dvc.yaml first), then commit the folder",
        folder,
        name,
        name,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
