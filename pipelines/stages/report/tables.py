"""DVC stage ``tables``: every reproduced number beside the publication's, and the report index.

Reads the metrics the other stages wrote (BLEU, speed, head analysis, latent-variable results),
builds the comparison tables of ``learnable_sparsity.reporting`` (labelled with the profile and the
data; results of the smoke and ci profiles are marked as not comparable to the publications) and
writes ``reports/tables/<name>.{md,csv,tex}``, ``reports/tables.md`` (all tables) and
``reports/index.md`` (first the claims matrix of this run and the kept records,
``pipelines.verdicts.matrix``, then the claims stage's verdicts, every table and figure; relative
links only: no CDN needed).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from learnable_sparsity.reporting.ape_tables import ape_ablation_table, ape_results_table
from learnable_sparsity.reporting.lvm_tables import lvm_table
from learnable_sparsity.reporting.nmt_tables import (
    ast_bleu_table,
    head_summary_table,
    speed_comparison_table,
)
from learnable_sparsity.reporting.render import render_report, table_files, to_markdown
from learnable_sparsity.reporting.table import ComparisonTable
from pipelines.lvm_experiments import LVM
from pipelines.scaffold import layout
from pipelines.scaffold.stage import Stage, run_stage
from pipelines.verdicts.matrix import HEADING, matrix_markdown
from pipelines.verdicts.results import (
    load_ape_scores,
    load_bleu,
    load_heads,
    load_lvm_results,
    load_speed_rounds,
)

log = logging.getLogger(__name__)


def bleu_tables(profile: str) -> list[ComparisonTable]:
    """The AST BLEU table per corpus (tokenized BLEU and empty hypotheses of every seed)."""
    bleu = load_bleu()
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    empty: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for cell, result in bleu.cells.items():
        scores[cell.corpus][cell.variant].append(result["tokenized_bleu"])
        empty[cell.corpus][cell.variant].append(result["empty_hypotheses"])
    signature = bleu.signatures["tokenized_bleu"]
    return [
        ast_bleu_table(v, profile, corpus, signature, empty[corpus]) for corpus, v in scores.items()
    ]


def speed_table(profile: str) -> ComparisonTable:
    """The speed table in EST Table 4 layout: every round's tokens/s and ratio to softmax, with
    the median ratio, its interquartile range over the rounds and the noisy flag."""
    speed = load_speed_rounds()
    rounds = [
        {
            "variant": row["variant"],
            **{
                f"{phase}_{name}": row[each][phase][index]
                for phase in ("train", "inference")
                for name, each in (
                    ("tokens_per_second", "tokens_per_second_each_round"),
                    ("ratio_to_softmax", "ratio_to_softmax_each_round"),
                )
            },
        }
        for row in speed["rows"]
        for index in range(speed["rounds"])
    ]
    spreads = {
        row["variant"]: {
            phase: {
                "ratio": row[f"{phase}_ratio_to_softmax"],
                "ratio_quartiles": row[f"{phase}_ratio_quartiles"],
                "noisy": row[f"{phase}_noisy"],
            }
            for phase in ("train", "inference")
            if f"{phase}_ratio_quartiles" in row  # absent in rounds.json of older runs
        }
        for row in speed["rows"]
    }
    device = f"{speed['device']}, {speed['threads']} threads"
    return speed_comparison_table(
        rounds, profile, device, speed["corpus"], spreads, fused_kernels=speed["fused_kernels"]
    )


def head_tables(profile: str) -> list[ComparisonTable]:
    """Head diversity (JS) per block and head-role counts (per seed, with the strongest head
    where none passes), per corpus."""
    heads = load_heads()
    tables = []
    for corpus in sorted({cell.corpus for cell in heads}):
        js: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        roles: dict[str, list[dict]] = defaultdict(list)
        best: dict[str, list[dict]] = defaultdict(list)
        for cell, summary in heads.items():
            if cell.corpus != corpus:
                continue
            variant = cell.variant
            for block, value in summary["js"].items():
                if value is not None:
                    js[variant][block].append(value)
            roles[variant].append(summary["roles"])
            best[variant].append(summary["best_heads"])
        tables += head_summary_table(js, roles, best, profile, corpus)
    return tables


def lvm_tables(profile: str) -> list[ComparisonTable]:
    """One table per latent-variable experiment (thesis Tables 5.1–5.3)."""
    tables = []
    for name, experiment in LVM.items():
        results = load_lvm_results(name)
        tables.append(
            lvm_table(name, experiment.table, results["methods"], profile, results["data"])
        )
    return tables


def ape_tables(profile: str) -> list[ComparisonTable]:
    """Thesis Table 3.1 on the dev split and Table 3.2 on the test splits."""
    scores = load_ape_scores()
    signatures = list(scores["signatures"].values())
    args = (scores["cells"], scores["do_nothing"], profile, scores["data"], signatures)
    tests = [split for split in scores["do_nothing"] if split.startswith("test")]
    tables = [ape_ablation_table(*args)] if "valid" in scores["do_nothing"] else []
    return tables + ([ape_results_table(*args, tests)] if tests else [])


def main(stage: Stage) -> None:
    profile = stage.profile
    tables = [*bleu_tables(profile), speed_table(profile), *head_tables(profile)]
    tables += lvm_tables(profile) + ape_tables(profile)
    for table in tables:
        for relative, text in table_files(table).items():
            stage.write_text(layout.REPORTS / relative, text)
    header = f"# Reproduced vs published ({profile} profile)\n\n"
    stage.write_text(layout.TABLES_INDEX, header + "\n".join(to_markdown(t) for t in tables))
    figures = [
        (
            str(path.relative_to(layout.FIGURES).with_suffix("")),
            str(path.relative_to(layout.REPORTS)),
        )
        for path in sorted(layout.FIGURES.rglob("*.png"))
    ]
    matrix = f"{HEADING}\n\n{matrix_markdown(layout.REPORT_INDEX.parent)}\n"
    claims = matrix + layout.CLAIMS_REPORT.read_text("utf-8")
    stage.write_text(layout.REPORT_INDEX, render_report(tables, figures, claims))
    log.info("%d tables, %d figures", len(tables), len(figures))


if __name__ == "__main__":
    run_stage("tables", main)
