"""The claims matrix's runs (the pipeline's own, then the kept records by the date they were
kept, links relative to the page) and the README block that ``python -m pipelines.verdicts.matrix``
rewrites."""

from __future__ import annotations

from pathlib import Path

import pytest

from learnable_sparsity.errors import LearnableSparsityError
from pipelines.scaffold.files import write_json
from pipelines.verdicts.matrix import END, START, matrix_columns, refresh_readme


def _verdicts(profile: str, status: str) -> dict:
    return {"profile": profile, "claims": [{"id": "est_topk_bleu", "status": status}]}


def _repository(root: Path) -> None:
    """The pipeline's run, two records kept in the opposite order of their names, a record not
    judged yet and a folder of reports/ that is no record."""
    write_json(root / "results/claims/claims.json", _verdicts("smoke", "not measurable"))
    for name, recorded, status in (
        ("bible", "2026-11-26T20:28:01+00:00", "not reproduced"),
        ("evidence", "2026-11-26T11:44:34+00:00", "reproduced"),
    ):
        write_json(root / f"reports/{name}/record.json", {"recorded": recorded})
        write_json(root / f"reports/{name}/claims.json", _verdicts(name, status))
    write_json(root / "reports/pending/record.json", {"recorded": "2026-11-27T00:00:00+00:00"})
    judged = _verdicts("evidence", "reproduced")
    judged["claims"][0]["numbers"] = {"sensitivity": {"flips": ["margin ×0.9 → not measurable"]}}
    judged["as_kept"] = {"changed": [{"claim": "est_topk_bleu", "kept": "not reproduced"}]}
    write_json(root / "reports/evidence/claims.json", judged)
    write_json(root / "reports/figures/claims.json", _verdicts("x", "reproduced"))


def test_the_runs_are_the_pipelines_then_the_kept_records_oldest_first(tmp_path: Path) -> None:
    _repository(tmp_path)
    columns = matrix_columns(Path("reports"), tmp_path)
    assert [(c.name, c.link) for c in columns] == [
        ("smoke", "claims.md"),
        ("evidence", "evidence/claims.md"),
        ("bible", "bible/claims.md"),
    ]
    assert [c.statuses["est_topk_bleu"] for c in columns] == [
        "not measurable",
        "reproduced",
        "not reproduced",
    ]
    # the evidence record's verdict is fragile, and was kept as "not reproduced"
    assert [(c.fragile, dict(c.kept)) for c in columns] == [
        (frozenset(), {}),
        (frozenset({"est_topk_bleu"}), {"est_topk_bleu": "not reproduced"}),
        (frozenset(), {}),
    ]


def test_the_readme_block_is_rewritten_and_nothing_else(tmp_path: Path) -> None:
    _repository(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nBefore.\n\n{START}\nstale\n{END}\n\nAfter.\n")
    assert refresh_readme(tmp_path)
    text = readme.read_text()
    assert text.startswith(f"# Title\n\nBefore.\n\n{START}\n\n") and text.endswith(
        f"\n\n{END}\n\nAfter.\n"
    )
    assert "stale" not in text
    assert "| [smoke](reports/claims.md) | [evidence](reports/evidence/claims.md) |" in text
    assert "[≈ ✓ reproduced](reports/evidence/claims.md#claim-est_topk_bleu) (kept ✗)" in text
    assert not refresh_readme(tmp_path)  # already current
    readme.write_text("# Title\n")
    with pytest.raises(LearnableSparsityError, match="no claims matrix block"):
        refresh_readme(tmp_path)
