"""The results one stage writes and another reads: one typed loader per file of :mod:`layout`.

The claims and tables stages read the NMT, speed, head-analysis, latent-variable and APE results
only through these loaders, so that a file's shape is written down once (the ``TypedDict`` the
writer fills) and its cells come back already keyed: NMT results by :class:`NmtCell`, in the
file's order; curves per method or system, in seed order. A loader reads the file at the path
``layout`` names (a missing file raises :class:`FileNotFoundError`; the claims stage names it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from learnable_sparsity.nmt.cells import NmtCell
from pipelines.scaffold import layout
from pipelines.scaffold.files import read_json
from pipelines.scaffold.metrics import split_seed
from pipelines.scaffold.plots import read_curves

Curve = list[tuple[float, float]]


class BleuScores(TypedDict):
    """One NMT cell's test scores (``evaluate_nmt``)."""

    bleu: float
    tokenized_bleu: float
    chrf: float
    empty_hypotheses: int


@dataclass(frozen=True)
class Bleu:
    """``results/evaluate_nmt/bleu.json``: every cell's scores, in the file's order, and the
    signatures of the metrics."""

    cells: dict[NmtCell, BleuScores]
    signatures: dict[str, str]


class SpeedRounds(TypedDict):
    """``results/speed/rounds.json``: per variant (``rows``) every round's tokens/s and ratio to
    softmax, per phase, with the median ratio, its quartiles and the noisy flag, in float32; per
    precision of ``speed.precisions`` (``precisions``, absent in files of older runs) its rows,
    with each variant's ratio to float32, or why the device does not run it."""

    device: str
    threads: int
    fused_kernels: bool
    corpus: str
    rounds: int
    seed: int
    rows: list[dict[str, Any]]
    precisions: NotRequired[dict[str, dict[str, Any]]]


class HeadSummary(TypedDict):
    """One NMT cell's head analysis (``analyze_heads``): JS per block, role counts and the
    strongest head per role, head densities (absent in results of older runs)."""

    js: dict[str, float | None]
    roles: dict[str, dict[str, Any]]
    best_heads: dict[str, dict[str, Any]]
    head_density: NotRequired[dict[str, list[float]]]
    density_within_length_sd: NotRequired[dict[str, list[float | None] | None]]


class AlphaEntry(TypedDict):
    """The learned α of every α-entmax head of each block at one logged step."""

    step: float
    alphas: dict[str, list[float]]


class LvmResults(TypedDict):
    """``results/train_lvm/<experiment>.json``: per method, one test-metric dict per seed."""

    experiment: str
    data: str
    profile: str
    methods: dict[str, list[dict[str, float]]]


class ApeScores(TypedDict):
    """``results/evaluate_ape/scores.json``: per cell ("<regime>/<system>/seed<k>") and split the
    TER and BLEU, the do-nothing baseline's (the MT output as is) per split, the signatures."""

    data: str
    cells: dict[str, dict[str, dict[str, float]]]
    do_nothing: dict[str, dict[str, float]]
    signatures: dict[str, str]


LvmCurve = Literal["loss", "decoder_calls"]


def _by_cell(items: dict[str, Any]) -> dict[NmtCell, Any]:
    return {NmtCell.from_key(key): value for key, value in items.items()}


def load_bleu(path: Path = layout.BLEU) -> Bleu:
    """Every NMT cell's test scores and the metrics' signatures."""
    bleu = read_json(path)
    return Bleu(_by_cell(bleu["cells"]), bleu["signatures"])


def load_valid_nll(folder: Path = layout.NMT_HISTORIES) -> dict[NmtCell, Curve]:
    """Every NMT cell's validation NLL curve (step, nll) from its ``history.json``."""
    files = {str(f.parent.relative_to(folder)): f for f in folder.glob("*/*/*/history.json")}
    return {
        cell: [(row["step"], row["valid_nll"]) for row in read_json(file)["valid"]]
        for cell, file in _by_cell(files).items()
    }


def load_target_tokens(folder: Path = layout.NMT_HISTORIES) -> dict[NmtCell, float]:
    """Every NMT cell's target tokens trained (its ``history.json``'s last training record)."""
    files = {str(f.parent.relative_to(folder)): f for f in folder.glob("*/*/*/history.json")}
    return {
        cell: read_json(file)["train"][-1]["target_tokens"]
        for cell, file in _by_cell(files).items()
    }


def load_alpha_trajectories(
    path: Path = layout.ALPHA_TRAJECTORIES,
) -> dict[NmtCell, list[AlphaEntry]]:
    """Every α-entmax cell's α trajectory, as training logged it."""
    return _by_cell(read_json(path))


def load_speed_rounds(path: Path = layout.SPEED_ROUNDS) -> SpeedRounds:
    """The speed stage's measurement."""
    return read_json(path)


def load_heads(path: Path = layout.HEADS) -> dict[NmtCell, HeadSummary]:
    """Every NMT cell's head analysis, in the file's order."""
    return _by_cell(read_json(path))


def load_lvm_results(experiment: str) -> LvmResults:
    """The test metrics of every method and seed of ``experiment``."""
    return read_json(layout.lvm_results(experiment))


def load_lvm_curves(experiment: str, curve: LvmCurve) -> dict[str, list[Curve]]:
    """Method → the ``curve`` of each of its cells, in the cells' order (the bit-vector VAE's
    cells of every D in one list: the method without its D)."""
    runs = {
        run: (series.rpartition("/")[2], points)
        for series, by_run in read_curves(layout.lvm_curves(experiment, curve), curve).items()
        for run, points in by_run.items()
    }
    curves: dict[str, list[Curve]] = {}
    for _, (method, points) in sorted(runs.items()):
        curves.setdefault(method, []).append(points)
    return curves


def load_ape_scores(path: Path = layout.APE_SCORES) -> ApeScores:
    """Every APE cell's scores per split and the do-nothing baseline's."""
    return read_json(path)


def load_ape_valid_nll(path: Path = layout.APE_VALID_NLL) -> dict[str, list[Curve]]:
    """ "<regime>/<system>" → the validation NLL curve of each seed, in seed order."""
    return {
        system: [curve for _, curve in sorted(by_run.items(), key=lambda run: split_seed(run[0]))]
        for system, by_run in read_curves(path, "valid_nll").items()
    }
