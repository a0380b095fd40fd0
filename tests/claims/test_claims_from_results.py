"""``python -m pipelines.stages.report.claims --from-results``: the claims stage's verdicts again
from its own gathered ``results.json``, in a checkout without the upstream stages' outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learnable_sparsity.claims import Results, results_to_json
from learnable_sparsity.files import atomic_write_text
from pipelines.scaffold import layout
from pipelines.scaffold.files import write_json
from pipelines.stages.report import claims


class _Files:
    """The part of a Stage that the claims stage's judging uses, without an MLflow run."""

    profile = "smoke"

    def write_json(self, path: Path, data: object, artifact: str | None = None) -> None:
        write_json(path, data)

    def write_text(self, path: Path, text: str, artifact: str | None = None) -> None:
        atomic_write_text(path, text)


def test_the_verdicts_come_again_from_the_gathered_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    results = Results(speed={"topk": {"train": [0.99] * 5, "inference": [0.96] * 5}})
    write_json(claims.RESULTS / "results.json", results_to_json(results))
    claims.from_results(_Files())  # type: ignore[arg-type]
    judged = json.loads(layout.CLAIMS_VERDICTS.read_text())
    verdicts = {claim["id"]: claim["status"] for claim in judged["claims"]}
    assert verdicts["est_topk_speed"] == "reproduced" and judged["profile"] == "smoke"
    metrics = json.loads(layout.metrics(claims.STAGE).read_text())
    assert metrics == judged["counts"]
    assert "est_topk_speed" in layout.CLAIMS_REPORT.read_text()
    assert not (claims.RESULTS / "from-results").exists()
