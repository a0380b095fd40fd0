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

``python -m pipelines.stages.report.claims --from-results`` gives the verdicts again from this run's
gathered ``results/claims/results.json`` alone (the outputs above but ``results.json`` and the
figure): after a change of the checks, in a checkout that lacks the upstream stages' outputs (they
are git-ignored), without training anything. DVC then sees the claims stage's outputs changed: a
``dvc repro`` reruns it from the upstream outputs."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from learnable_sparsity.analysis.figures import alpha_histograms
from learnable_sparsity.claims import Results, evaluate, results_from_json, results_to_json
from learnable_sparsity.claims.report import claims_markdown, claims_record, counts
from learnable_sparsity.errors import LearnableSparsityError
from pipelines.scaffold import layout
from pipelines.scaffold.files import read_json
from pipelines.scaffold.metrics import check_scalar_metrics
from pipelines.scaffold.stage import Stage, run_stage
from pipelines.verdicts.inputs import gather

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


def _judge(stage: Stage, results: Results) -> None:
    """Every claim's verdict on ``results``: ``claims.json``, the metrics and ``claims.md``."""
    verdicts = evaluate(results)
    record = claims_record(verdicts, stage.profile, results)
    stage.write_json(layout.CLAIMS_VERDICTS, record, artifact="")
    tally = counts(verdicts)
    check_scalar_metrics(tally, STAGE)
    stage.write_json(layout.metrics(STAGE), tally, artifact="")  # the claims stage's, either way
    report = claims_markdown(verdicts, stage.profile, results)
    stage.write_text(layout.CLAIMS_REPORT, report, artifact="")


def main(stage: Stage) -> None:
    check_inputs()
    results, alphas_per_block = gather()
    stage.write_json(RESULTS / "results.json", results_to_json(results), artifact="")
    _judge(stage, results)
    if alphas_per_block:
        figure = alpha_histograms(alphas_per_block)
        stage.write_png(layout.FIGURES / "claims" / "alpha_histograms.png", figure, artifact="")


def from_results(stage: Stage) -> None:
    """The verdicts again from the gathered ``results.json`` of the last run of this stage."""
    source = RESULTS / "results.json"
    _judge(stage, results_from_json(read_json(source), str(source)))


if __name__ == "__main__":
    if "--from-results" in sys.argv[1:]:
        run_stage(
            f"{STAGE}/from-results",
            from_results,
            [a for a in sys.argv[1:] if a != "--from-results"],
        )
    else:
        run_stage(STAGE, main)
