"""Every path of every stage, relative to the repository root (the stages' working directory).

A stage finds what another stage wrote here, never by importing that stage; ``dvc.yaml``
declares the same paths as the stages' ``deps`` and ``outs``.
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
# A kept evidence record, reports/<record>/ (python -m pipelines.record): the report of one run,
# the results its claims read (RECORD_RESULTS) and where they came from (RECORD_META); stage
# rejudge@<record> judges them again with today's checks (RECORD_CLAIMS_*).
RECORD_RESULTS = "results.json"
RECORD_META = "record.json"
RECORD_CLAIMS_REPORT = "claims.md"
RECORD_CLAIMS = "claims.json"


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


def record(name: str) -> Path:
    """``reports/<name>``: a kept evidence record."""
    return REPORTS / name


def figures(kind: str) -> Path:
    """``reports/figures/<kind>``: PNG figures (heads, lvm/<experiment>)."""
    return FIGURES / kind
