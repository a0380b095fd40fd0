"""DVC stage ``tables``: every reproduced number beside the publication's, and the report index.

Reads the metrics the other stages wrote (BLEU, speed, head analysis, latent-variable results),
builds the comparison tables of ``components.reporting.tables`` (labelled with the profile and the
data; results of the smoke and ci profiles are marked as not comparable to the publications) and
writes ``reports/tables/<name>.{md,csv,tex}``, ``reports/tables.md`` (all tables) and
``reports/index.md`` (every table and figure, relative links only: no CDN needed).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

from components.data.atomic import atomic_write_text
from components.errors import LearnableSparsityError
from components.reporting.tables import (
    ComparisonTable,
    ast_bleu_table,
    head_summary_table,
    lvm_table,
    render_report,
    speed_comparison_table,
    table_files,
    to_markdown,
)
from pipelines.io import read_json
from pipelines.params import Params, load_params

REPORTS = Path("reports")
BLEU = Path("results/evaluate_nmt/bleu.json")
SPEED = Path("results/speed/speed.json")
HEADS = Path("results/analyze_heads")
LVM = Path("results/train_lvm")
LVM_EXPERIMENTS = ("ssvae", "signal_game", "bitvector_vae")
log = logging.getLogger(__name__)


def _read(path: Path) -> dict:
    if not path.exists():
        raise LearnableSparsityError(f"{path} is missing: run the stage that writes it first")
    return read_json(path)


def _cells(bleu: dict) -> dict[str, dict[str, dict[int, dict]]]:
    """{corpus: {variant: {seed: scores}}} from the cell keys "corpus/variant/seedN"."""
    out: dict[str, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for key, scores in bleu["cells"].items():
        corpus, variant, seed = key.split("/")
        out[corpus][variant][int(seed.removeprefix("seed"))] = scores
    return out


def nmt_tables(profile: str) -> list[ComparisonTable]:
    """The AST BLEU table per corpus, the speed table, and the head-analysis summaries."""
    bleu = _read(BLEU)
    tables = []
    for corpus, variants in _cells(bleu).items():
        scores = {v: [s["tokenized_bleu"] for s in seeds.values()] for v, seeds in variants.items()}
        signature = bleu["signatures"]["tokenized_bleu"]
        tables.append(ast_bleu_table(scores, profile, corpus, signature))

    speed = _read(SPEED)
    rounds = [
        {
            "variant": row["variant"],
            "train_tokens_per_second": train,
            "inference_tokens_per_second": inference,
        }
        for row in speed["rows"]
        for train, inference in zip(
            row["tokens_per_second_each_round"]["train"],
            row["tokens_per_second_each_round"]["inference"],
            strict=True,
        )
    ]
    device = f"{speed['device']}, {speed['threads']} threads"
    tables.append(speed_comparison_table(rounds, profile, device, speed["corpus"]))

    heads = _read(HEADS / "heads.json")
    for corpus in sorted({key.split("/")[0] for key in heads}):
        js: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        roles = []
        for key, summary in heads.items():
            cell_corpus, variant, _ = key.split("/")
            if cell_corpus != corpus:
                continue
            for block, value in summary["js"].items():
                if value is not None:
                    js[variant][block].append(value)
            analysis = _read(HEADS / "cells" / key / "analysis.json")
            roles += [{**role, "variant": variant} for role in analysis["roles"]]
        tables += head_summary_table(js, roles, profile, corpus)
    return tables


def lvm_tables(profile: str, params: Params) -> list[ComparisonTable]:
    """One table per latent-variable experiment whose results exist."""
    tables = []
    for experiment in LVM_EXPERIMENTS:
        path = LVM / f"{experiment}.json"
        if experiment not in params.get("lvm", dict):
            continue
        results = _read(path)
        tables.append(lvm_table(experiment, results["methods"], profile, results["data"]))
    return tables


def _figures() -> list[tuple[str, str]]:
    """Every PNG under reports/figures as (title, path relative to reports/)."""
    return [
        (str(path.relative_to(REPORTS / "figures").with_suffix("")), str(path.relative_to(REPORTS)))
        for path in sorted((REPORTS / "figures").rglob("*.png"))
    ]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params()
    profile = params.get("profile", str)
    tables = nmt_tables(profile) + lvm_tables(profile, params)
    for table in tables:
        for relative, text in table_files(table).items():
            atomic_write_text(REPORTS / relative, text)
    atomic_write_text(
        REPORTS / "tables.md",
        f"# Reproduced vs published ({profile} profile)\n\n"
        + "\n".join(to_markdown(table) for table in tables),
    )
    figures = _figures()
    atomic_write_text(REPORTS / "index.md", render_report(tables, figures))
    log.info("%d tables, %d figures", len(tables), len(figures))


if __name__ == "__main__":
    main()
