"""Every path of every stage, relative to the repository root (the stages' working directory).

A stage finds what another stage wrote here, never by importing that stage; ``dvc.yaml``
declares the same paths as the stages' ``deps`` and ``outs``. The results one stage writes and
another reads are named once below (the writer writes to these names) and read through one typed
loader each, in :mod:`pipelines.verdicts.results`.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path("data")
MODELS = Path("models")
RESULTS = Path("results")
REPORTS = Path("reports")
FIGURES = REPORTS / "figures"

EXTERNAL = DATA / "external"  # the user's own input files (local corpora, EGG features): a dep
CORPORA = DATA / "corpora"  # stage corpora: <name>/<split>.{src,tgt} (APE: .{src,mt,pe}), meta.json
BPE = DATA / "bpe"  # stage bpe: <corpus>/bpe.model
IMAGES = DATA / "images"  # stage images: <name>.pt, meta.json
NMT_MODELS = MODELS / "nmt"  # stage train_nmt: <corpus>/<variant>/seed<k>/ (checkpoints)
LVM_MODELS = MODELS / "lvm"  # stages train_lvm@<experiment>: <experiment>/<cell>/
APE_DATA = DATA / "ape"  # stage synthetic_ape: <set>/<split>.{src,mt,pe}
BERT = MODELS / "bert"  # stage pretrain_bert: the BERT of the APE models (save_pretrained)
APE_MODELS = MODELS / "ape"  # stage train_ape: <regime>/<system>/seed<k>/ (checkpoints)

TABLES = REPORTS / "tables"  # stage tables: <name>.{md,csv,tex}
TABLES_INDEX = REPORTS / "tables.md"
REPORT_INDEX = REPORTS / "index.md"
CLAIMS_REPORT = REPORTS / "claims.md"  # stage claims: the verdicts, the report opens with them
CLAIMS_VERDICTS = RESULTS / "claims" / "claims.json"  # stage claims: every verdict, as data
# A kept evidence record, reports/<record>/ (python -m pipelines.commands.record): the report of
# one run, the results its claims read (RECORD_RESULTS) and where they came from (RECORD_META);
# stage rejudge@<record> judges them again with today's checks (RECORD_CLAIMS_*).
RECORD_RESULTS = "results.json"
RECORD_META = "record.json"
RECORD_CLAIMS_REPORT = "claims.md"
RECORD_CLAIMS = "claims.json"

# Results between stages (pipelines/verdicts/results.py loads each; dvc.yaml lists them as outs and
# deps).
NMT_HISTORIES = RESULTS / "train_nmt" / "cells"  # <corpus>/<variant>/seed<k>/history.json
ALPHA_TRAJECTORIES = RESULTS / "train_nmt" / "alpha_trajectories.json"
BLEU = RESULTS / "evaluate_nmt" / "bleu.json"
SPEED_ROUNDS = RESULTS / "speed" / "rounds.json"
HEADS = RESULTS / "analyze_heads" / "heads.json"
APE_SCORES = RESULTS / "evaluate_ape" / "scores.json"
APE_VALID_NLL = RESULTS / "train_ape" / "valid_nll.csv"


def corpus_dir(corpus: str) -> Path:
    return CORPORA / corpus


def bpe_model(corpus: str) -> Path:
    return BPE / corpus / "bpe.model"


def corpus_files(corpus: str, splits: tuple[str, ...]) -> tuple[Path, ...]:
    """The source and target files of ``splits`` of a prepared corpus."""
    return tuple(
        corpus_dir(corpus) / f"{split}.{side}" for split in splits for side in ("src", "tgt")
    )


def ape_data(name: str) -> Path:
    """A triplet set written by ``synthetic_ape``."""
    return APE_DATA / name


def image_data(name: str) -> Path:
    return IMAGES / f"{name}.pt"


def done(cell_directory: Path) -> Path:
    """A finished grid cell's record (fingerprint, result, MLflow run)."""
    return cell_directory / "done.json"


def results(stage: str) -> Path:
    """``results/<stage>``: the small JSON / CSV results of a stage (DVC metrics and plot data)."""
    return RESULTS / stage


def metrics(stage: str) -> Path:
    """``results/<stage>/metrics.json``: the stage's DVC metrics, a few numbers per method
    (``results/train_lvm/<experiment>/metrics.json`` for the stage ``train_lvm/<experiment>``)."""
    return RESULTS / stage / "metrics.json"


def cells(stage: str) -> Path:
    """``results/<stage>/cells``: one directory per grid cell of an evaluation stage."""
    return RESULTS / stage / "cells"


def nmt_history(key: str) -> Path:
    """The training curves and α trajectory of the NMT cell ``key`` (corpus/variant/seedN)."""
    return NMT_HISTORIES / key / "history.json"


def lvm_results(experiment: str) -> Path:
    """``results/train_lvm/<experiment>.json``: every method's test metrics, one dict per seed."""
    return RESULTS / "train_lvm" / f"{experiment}.json"


# The long CSVs of an LVM experiment's training curves: the curve (its column) → the file's stem.
LVM_CURVE_FILES = {"loss": "loss", "decoder_calls": "calls"}


def lvm_curves(experiment: str, curve: str) -> Path:
    """``results/train_lvm/<experiment>/<file>.csv``: a long CSV of every cell, for ``curve``
    ``loss`` or ``decoder_calls`` (:data:`LVM_CURVE_FILES`), or ``runs`` (each cell's test
    results)."""
    return RESULTS / "train_lvm" / experiment / f"{LVM_CURVE_FILES.get(curve, curve)}.csv"


def record(name: str) -> Path:
    """``reports/<name>``: a kept evidence record."""
    return REPORTS / name


def figures(kind: str) -> Path:
    """``reports/figures/<kind>``: PNG figures (heads, lvm/<experiment>)."""
    return FIGURES / kind
