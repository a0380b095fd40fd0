"""The AST grid (corpus × variant × seed) of a profile in one prepared device call, without Ray,
MLflow or DVC: every cell trained, its test set translated by beam search and its heads analysed
by the stages' own cell functions (``learnable_sparsity.nmt.cell_training``,
``nmt.cell_evaluation``, ``analysis.cell_analysis``), several cells at once in processes.

On the development machine, first (CPU; reads the SWORD Bibles, minutes):

    python benchmarks/gpu/ast_grid.py --prepare [--profile bible-gpu]

writes the profile's corpus and BPE model into ``.ast-grid/`` (git-ignored; ``carry`` it) with the
commit of the code, and prints the batches' target tokens and what the pre-registered length
(``gpu_grid.target_tokens`` of the profile) needs. Then on the device (docs/gpu-records.md):

    python benchmarks/gpu/ast_grid.py --out $OUT --device cuda [--budget-s 480]

Checkpoints go to ``--work`` (default /tmp/ast-grid-work, outside ``$OUT``, which is emptied before
every call and brings back at most 8 files): a call cut off and repeated on the same (warm)
machine resumes every cell from its last checkpoint. Before ``--budget-s`` runs out, cells still
running are stopped and what finished is packed. ``$OUT`` receives ``grid.json`` (settings,
pre-registered length, device, environment, commit, every cell's status, seconds and training
throughput) and ``grid.tar.gz`` (per finished cell under ``cells/<corpus>/<variant>/seed<k>/``:
``history.json``, ``metrics.jsonl`` (every logged metric by step, as MLflow would hold them),
``metrics.json``, ``translations.txt``, ``analysis.json``, ``figures/*.png``), both rewritten after
every finished cell, and ``log.txt``. ``python -m pipelines.record <name> --from-gpu <dir>`` keeps
them as a record.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from learnable_sparsity.nmt.cells import NmtCell  # noqa: E402

DATA = ROOT / ".ast-grid"  # corpus and BPE model made by --prepare (git-ignored, carried)
WORK = Path("/tmp/ast-grid-work")  # checkpoints: outside $OUT, which is emptied every call
GRID_JSON = "grid.json"
GRID_TAR = "grid.tar.gz"
# Seconds kept back from the budget for stopping the cells still running and packing the rest.
RESERVE_S = 20
POLL_S = 1.0
# What a finished cell leaves in its work folder besides checkpoints (all of it travels back).
RESULT_FILES = ("history.json", "metrics.jsonl", "metrics.json", "translations.txt")
ANALYSIS = "analysis.json"
FIGURES = "figures"
DONE = "cell.json"  # written last: the cell finished
log = logging.getLogger("ast_grid")


def load_settings(profile: str, profiles: Path, params: Path) -> dict[str, Any]:
    """The smoke params with ``profiles/<profile>.yaml`` applied (as ``pipelines.profile``)."""
    from pipelines.scaffold.params import load_params, with_profile

    return dict(with_profile(load_params(params), profile, profiles).data)


def grid_settings(data: dict[str, Any]) -> dict[str, Any]:
    """The validated settings of the run: ``nmt``, ``analysis``, ``gpu_grid``; a bad value
    raises naming its key before any work starts."""
    from learnable_sparsity.analysis.heads import AnalysisSettings
    from learnable_sparsity.nmt.grid import NmtSettings
    from learnable_sparsity.settings import build, params_of

    nmt = build(NmtSettings, data["nmt"], "nmt")
    analysis = build(AnalysisSettings, data["analysis"], "analysis")
    grid = data.get("gpu_grid") or {}
    for key in ("target_tokens", "parallel"):
        if not isinstance(grid.get(key), int) or grid[key] < 1:
            raise SystemExit(f"gpu_grid.{key} must be a positive integer, got {grid.get(key)!r}")
    return {
        "profile": data["profile"],
        "nmt": params_of(nmt),
        "analysis": params_of(analysis),
        "gpu_grid": grid,
        "corpora": {name: data["corpora"][name] for name in nmt.corpora},
        "bpe": data["bpe"],
    }


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def batch_target_tokens(settings: dict[str, Any], data: Path) -> dict[str, float]:
    """Per corpus: the mean non-pad target tokens of a training batch (epoch 0, seed 0)."""
    from learnable_sparsity.data.bpe import BpeModel
    from learnable_sparsity.data.local import read_corpus
    from learnable_sparsity.nmt.batching import batches_of, encode_pairs

    means = {}
    for corpus in settings["nmt"]["corpora"]:
        bpe = BpeModel(data / "bpe" / corpus / "bpe.model")
        train = encode_pairs(bpe, read_corpus(data / "corpora" / corpus, ("train",))["train"])
        order = batches_of(train, settings["nmt"]["train"]["max_tokens"], 0)
        means[corpus] = sum(len(train[i][1]) + 1 for b in order for i in b) / len(order)
    return means


def prepare(settings: dict[str, Any], data: Path) -> dict[str, Any]:
    """The corpora and BPE models of ``settings`` into ``data`` (as stages corpora and bpe
    write them), the commit of the code, and the length the settings train."""
    from learnable_sparsity.data.bpe import BpeSettings, train_joint_bpe
    from learnable_sparsity.data.corpora import (
        SwordCorpus,
        bible_modules,
        corpus_fields,
        corpus_settings,
        load_corpus,
    )
    from learnable_sparsity.data.local import read_corpus, write_corpus
    from learnable_sparsity.settings import build

    bpe = build(BpeSettings, settings["bpe"], "bpe")
    for name, raw in settings["corpora"].items():
        corpus = corpus_settings(raw, f"corpora.{name}")
        folder = data / "corpora" / name
        meta = write_corpus(folder, load_corpus(corpus), corpus_fields(corpus))
        if isinstance(corpus, SwordCorpus):
            meta["modules"] = bible_modules(corpus)
        (folder / "meta.json").write_text(json.dumps({"source": asdict(corpus), **meta}, indent=1))
        train = read_corpus(folder, ("train",))["train"]
        train_joint_bpe(train, data / "bpe" / name / "bpe", bpe.vocab_size)
    changed = _git("status", "--porcelain", "--", "learnable_sparsity", "pipelines", "benchmarks")
    stamp = {
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted_code_changes": bool(changed) if changed is not None else None,
    }
    (data / "commit.json").write_text(json.dumps(stamp, indent=1))
    return {**stamp, "length": planned_length(settings, data)}


def planned_length(settings: dict[str, Any], data: Path) -> dict[str, Any]:
    """The target tokens ``nmt.train.max_steps`` trains per model (from the batches' mean) and
    the pre-registered ``gpu_grid.target_tokens``; refuses settings that train fewer."""
    steps = settings["nmt"]["train"]["max_steps"]
    wanted = settings["gpu_grid"]["target_tokens"]
    means = batch_target_tokens(settings, data)
    planned = {corpus: steps * mean for corpus, mean in means.items()}
    short = {corpus: tokens for corpus, tokens in planned.items() if tokens < wanted}
    if short:
        needed = {c: math.ceil(wanted / means[c]) for c in short}
        raise SystemExit(
            f"nmt.train.max_steps {steps} trains {short} target tokens per model, fewer than the "
            f"pre-registered gpu_grid.target_tokens {wanted}: it needs max_steps {needed}"
        )
    return {
        "preregistered_target_tokens": wanted,
        "max_steps": steps,
        "batch_target_tokens": means,
        "planned_target_tokens": planned,
    }


def environment(device: str) -> dict[str, Any]:
    """Python, torch, CUDA and the device the run used."""
    import torch

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "cpus": os.cpu_count(),
    }
    if device == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError:
        facts["triton"] = None
    return facts


def run_cell(key: str, settings: dict[str, Any], data: Path, work: Path, device: str) -> None:
    """One cell in its own process: train (resuming from ``work/<key>``), translate the test
    set, analyse the heads, with the stages' cell functions; ``cell.json`` last."""
    import torch

    from learnable_sparsity.analysis.cell_analysis import analyze_model
    from learnable_sparsity.analysis.heads import AnalysisSettings
    from learnable_sparsity.data.bpe import BpeModel
    from learnable_sparsity.data.corpora import corpus_settings, source_language
    from learnable_sparsity.data.local import read_corpus
    from learnable_sparsity.nmt.cell_evaluation import evaluate_model
    from learnable_sparsity.nmt.cell_training import load_trained, train_cell
    from learnable_sparsity.nmt.model import TransformerConfig
    from learnable_sparsity.nmt.search import DecodeSettings
    from learnable_sparsity.nmt.training import TrainingSettings
    from learnable_sparsity.settings import build

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {key} %(message)s")
    torch.set_num_threads(1)
    cell, nmt = NmtCell.from_key(key), settings["nmt"]
    folder = work / key
    folder.mkdir(parents=True, exist_ok=True)
    corpus_dir = data / "corpora" / cell.corpus
    bpe = BpeModel(data / "bpe" / cell.corpus / "bpe.model")
    config = build(TransformerConfig, nmt["model"], "nmt.model")
    config = config.for_vocabulary(bpe.vocab_size, cell.variant)
    train_settings = build(TrainingSettings, nmt["train"], "nmt.train", seed=cell.seed)
    decode = build(DecodeSettings, nmt["decode"], "nmt.decode")
    corpus = read_corpus(corpus_dir, ("train", "valid", "test"))
    timings: dict[str, float] = {}
    with open(folder / "metrics.jsonl", "a", encoding="utf-8") as metrics_log:

        def on_log(step: int, metrics: dict[str, float]) -> None:
            metrics_log.write(json.dumps({"step": step, **metrics}) + "\n")

        start = time.perf_counter()
        _, history, summary = train_cell(
            cell,
            config,
            bpe,
            corpus,
            train_settings,
            device,
            checkpoint_dir=folder,
            on_log=on_log,
            before_checkpoint=lambda _: metrics_log.flush(),
        )
        timings["train_s"] = time.perf_counter() - start
    (folder / "history.json").write_text(json.dumps(asdict(history)))
    model = load_trained(config, folder, decode.average_last).to(device)
    start = time.perf_counter()
    hypotheses, metrics, empty = evaluate_model(model, bpe, corpus["test"], decode)
    timings["decode_s"] = time.perf_counter() - start
    (folder / "translations.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=1))
    meta = json.loads((corpus_dir / "meta.json").read_text())
    language = source_language(corpus_settings(meta["source"], f"corpora.{cell.corpus}"))
    analysis = build(AnalysisSettings, settings["analysis"], "analysis")
    start = time.perf_counter()
    result, drawn = analyze_model(model, bpe, corpus["valid"], analysis, language, history.alphas)
    (folder / FIGURES).mkdir(exist_ok=True)
    for name, figure in drawn.items():
        figure.savefig(folder / FIGURES / f"{name}.png", format="png", dpi=100)
    result["figures"] = sorted(f"{name}.png" for name in drawn)
    (folder / ANALYSIS).write_text(json.dumps(result))
    timings["analysis_s"] = time.perf_counter() - start
    record = {
        "key": key,
        "summary": summary,
        "empty_hypotheses": empty,
        "seconds": timings,
        "target_tokens": history.train[-1]["target_tokens"],
        "train_target_tokens_per_s": history.train[-1]["target_tokens"] / timings["train_s"],
    }
    (folder / DONE).write_text(json.dumps(record, indent=1))


def pack(out: Path, work: Path, keys: list[str], manifest: dict[str, Any]) -> None:
    """``grid.tar.gz`` of the finished cells and ``grid.json``, each replaced atomically."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for key in keys:
            folder = work / key
            if not (folder / DONE).exists():
                continue
            for name in (*RESULT_FILES, ANALYSIS, DONE):
                tar.add(folder / name, f"cells/{key}/{name}")
            for figure in sorted((folder / FIGURES).glob("*.png")):
                tar.add(figure, f"cells/{key}/{FIGURES}/{figure.name}")
    for name, payload in (
        (GRID_TAR, buffer.getvalue()),
        (GRID_JSON, json.dumps(manifest, indent=1).encode()),
    ):
        partial = out / f".{name}.partial"
        partial.write_bytes(payload)
        partial.replace(out / name)


def run_grid(
    settings: dict[str, Any], data: Path, out: Path, work: Path, device: str, budget_s: float
) -> dict[str, Any]:
    """Every cell of the grid, ``gpu_grid.parallel`` at a time, until done or ``budget_s``
    (less :data:`RESERVE_S`) is spent; the manifest written to ``out``."""
    started = time.monotonic()
    deadline = started + budget_s - RESERVE_S
    nmt = settings["nmt"]
    keys = [
        NmtCell(c, v, s).key for c in nmt["corpora"] for v in nmt["variants"] for s in nmt["seeds"]
    ]
    stamp_file = data / "commit.json"
    manifest: dict[str, Any] = {
        "settings": settings,
        "length": planned_length(settings, data),
        "environment": environment(device),
        "code": json.loads(stamp_file.read_text()) if stamp_file.exists() else None,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "budget_s": budget_s,
        "parallel": settings["gpu_grid"]["parallel"],
        "cells": {},
    }
    context = multiprocessing.get_context("spawn")
    waiting = [k for k in keys if not (work / k / DONE).exists()]
    running: dict[str, multiprocessing.process.BaseProcess] = {}
    cut_off: list[str] = []
    while waiting or running:
        for key, process in list(running.items()):
            if not process.is_alive():
                del running[key]
                finished = (work / key / DONE).exists()
                status = "finished" if finished else f"failed (exit {process.exitcode})"
                log.info("%s: %s after %.0f s", key, status, time.monotonic() - started)
                manifest["cells"][key] = {"status": status}
                pack(out, work, keys, finish(manifest, work, keys, started))
        if time.monotonic() > deadline:
            for key, process in running.items():
                process.terminate()
                process.join()
                cut_off.append(key)
            cut_off.extend(waiting)
            break
        while waiting and len(running) < settings["gpu_grid"]["parallel"]:
            key = waiting.pop(0)
            process = context.Process(target=run_cell, args=(key, settings, data, work, device))
            process.start()
            running[key] = process
        time.sleep(POLL_S)
    for key in cut_off:
        manifest["cells"][key] = {"status": "cut off by the budget"}
    manifest = finish(manifest, work, keys, started)
    pack(out, work, keys, manifest)
    return manifest


def finish(manifest: dict[str, Any], work: Path, keys: list[str], started: float) -> dict:
    """The manifest with every finished cell's record and the seconds so far."""
    for key in keys:
        if (work / key / DONE).exists():
            manifest["cells"][key] = {
                "status": "finished",
                **json.loads((work / key / DONE).read_text()),
            }
    manifest["wall_s"] = time.monotonic() - started
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="bible-gpu")
    parser.add_argument("--profiles", type=Path, default=ROOT / "profiles")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--data", type=Path, default=DATA, help="--prepare's corpus and BPE")
    parser.add_argument("--prepare", action="store_true", help="make --data (CPU) and stop")
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"))
    parser.add_argument("--work", type=Path, default=WORK, help="checkpoints (resumed)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--budget-s", type=float, default=480.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    settings = grid_settings(load_settings(args.profile, args.profiles, args.params))
    if args.prepare:
        if args.data.exists():
            shutil.rmtree(args.data)
        print(json.dumps(prepare(settings, args.data), indent=1))
        return 0
    if args.out is None:
        parser.error("--out (or $OUT) is required")
    absent = [c for c in settings["nmt"]["corpora"] if not (args.data / "corpora" / c).is_dir()]
    if absent:
        parser.error(f"{args.data} has no corpus {absent}: run with --prepare first")
    from learnable_sparsity.precision import check_precision

    check_precision(settings["nmt"]["train"]["precision"], args.device, "nmt.train.precision")
    args.out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(args.out / "log.txt")
    logging.getLogger().addHandler(handler)
    manifest = run_grid(settings, args.data, args.out, args.work, args.device, args.budget_s)
    statuses = [cell["status"] for cell in manifest["cells"].values()]
    log.info("%d of %d cells finished", statuses.count("finished"), len(statuses))
    return 0 if statuses and all(s == "finished" for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
