"""The AST grid (corpus × variant × seed) of a profile in one prepared device call, without Ray,
MLflow or DVC: every cell trained, its test set translated by beam search and its heads analysed
by the stages' own cell functions (``learnable_sparsity.nmt.cell_training``,
``nmt.cell_evaluation``, ``analysis.cell_analysis``), the cells at once in processes.

On the development machine, first (CPU; reads the SWORD Bibles, minutes):

    python -m pipelines.commands.ast_grid --prepare [--profile bible-gpu]

writes the profile's corpus and BPE model into ``.ast-grid/`` (git-ignored; ``carry`` it) with the
commit of the code, and prints the batches' target tokens and the steps of every rung of the
profile's length ladder. Then on the device (docs/gpu-records.md gives the exact call):

    CALL_START=$(date +%s) python -m pipelines.commands.ast_grid --out $OUT --device cuda \
        --limit-s 560

One call, in phases, against a deadline of ``CALL_START + --limit-s − gpu_grid.margin_s`` (the
call's own limit, so the script ends before the device tool kills it):

1. **Preflight** (at most ``gpu_grid.preflight_s``): pytest runs one bf16 NMT step against float32
   and one resume on the device (``PREFLIGHT_TESTS``), stopped with SIGINT so that its
   ``preflight.xml`` is written. The rule fixed beforehand: if it fails, every cell runs the eager
   normalizers (``LEARNABLE_SPARSITY_TRITON=0``, ``LEARNABLE_SPARSITY_FUSED=0``) instead of the
   fused kernels; ``grid.json`` says which ran.
2. **Probe**: all cells start at once (``gpu_grid.parallel`` at a time, seed-major, so that a cut
   never loses a variant); each builds its data and a throwaway model and trains it on the real
   batches for ``probe_warmup`` updates, then ``probe_s`` seconds, and reports its target tokens
   per second under that concurrency.
3. **The length, by the rule pre-registered in the profile** (:func:`choose_length`): the largest
   rung of ``gpu_grid.ladder`` (target tokens per model) that the slowest cell's probed rate
   trains, with the safety factor, in the seconds left before the training deadline. Its inputs
   are throughputs and seconds only, never a result; ``grid.json`` records them and the rung.
   A repeated call on the same warm machine reuses the decision (``plan.json`` in ``--work``).
4. **Training**, then beam search and head analysis. At the deadline less ``eval_reserve_s`` every
   cell still training stops (``should_stop``): it validates, checkpoints, decodes and analyses as
   if done, and is flagged ``stopped_early``. At the deadline a cell still running is terminated
   and reported as cut off, with its log.

``$OUT`` receives ``grid.json`` (settings, the length's rule, probe and decision, device,
environment, commit, kernels, preflight, every cell's status, seconds and training throughput, a
failed cell's traceback), ``grid.tar.gz`` (per cell under ``cells/<corpus>/<variant>/seed<k>/``:
``log.txt`` and ``error.txt`` for every cell; when finished ``history.json``, ``metrics.jsonl``
(every logged metric by step, as MLflow would hold them), ``metrics.json``, ``translations.txt``,
``analysis.json``, ``figures/*.png``), both rewritten after every finished cell, ``log.txt`` and
``preflight.xml``. Checkpoints go to ``--work`` (outside ``$OUT``, which is emptied before every
call): a repeated call resumes every unfinished cell. ``python -m pipelines.commands.record <name>
--from-gpu <dir>`` keeps the output as a record.
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
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# The kernels' run's list of what to compile ahead (benchmarks/gpu/prewarm.py) is the prewarm's too.
sys.path.insert(1, str(ROOT / "benchmarks" / "gpu"))

from learnable_sparsity.nmt.cells import NmtCell  # noqa: E402
from pipelines.scaffold.imports import git  # noqa: E402

DATA = ROOT / ".ast-grid"  # corpus and BPE model made by --prepare (git-ignored, carried)
WORK = Path("/tmp/ast-grid-work")  # checkpoints: outside $OUT, which is emptied every call
GRID_JSON = "grid.json"
GRID_TAR = "grid.tar.gz"
PREFLIGHT_XML = "preflight.xml"
PLAN = "plan.json"  # the decided length, in --work: a repeated call never decides again
PROBE = "probe.json"  # a cell's probed rate
DONE = "cell.json"  # written last: the cell finished
CELL_LOG = "log.txt"
CELL_ERROR = "error.txt"
RESULT_FILES = ("history.json", "metrics.jsonl", "metrics.json", "translations.txt")
ANALYSIS = "analysis.json"
FIGURES = "figures"
# The preflight: one bf16 update against float32 for every normalizer, and one resume (the
# device's, by pytest's ids) — what the cells do, in seconds.
PREFLIGHT_TESTS = "tests/devices/test_training_steps.py"
PREFLIGHT_SELECTION = "{device} and (nmt_step_in_bf16_matches_float32 or nmt_training_resumes)"
EAGER = {"LEARNABLE_SPARSITY_TRITON": "0", "LEARNABLE_SPARSITY_FUSED": "0"}
SIGINT_GRACE_S = 10  # pytest writes its XML after SIGINT; then it is killed
# Attention rows up to this length get their kernels compiled before the probe: source and target
# sentences of at most ~50 words hold ~120 BPE tokens, decoding stops at ~200 (every variant of a
# power-of-two block up to 256).
PREWARM_LONGEST = 256
POLL_S = 0.5
# gpu_grid keys: (kind, lower bound) — checked before any work
GRID_KEYS: dict[str, tuple[type, float]] = {
    "parallel": (int, 1),
    "safety": (float, 1.0),
    "probe_warmup": (int, 1),
    "probe_s": (float, 1.0),
    "eval_reserve_s": (float, 0.0),
    "margin_s": (float, 0.0),
    "preflight_s": (float, 0.0),
    "validations": (int, 1),
    "checkpoints": (int, 1),
}
log = logging.getLogger("ast_grid")


def load_settings(profile: str, profiles: Path, params: Path) -> dict[str, Any]:
    """The smoke params with ``profiles/<profile>.yaml`` applied (as
    ``pipelines.commands.profile``)."""
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
    grid = dict(data.get("gpu_grid") or {})
    for key, (kind, least) in GRID_KEYS.items():
        value = grid.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < least:
            raise SystemExit(f"gpu_grid.{key} must be a {kind.__name__} >= {least}, got {value!r}")
        grid[key] = kind(value)
    ladder = grid.get("ladder")
    if (
        not isinstance(ladder, list)
        or not ladder
        or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ladder)
        or ladder != sorted(set(ladder))
    ):
        raise SystemExit(
            f"gpu_grid.ladder must be increasing positive target-token counts, got {ladder!r}"
        )
    unknown = sorted(set(grid) - set(GRID_KEYS) - {"ladder"})
    if unknown:
        raise SystemExit(f"gpu_grid has unknown keys {unknown}; known: {sorted(GRID_KEYS)}")
    return {
        "profile": data["profile"],
        "nmt": params_of(nmt),
        "analysis": params_of(analysis),
        "gpu_grid": grid,
        "corpora": {name: data["corpora"][name] for name in nmt.corpora},
        "bpe": data["bpe"],
    }


def cell_keys(nmt: Mapping[str, Any]) -> list[str]:
    """Every cell, seed-major: the first cells to run hold every variant of a seed, so that a
    grid cut short keeps whole seeds of every variant, never all seeds of some variants."""
    return [
        NmtCell(corpus, variant, seed).key
        for seed in nmt["seeds"]
        for corpus in nmt["corpora"]
        for variant in nmt["variants"]
    ]


def choose_length(
    rates: Mapping[str, float],
    seconds: float,
    waves: int,
    ladder: Sequence[int],
    safety: float,
) -> dict[str, Any]:
    """The pre-registered length rule: the largest rung L of ``ladder`` (target tokens per model)
    with ``waves · L · safety / min(rates) ≤ seconds`` (every cell trains at the slowest probed
    rate, ``waves`` rounds of cells one after the other), else the smallest rung, flagged as not
    fitting. Inputs are throughputs (target tokens/s per cell) and seconds only."""
    if not rates:
        raise ValueError("no probed rate to choose a length from")
    slowest = min(rates.values())

    def needed(rung: int) -> float:
        return waves * rung * safety / slowest

    fitting = [rung for rung in ladder if needed(rung) <= seconds]
    rung = max(fitting) if fitting else min(ladder)
    return {
        "rung": rung,
        "fits": bool(fitting),
        "slowest_cell": min(rates, key=rates.__getitem__),
        "slowest_rate": slowest,
        "seconds_needed": needed(rung),
    }


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


def steps_for(rung: int, means: Mapping[str, float]) -> int:
    """The updates that train at least ``rung`` target tokens on every corpus."""
    return max(math.ceil(rung / mean) for mean in means.values())


def prepare(settings: dict[str, Any], data: Path) -> dict[str, Any]:
    """The corpora and BPE models of ``settings`` into ``data`` (as stages corpora and bpe
    write them), the commit of the code, and the steps of every rung of the ladder."""
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
    changed = git(
        "status",
        "--porcelain",
        "--",
        "learnable_sparsity",
        "pipelines",
        "benchmarks",
        checkout=ROOT,
    )
    stamp = {
        "commit": git("rev-parse", "HEAD", checkout=ROOT),
        "uncommitted_code_changes": bool(changed) if changed is not None else None,
    }
    (data / "commit.json").write_text(json.dumps(stamp, indent=1))
    means = batch_target_tokens(settings, data)
    ladder = settings["gpu_grid"]["ladder"]
    steps = {rung: steps_for(rung, means) for rung in ladder}
    return {**stamp, "batch_target_tokens": means, "steps": steps}


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


def preflight(device: str, out: Path, limit_s: float, tests: str) -> dict[str, Any]:
    """pytest on ``tests`` (the device's cases of :data:`PREFLIGHT_SELECTION`), SIGINT at
    ``limit_s`` so that ``preflight.xml`` is written; its outcome and the kernels the cells run."""
    if limit_s <= 0:
        return {"ran": False, "passed": None, "kernels": "fused"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests]
    command += ["-k", PREFLIGHT_SELECTION.format(device=device)]
    command += [f"--junitxml={out / PREFLIGHT_XML}"]
    start = time.monotonic()
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = process.communicate(timeout=limit_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=SIGINT_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        timed_out = True
    for line in output.splitlines():
        log.info("preflight: %s", line)
    passed = process.returncode == 0 and not timed_out
    return {
        "ran": True,
        "command": " ".join(command),
        "returncode": process.returncode,
        "timed_out": timed_out,
        "seconds": time.monotonic() - start,
        "passed": passed,
        "kernels": "fused" if passed else "eager",
    }


def prewarm_share(device: str, tasks: list[tuple[int, str]]) -> None:
    """Compile (into Triton's disk cache, shared by the cells) the normalizers' kernels for
    ``tasks``: (row length, dtype) pairs (``prewarm._short_rows``)."""
    import torch
    from prewarm import _short_rows

    for length, dtype in tasks:
        _short_rows(torch.device(device), length, getattr(torch, dtype))
    if device == "cuda":
        torch.cuda.synchronize()


def start_prewarm(device: str, precision: str, workers: int) -> list[Any]:
    """Processes compiling every kernel variant the cells' attention rows need
    (:data:`PREWARM_LONGEST`; float32 for validation and decoding, bf16 too when training in it),
    dealt round-robin: Triton compiles on the CPU, one kernel after another in each process."""
    from prewarm import _short_lengths

    dtypes = ["float32", *(["bfloat16"] if precision == "bf16" else [])]
    tasks = [(length, dtype) for length in _short_lengths(PREWARM_LONGEST) for dtype in dtypes]
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=prewarm_share, args=(device, tasks[i::workers]))
        for i in range(min(workers, len(tasks)))
    ]
    for process in processes:
        process.start()
    return processes


def _wait_for(path: Path, until: float) -> dict[str, Any] | None:
    while time.time() < until:
        if path.exists():
            return json.loads(path.read_text())
        time.sleep(POLL_S)
    return None


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe(
    config: Any, train_set: Sequence[Any], train: Any, device: Any, grid: Mapping
) -> dict[str, float]:
    """Target tokens per second of the training loop's updates of a throwaway model of
    ``config`` on the real batches, after ``probe_warmup`` updates, for ``probe_s`` seconds (the
    clock read once the device has finished the updates it was given)."""
    from learnable_sparsity.nmt.batching import batches_of, collate_examples
    from learnable_sparsity.nmt.model import Transformer
    from learnable_sparsity.nmt.training import build_optimizer, update

    model = Transformer(config).to(device)
    optimizer, scheduler = build_optimizer(
        model, train.peak_lr, train.warmup, alpha_lr_scale=train.alpha_lr_scale
    )
    order = batches_of(train_set, train.max_tokens, train.seed)
    steps, tokens, start = 0, 0, 0.0
    for step, indices in enumerate(order * (1 + grid["probe_warmup"]), start=1):
        batch = collate_examples(train_set, indices, model)
        update(  # the training loop's update: no host sync
            model, [batch], optimizer, scheduler, train.clip_norm, train.label_smoothing,
            precision=train.precision,
        )  # fmt: skip
        if step == grid["probe_warmup"]:
            _sync(device)
            start = time.perf_counter()
        elif step > grid["probe_warmup"]:
            steps += 1
            tokens += sum(len(train_set[i][1]) + 1 for i in indices)
            if time.perf_counter() - start >= grid["probe_s"]:
                break
    _sync(device)
    seconds = time.perf_counter() - start
    del model, optimizer
    return {"target_tokens_per_s": tokens / seconds, "steps": steps, "seconds": seconds}


def run_cell(
    key: str, settings: dict[str, Any], data: Path, work: Path, device: str, times: dict
) -> None:
    """One cell in its own process (its log in ``work/<key>/log.txt``, a traceback in
    ``error.txt``): the probe unless the length is decided, then training (resuming from
    ``work/<key>``, stopping at ``times["stop_training"]``), the test set translated, the
    heads analysed, with the stages' cell functions; ``cell.json`` last."""
    folder = work / key
    folder.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(folder / CELL_LOG)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [{key}] %(message)s",
        handlers=[logging.StreamHandler(), handler],
    )
    try:
        _run_cell(key, settings, data, work, device, times)
    except BaseException:
        (folder / CELL_ERROR).write_text(traceback.format_exc(), encoding="utf-8")
        log.exception("%s failed", key)
        raise


def _run_cell(
    key: str, settings: dict[str, Any], data: Path, work: Path, device: str, times: dict
) -> None:
    import torch

    from learnable_sparsity.analysis.cell_analysis import analyze_model
    from learnable_sparsity.analysis.heads import AnalysisSettings
    from learnable_sparsity.data.bpe import BpeModel
    from learnable_sparsity.data.corpora import corpus_settings, source_language
    from learnable_sparsity.data.local import read_corpus
    from learnable_sparsity.nmt.batching import encode_pairs
    from learnable_sparsity.nmt.cell_evaluation import evaluate_model
    from learnable_sparsity.nmt.cell_training import initial_model, load_trained, train_model
    from learnable_sparsity.nmt.model import TransformerConfig
    from learnable_sparsity.nmt.search import DecodeSettings
    from learnable_sparsity.nmt.training import TrainingSettings
    from learnable_sparsity.settings import build

    torch.set_num_threads(1)
    cell, nmt, grid = NmtCell.from_key(key), settings["nmt"], settings["gpu_grid"]
    folder = work / key
    corpus_dir = data / "corpora" / cell.corpus
    bpe = BpeModel(data / "bpe" / cell.corpus / "bpe.model")
    config = build(TransformerConfig, nmt["model"], "nmt.model")
    config = config.for_vocabulary(bpe.vocab_size, cell.variant)
    decode = build(DecodeSettings, nmt["decode"], "nmt.decode")
    corpus = read_corpus(corpus_dir, ("train", "valid", "test"))
    plan_file = work / PLAN
    if not plan_file.exists():
        probe_settings = build(TrainingSettings, nmt["train"], "nmt.train", seed=cell.seed)
        train_set = encode_pairs(bpe, corpus["train"])
        rate = probe(config, train_set, probe_settings, torch.device(device), grid)
        if device == "cuda":
            torch.cuda.empty_cache()  # the throwaway model's memory back before training
        log.info("probe: %.0f target tokens/s", rate["target_tokens_per_s"])
        (folder / PROBE).write_text(json.dumps(rate))
    plan = _wait_for(plan_file, times["stop_training"])
    if plan is None:
        raise TimeoutError("no length was decided before the training deadline")
    train_settings = build(
        TrainingSettings, {**nmt["train"], **plan["train"]}, "nmt.train", seed=cell.seed
    )
    timings: dict[str, float] = {}
    with open(folder / "metrics.jsonl", "a", encoding="utf-8") as metrics_log:

        def on_log(step: int, metrics: dict[str, float]) -> None:
            metrics_log.write(json.dumps({"step": step, **metrics}) + "\n")

        start = time.perf_counter()
        train_set, valid_set = (encode_pairs(bpe, corpus[split]) for split in ("train", "valid"))
        history, summary = train_model(
            initial_model(cell, config, device),
            train_set,
            valid_set,
            train_settings,
            checkpoint_dir=folder,
            variant=cell.key,
            on_log=on_log,
            before_checkpoint=lambda _: metrics_log.flush(),
            should_stop=lambda _: time.time() >= times["stop_training"],
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
    """``grid.tar.gz`` (every cell's log and traceback, the finished cells' results) and
    ``grid.json``, each replaced atomically."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for key in keys:
            folder = work / key
            names = [CELL_LOG, CELL_ERROR]
            if (folder / DONE).exists():
                names += [*RESULT_FILES, ANALYSIS, DONE]
                names += [f"{FIGURES}/{f.name}" for f in sorted((folder / FIGURES).glob("*.png"))]
            for name in names:
                if (folder / name).is_file():
                    tar.add(folder / name, f"cells/{key}/{name}")
    for name, payload in (
        (GRID_TAR, buffer.getvalue()),
        (GRID_JSON, json.dumps(manifest, indent=1).encode()),
    ):
        partial = out / f".{name}.partial"
        partial.write_bytes(payload)
        partial.replace(out / name)


def status_of(work: Path, key: str, exitcode: int | None) -> dict[str, Any]:
    """A cell's entry in the manifest: its record when finished (``stopped_early`` where the
    deadline ended its training), else why not and the last lines of its traceback."""
    folder = work / key
    if (folder / DONE).exists():
        record = json.loads((folder / DONE).read_text())
        short = "stopped_early" in record["summary"]
        return {"status": "finished", "short": short, **record}
    entry: dict[str, Any] = {"status": f"failed (exit {exitcode})"}
    if exitcode is None:
        entry["status"] = "cut off at the deadline"
    if (folder / CELL_ERROR).exists():
        entry["error"] = (folder / CELL_ERROR).read_text().splitlines()[-12:]
    return entry


def decide(
    work: Path, keys: list[str], probing: list[str], grid: Mapping, means: Mapping, times: dict
) -> dict[str, Any] | None:
    """The plan once every probing cell has reported (or died): the rung by
    :func:`choose_length`, the steps it takes and the validation and checkpoint intervals;
    None while a probe is still running."""
    rates = {}
    for key in probing:
        if not (work / key / PROBE).exists():
            return None
        rates[key] = json.loads((work / key / PROBE).read_text())["target_tokens_per_s"]
    seconds = times["stop_training"] - time.time()
    waves = math.ceil(len(keys) / grid["parallel"])
    inputs = {"rates": rates, "seconds": seconds, "waves": waves}
    decision = choose_length(**inputs, ladder=grid["ladder"], safety=grid["safety"])
    steps = steps_for(decision["rung"], means)
    return {
        "rule": {"ladder": grid["ladder"], "safety": grid["safety"]},
        "inputs": inputs,
        "decision": decision,
        "train": {
            "max_steps": steps,
            "validate_every": max(1, steps // grid["validations"]),
            "checkpoint_every": max(1, math.ceil(steps / grid["checkpoints"])),
        },
        "batch_target_tokens": dict(means),
        "planned_target_tokens": {c: steps * m for c, m in means.items()},
    }


class Grid:
    """The parent: starts the cells, decides the length, watches the deadline, packs."""

    def __init__(self, settings: dict, data: Path, out: Path, work: Path, device: str) -> None:
        self.settings, self.data, self.device = settings, data, device
        self.out, self.work = out, work
        self.keys = cell_keys(settings["nmt"])
        self.running: dict[str, multiprocessing.process.BaseProcess] = {}
        self.started: set[str] = set()
        self.exitcodes: dict[str, int | None] = {}
        self.manifest: dict[str, Any] = {}
        self.clock = time.monotonic()

    def update(self) -> None:
        """The manifest's cells, length and wall time brought up to date; both files packed."""
        cells = {}
        for key in self.keys:
            cells[key] = status_of(self.work, key, self.exitcodes.get(key))
            if key not in self.started and cells[key]["status"] != "finished":
                cells[key]["status"] = "not started before the deadline"
        self.manifest["cells"] = cells
        self.manifest["length"] = _read(self.work / PLAN)
        self.manifest["wall_s"] = time.monotonic() - self.clock
        pack(self.out, self.work, self.keys, self.manifest)

    def stop_all(self) -> None:
        for process in self.running.values():
            process.terminate()
        for key, process in self.running.items():
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
            self.exitcodes[key] = None if process.exitcode in (-15, -9) else process.exitcode
        self.running.clear()

    def run(self, times: dict[str, float], kernels: dict[str, Any]) -> dict[str, Any]:
        """Every cell, ``gpu_grid.parallel`` at a time, the length decided once the first
        cells' probes are in, until done or the deadline."""
        grid = self.settings["gpu_grid"]
        means = batch_target_tokens(self.settings, self.data)
        stamp_file = self.data / "commit.json"
        self.manifest.update(
            settings=self.settings,
            environment=environment(self.device),
            code=json.loads(stamp_file.read_text()) if stamp_file.exists() else None,
            started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            times=times,
            kernels=kernels,
            parallel=grid["parallel"],
        )
        self.work.mkdir(parents=True, exist_ok=True)
        plan_file = self.work / PLAN
        if kernels["kernels"] == "eager":
            os.environ.update(EAGER)  # the spawned cells inherit it
        context = multiprocessing.get_context("spawn")
        waiting = [k for k in self.keys if not (self.work / k / DONE).exists()]
        self.started.update(k for k in self.keys if k not in waiting)
        probing: list[str] = []  # cells started before the length was decided
        if plan_file.exists():
            log.info("length decided by an earlier call: %s", plan_file.read_text())
        while waiting or self.running:
            if not plan_file.exists() and probing:
                plan = decide(self.work, self.keys, probing, grid, means, times)
                if plan is not None:
                    partial = plan_file.with_suffix(".partial")
                    partial.write_text(json.dumps(plan, indent=1))
                    partial.replace(plan_file)
                    log.info("length: %s", json.dumps(plan["decision"]))
            for key, process in list(self.running.items()):
                if not process.is_alive():
                    del self.running[key]
                    self.exitcodes[key] = process.exitcode
                    if key in probing and not (self.work / key / PROBE).exists():
                        probing.remove(key)  # died before its probe: the others decide
                    at = time.time() - times["call_start"]
                    log.info("%s: exit %s at %.0f s", key, process.exitcode, at)
                    self.update()
            if time.time() >= times["deadline"]:
                log.info("deadline: stopping %s", sorted(self.running))
                self.stop_all()
                break
            while waiting and len(self.running) < grid["parallel"]:
                key = waiting.pop(0)
                process = context.Process(
                    target=run_cell,
                    args=(key, self.settings, self.data, self.work, self.device, times),
                )
                process.start()
                self.running[key] = process
                self.started.add(key)
                if not plan_file.exists():
                    probing.append(key)
            time.sleep(POLL_S)
        self.update()
        return self.manifest


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def deadlines(call_start: float, limit_s: float, grid: Mapping[str, float]) -> dict[str, float]:
    """Wall-clock times (``time.time()``): the call's end less ``margin_s`` (``deadline``: every
    process stopped, the output packed), and ``eval_reserve_s`` before it (``stop_training``)."""
    deadline = call_start + limit_s - grid["margin_s"]
    return {
        "call_start": call_start,
        "limit_s": limit_s,
        "deadline": deadline,
        "stop_training": deadline - grid["eval_reserve_s"],
    }


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
    parser.add_argument(
        "--limit-s", type=float, default=560.0, help="the call's limit (the run's timeout_s)"
    )
    parser.add_argument(
        "--call-start",
        type=float,
        default=float(os.environ.get("CALL_START", time.time())),
        help="when the call began (epoch seconds; default $CALL_START, else now)",
    )
    parser.add_argument("--preflight", default=PREFLIGHT_TESTS, help="the preflight's tests")
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
    times = deadlines(args.call_start, args.limit_s, settings["gpu_grid"])
    if times["stop_training"] <= time.time():
        parser.error(f"--limit-s {args.limit_s} leaves no time to train: {times}")
    args.out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(args.out / "log.txt")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logging.getLogger().addHandler(handler)
    grid = Grid(settings, args.data, args.out, args.work, args.device)

    def on_term(signum: int, _frame: Any) -> None:  # the device tool's kill: keep what is there
        log.info("signal %d: stopping the cells and packing", signum)
        grid.stop_all()
        grid.update()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    precision = settings["nmt"]["train"]["precision"]
    start = time.monotonic()
    warming = start_prewarm(args.device, precision, max(1, (os.cpu_count() or 2) - 2))
    kernels = preflight(args.device, args.out, settings["gpu_grid"]["preflight_s"], args.preflight)
    log.info("preflight: %s; cells run the %s kernels", kernels.get("passed"), kernels["kernels"])
    for process in warming:
        process.join(max(0.0, times["stop_training"] - time.time()))
        if process.is_alive():
            process.terminate()
    kernels["prewarm"] = {
        "seconds": time.monotonic() - start,
        "exitcodes": [process.exitcode for process in warming],
    }
    manifest = grid.run(times, kernels)
    statuses = [cell["status"] for cell in manifest["cells"].values()]
    log.info("%d of %d cells finished", statuses.count("finished"), len(statuses))
    return 0 if statuses and all(s == "finished" for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
