"""The claims stage's inputs: a run's :class:`~learnable_sparsity.claims.Results`, gathered from
what the NMT, speed, head-analysis, latent-variable and APE stages wrote (through the typed loaders
of
:mod:`pipelines.verdicts.results`), per seed. A result file that is missing is named in
``Results.missing``: the checks that read it say "not measurable" and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from learnable_sparsity.analysis.blocks import split_block
from learnable_sparsity.claims import Results
from pipelines.lvm_experiments import LVM
from pipelines.scaffold import layout
from pipelines.scaffold.metrics import split_seed
from pipelines.verdicts.results import (
    HeadSummary,
    load_alpha_trajectories,
    load_ape_scores,
    load_ape_valid_nll,
    load_bleu,
    load_heads,
    load_lvm_curves,
    load_lvm_results,
    load_speed_rounds,
    load_target_tokens,
    load_valid_nll,
)


def _absent(results: Results, name: str, *files: Path) -> bool:
    """Whether a result file is missing (then named in ``results.missing[name]``)."""
    missing = [path for path in files if not path.exists()]
    if missing:
        results.missing[name] = f"{missing[0]} not found"
    return bool(missing)


def _add(table: dict, *keys: str, value: Any) -> None:
    """Append ``value`` to the list at ``table[k1][k2]…``, creating what is missing."""
    for key in keys[:-1]:
        table = table.setdefault(key, {})
    table.setdefault(keys[-1], []).append(value)


def nmt_results(
    results: Results, bleu: Path = layout.BLEU, histories: Path = layout.NMT_HISTORIES
) -> None:
    """BLEU and validation NLL curves of every corpus, variant and seed (from the stages' files,
    or a kept GPU run's files of the same form)."""
    if _absent(results, "bleu", bleu):
        return
    for cell, scores in sorted(load_bleu(bleu).cells.items()):
        _add(results.bleu, cell.corpus, cell.variant, value=scores["bleu"])
    for cell, curve in sorted(load_valid_nll(histories).items()):
        _add(results.valid_nll, cell.corpus, cell.variant, value=curve)
    for cell, tokens in sorted(load_target_tokens(histories).items()):
        _add(results.target_tokens, cell.corpus, cell.variant, value=tokens)


def speed_results(results: Results) -> None:
    """The ratio to softmax's tokens/s of every variant, in each round and phase."""
    if not _absent(results, "speed", layout.SPEED_ROUNDS):
        for row in load_speed_rounds()["rows"]:
            results.speed[row["variant"]] = row["ratio_to_softmax_each_round"]


def _role_confidence(summary: HeadSummary) -> dict[str, float | None]:
    """Role → the confidence of the cell's strongest head for it (None: not measurable)."""
    best = summary["best_heads"]
    return {
        role: best[role]["confidence"] if found["measurable"] and role in best else None
        for role, found in summary["roles"].items()
    }


def _density(summary: HeadSummary) -> dict[str, list[float | None]]:
    """Every head's mean density and its spread between inputs of one length, over the blocks
    in order (an undefined spread is None)."""
    within = summary["density_within_length_sd"]
    return {
        "heads": [d for heads in summary["head_density"].values() for d in heads],
        "within_length_sd": [
            sd
            for block, heads in summary["head_density"].items()
            for sd in (within[block] or [None] * len(heads))
        ],
    }


def head_results(
    results: Results, heads: Path = layout.HEADS, alphas: Path = layout.ALPHA_TRAJECTORIES
) -> dict[str, list[float]]:
    """Fills the head results; returns the final α per block, pooled over seeds (the figure)."""
    if not _absent(results, "heads", heads):
        for cell, summary in sorted(load_heads(heads).items()):
            variant = cell.variant
            _add(results.js, variant, value=summary["js"])
            for role, found in summary["roles"].items():
                count = found["count"] if found["measurable"] else None
                _add(results.roles, variant, role, value=count)
            for role, confidence in _role_confidence(summary).items():
                _add(results.role_confidence, variant, role, value=confidence)
            if "head_density" in summary:
                _add(results.density, variant, value=_density(summary))
            else:
                results.missing["density"] = f"{heads} has no per-head densities"
    if _absent(results, "alphas", alphas):
        return {}
    per_block: dict[str, list[float]] = {}
    for _, trajectory in sorted(load_alpha_trajectories(alphas).items()):
        results.alpha_trajectories.append(
            [
                (entry["step"], [a for v in entry["alphas"].values() for a in v])
                for entry in trajectory
            ]
        )
        for block, values in trajectory[-1]["alphas"].items():
            per_block.setdefault(block, []).extend(values)
            results.final_alphas.setdefault(split_block(block)[0], []).extend(values)
    return per_block


def lvm_results(results: Results) -> None:
    """Test metrics, training-loss and decoder-calls curves of every experiment, method and
    seed."""
    for name in LVM:
        curves = ("loss", "decoder_calls")
        files = [layout.lvm_results(name), *(layout.lvm_curves(name, c) for c in curves)]
        if _absent(results, name, *files):
            continue
        results.lvm[name] = load_lvm_results(name)["methods"]
        for curve, table in zip(curves, (results.lvm_curves, results.lvm_calls), strict=True):
            by_method = load_lvm_curves(name, curve)
            if by_method:
                table[name] = by_method


def ape_results(results: Results) -> None:
    """TER and tokenized BLEU per split of every APE cell (per seed), the do-nothing scores and
    the validation curves, keyed by "<regime>/<system>"."""
    if _absent(results, "ape", layout.APE_SCORES):
        return
    scores = load_ape_scores()
    for key, splits in sorted(scores["cells"].items(), key=lambda item: split_seed(item[0])):
        for split, metrics in splits.items():
            _add(results.ape, key.rsplit("/", 1)[0], split, value=metrics["ter"])
            _add(results.ape_bleu, key.rsplit("/", 1)[0], split, value=metrics["tokenized_bleu"])
    results.ape_do_nothing.update({s: m["ter"] for s, m in scores["do_nothing"].items()})
    results.ape_do_nothing_bleu.update(
        {s: m["tokenized_bleu"] for s, m in scores["do_nothing"].items()}
    )
    if layout.APE_VALID_NLL.exists():
        results.ape_valid_nll.update(load_ape_valid_nll())


def gather() -> tuple[Results, dict[str, list[float]]]:
    """This run's results, and the final α per block pooled over seeds (the figure)."""
    results = Results()
    nmt_results(results)
    speed_results(results)
    alphas_per_block = head_results(results)
    lvm_results(results)
    ape_results(results)
    return results, alphas_per_block
