"""DVC stage ``claims``: every qualitative claim of the four works, checked on this run's results.

Reads what the NMT, speed, head-analysis, latent-variable and APE stages wrote, gathers it per seed
(``learnable_sparsity.claims.Results``) and gives each claim of
``learnable_sparsity/claims/claims.yaml`` a verdict — reproduced, not reproduced, not measurable in
this profile — with its evidence.

Outputs: ``results/claims/claims.json`` (every verdict with its numbers), ``results.json`` (the
gathered results themselves, ``learnable_sparsity.claims.results_to_json``: what an evidence record
keeps so that later checks can judge it again), ``metrics.json`` (DVC metrics: how many claims have
each verdict), ``reports/claims.md`` (the table the report opens with) and
``reports/figures/claims/alpha_histograms.png`` (the learned α the bimodality claim reads, pooled
over layers and seeds).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from learnable_sparsity.analysis.figures import alpha_histograms
from learnable_sparsity.claims import evaluate, results_to_json
from learnable_sparsity.claims.report import claims_markdown, claims_record, counts
from learnable_sparsity.errors import LearnableSparsityError
from pipelines.claims_inputs import gather
from pipelines.scaffold import layout
from pipelines.scaffold.files import read_json
from pipelines.scaffold.stage import Stage, run_stage

STAGE = "claims"
RESULTS = layout.results(STAGE)


def check_inputs(
    alphas: Path = layout.ALPHA_TRAJECTORIES, histories: Path = layout.NMT_HISTORIES
) -> None:
    """Inputs that are there but hold nothing (a stage cut short, a file emptied by hand) are
    refused before any output is rewritten: judged, they would turn every claim that reads them
    into "not measurable" as if the stage had not run. An absent input is the profile's choice
    (the claims that read it are not measurable)."""
    if alphas.exists():
        data = read_json(alphas)
        if not isinstance(data, Mapping) or not data:
            raise LearnableSparsityError(
                f"{alphas} holds no α trajectory (an empty or non-mapping {type(data).__name__}):"
                " rerun the stage that writes it (`dvc repro -f train_nmt`), or remove it"
            )
    if histories.is_dir() and not any(histories.rglob("history.json")):
        raise LearnableSparsityError(
            f"{histories} holds no cell's history.json: rerun the stage that writes it "
            "(`dvc repro -f train_nmt`), or remove the folder"
        )


def main(stage: Stage) -> None:
    check_inputs()
    results, alphas_per_block = gather()
    verdicts = evaluate(results)
    stage.write_json(RESULTS / "results.json", results_to_json(results), artifact="")
    record = claims_record(verdicts, stage.profile, results)
    stage.write_json(layout.CLAIMS_VERDICTS, record, artifact="")
    stage.write_metrics(counts(verdicts))
    report = claims_markdown(verdicts, stage.profile, results)
    stage.write_text(layout.CLAIMS_REPORT, report, artifact="")
    if alphas_per_block:
        figure = alpha_histograms(alphas_per_block)
        stage.write_png(layout.FIGURES / "claims" / "alpha_histograms.png", figure, artifact="")


if __name__ == "__main__":
    run_stage(STAGE, main)
