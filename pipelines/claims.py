"""DVC stage ``claims``: every qualitative claim of the four works, checked on this run's results.

Reads what the NMT, speed, head-analysis, latent-variable and APE stages wrote, gathers it per seed
(``components.claims.Results``) and gives each claim of ``components/claims/claims.yaml`` a
verdict — reproduced, not reproduced, not measurable in this profile — with its evidence.

Outputs: ``results/claims/claims.json`` (every verdict with its numbers), ``results.json`` (the
gathered results themselves, ``components.claims.results_to_json``: what an evidence record keeps
so that later checks can judge it again), ``metrics.json`` (DVC metrics: how many claims have each
verdict), ``reports/claims.md`` (the table the report opens with) and
``reports/figures/claims/alpha_histograms.png`` (the learned α the bimodality claim reads, pooled
over layers and seeds).
"""

from __future__ import annotations

from typing import Any

from components.analysis.blocks import split_block
from components.analysis.figures import alpha_histograms
from components.claims import Results, evaluate, results_to_json
from components.claims.report import claims_markdown, claims_record, counts
from components.nmt.cells import NmtCell
from pipelines.scaffold import layout
from pipelines.scaffold.metrics import split_seed
from pipelines.scaffold.plots import read_curves
from pipelines.scaffold.stage import Stage, read_json, run_stage

STAGE = "claims"
RESULTS = layout.results(STAGE)
LVM_EXPERIMENTS = ("ssvae", "signal_game", "bitvector_vae")


def _in_seed_order(items: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(corpus, variant, value) of items keyed by NMT cell, in seed order."""
    cells = sorted((NmtCell.from_key(key), value) for key, value in items.items())
    return [(cell.corpus, cell.variant, value) for cell, value in cells]


def _add(table: dict, *keys: str, value: Any) -> None:
    """Append ``value`` to the list at ``table[k1][k2]…``, creating what is missing."""
    for key in keys[:-1]:
        table = table.setdefault(key, {})
    table.setdefault(keys[-1], []).append(value)


def nmt_results(results: Results) -> None:
    bleu_file = layout.results("evaluate_nmt") / "bleu.json"
    if not bleu_file.exists():
        results.missing["bleu"] = f"{bleu_file} not found"
        return
    for corpus, variant, cell in _in_seed_order(read_json(bleu_file)["cells"]):
        _add(results.bleu, corpus, variant, value=cell["bleu"])
    cells = layout.results("train_nmt") / "cells"
    histories = {str(f.parent.relative_to(cells)): f for f in cells.glob("*/*/*/history.json")}
    for corpus, variant, history_file in _in_seed_order(histories):
        curve = [(row["step"], row["valid_nll"]) for row in read_json(history_file)["valid"]]
        _add(results.valid_nll, corpus, variant, value=curve)


def speed_results(results: Results) -> None:
    rounds_file = layout.results("speed") / "rounds.json"
    if not rounds_file.exists():
        results.missing["speed"] = f"{rounds_file} not found"
        return
    for row in read_json(rounds_file)["rows"]:
        results.speed[row["variant"]] = row["ratio_to_softmax_each_round"]


def _role_confidence(summary: dict) -> dict[str, float | None]:
    """Role → the confidence of the cell's strongest head for it (None: not measurable)."""
    best = summary["best_heads"]
    return {
        role: best[role]["confidence"] if found["measurable"] and role in best else None
        for role, found in summary["roles"].items()
    }


def _density(summary: dict) -> dict[str, list[float | None]]:
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


def head_results(results: Results) -> dict[str, list[float]]:
    """Fills the head results; returns the final α per block, pooled over seeds (the figure)."""
    heads_file = layout.results("analyze_heads") / "heads.json"
    if not heads_file.exists():
        results.missing["heads"] = f"{heads_file} not found"
    else:
        for _, variant, summary in _in_seed_order(read_json(heads_file)):
            _add(results.js, variant, value=summary["js"])
            for role, found in summary["roles"].items():
                count = found["count"] if found["measurable"] else None
                _add(results.roles, variant, role, value=count)
            for role, confidence in _role_confidence(summary).items():
                _add(results.role_confidence, variant, role, value=confidence)
            if "head_density" in summary:
                _add(results.density, variant, value=_density(summary))
            else:
                results.missing["density"] = f"{heads_file} has no per-head densities"
    trajectories = layout.results("train_nmt") / "alpha_trajectories.json"
    if not trajectories.exists():
        results.missing["alphas"] = f"{trajectories} not found"
        return {}
    per_block: dict[str, list[float]] = {}
    for _, _, trajectory in _in_seed_order(read_json(trajectories)):
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
    """Test metrics, training-loss and decoder-calls curves of every method and seed."""
    for experiment in LVM_EXPERIMENTS:
        folder = layout.results("train_lvm")
        files = {
            "results": folder / f"{experiment}.json",
            "loss": folder / experiment / "loss.csv",
            "decoder_calls": folder / experiment / "calls.csv",
        }
        missing = [path for path in files.values() if not path.exists()]
        if missing:
            results.missing[experiment] = f"{missing[0]} not found"
            continue
        results.lvm[experiment] = read_json(files["results"])["methods"]
        for curve, table in (("loss", results.lvm_curves), ("decoder_calls", results.lvm_calls)):
            runs = {
                run: (series.rpartition("/")[2], points)  # the method, without the bit-vector D
                for series, by_run in read_curves(files[curve], curve).items()
                for run, points in by_run.items()
            }
            for _, (method, points) in sorted(runs.items()):
                _add(table, experiment, method, value=points)


def ape_results(results: Results) -> None:
    """TER per split of every APE cell (per seed), the do-nothing TER and the validation
    curves, keyed by "<regime>/<system>"."""
    scores_file = layout.results("evaluate_ape") / "scores.json"
    curves_file = layout.results("train_ape") / "valid_nll.csv"
    if not scores_file.exists():
        results.missing["ape"] = f"{scores_file} not found"
        return
    scores = read_json(scores_file)
    for key, splits in sorted(scores["cells"].items(), key=lambda item: split_seed(item[0])):
        for split, metrics in splits.items():
            _add(results.ape, key.rsplit("/", 1)[0], split, value=metrics["ter"])
    results.ape_do_nothing.update({s: m["ter"] for s, m in scores["do_nothing"].items()})
    if curves_file.exists():
        for system, by_run in read_curves(curves_file, "valid_nll").items():
            for _, curve in sorted(by_run.items(), key=lambda item: split_seed(item[0])):
                _add(results.ape_valid_nll, system, value=curve)


def main(stage: Stage) -> None:
    results = Results()
    nmt_results(results)
    speed_results(results)
    alphas_per_block = head_results(results)
    lvm_results(results)
    ape_results(results)
    verdicts = evaluate(results)
    stage.write_json(RESULTS / "results.json", results_to_json(results), artifact="")
    record = claims_record(verdicts, stage.profile, results)
    stage.write_json(RESULTS / "claims.json", record, artifact="")
    stage.write_metrics(counts(verdicts))
    report = claims_markdown(verdicts, stage.profile, results)
    stage.write_text(layout.CLAIMS_REPORT, report, artifact="")
    if alphas_per_block:
        figure = alpha_histograms(alphas_per_block)
        stage.write_png(layout.FIGURES / "claims" / "alpha_histograms.png", figure, artifact="")


if __name__ == "__main__":
    run_stage(STAGE, main)
