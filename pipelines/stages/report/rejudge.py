"""DVC stages ``rejudge@<record>``: a kept evidence record judged again with today's checks.

``python -m pipelines.stages.report.rejudge <record>`` reads ``reports/<record>/results.json`` (the
results the claims of that run read, as the claims stage wrote them) and ``record.json`` (where they
came from: profile, date, commit, the thresholds they were judged with when kept), gives every claim
of today's ``claims.yaml`` its verdict, and writes ``reports/<record>/claims.json`` and
``claims.md``. The verdicts a record shows are therefore always those of the current checks:
changing a check or a threshold reruns this stage. A threshold that differs from the one the record
was kept with is named in the report, with whether its history in ``claims.yaml`` accounts for the
change. The verdicts the record was kept with (``claims_as_kept.json``, written at its first
judgement and never rewritten) are shown beside today's where they differ, with the claim's
thresholds and the rules fixed since: a rule changed after a record was kept applies to it beside
its verdict as kept, never in its place. The command then rewrites the claims matrix of
``README.md`` (:mod:`pipelines.verdicts.matrix`) with the record's new verdicts."""

from __future__ import annotations

import argparse
import datetime
from dataclasses import asdict
from pathlib import Path
from typing import Any

from learnable_sparsity.claims import ClaimResult, evaluate, load_claims, results_from_json
from learnable_sparsity.claims.checks import registry
from learnable_sparsity.claims.preregistered import rules_fixed_since, threshold_changes
from learnable_sparsity.claims.report import (
    claims_markdown,
    claims_record,
    kept_markdown,
    kept_verdicts,
)
from learnable_sparsity.errors import LearnableSparsityError
from pipelines.scaffold import layout
from pipelines.scaffold.cells import fingerprint
from pipelines.scaffold.files import file_digest, read_json
from pipelines.scaffold.imports import ROOT, code_digest
from pipelines.scaffold.stage import Stage, run_stage
from pipelines.verdicts.matrix import refresh_readme

CHECKS_ENTRY = "learnable_sparsity.claims.catalog"  # the checks, and all the code they run
CLAIMS_FILE = ROOT / "learnable_sparsity" / "claims" / "claims.yaml"
# The verdicts a record was kept with, frozen at its first judgement (the records kept before it
# existed: the claims.json committed with the record, taken from git).
AS_KEPT = "claims_as_kept.json"


def judged_by() -> dict[str, str]:
    """The checks that give the verdicts: a digest of their code and ``claims.yaml``. The
    verdicts are committed with the checks that gave them (a test holds them equal), so the
    commit that last changed a record's ``claims.json`` is the commit of its checks."""
    return {"checks_digest": fingerprint(code_digest(CHECKS_ENTRY), file_digest(CLAIMS_FILE))}


def main(stage: Stage, name: str) -> None:
    folder = layout.record(name)
    absent = [str(folder / f) for f in (layout.RECORD_META, layout.RECORD_RESULTS)]
    absent = [path for path in absent if not Path(path).is_file()]
    if absent:
        raise LearnableSparsityError(
            f"no evidence record {name!r}: {', '.join(absent)} missing (keep one with `python -m "
            f"pipelines.commands.record {name}`, or take {name} out of the foreach of stage "
            "rejudge)"
        )
    meta = read_json(folder / layout.RECORD_META)
    results = results_from_json(
        read_json(folder / layout.RECORD_RESULTS), str(folder / layout.RECORD_RESULTS)
    )
    kept_on = datetime.date.fromisoformat(meta["recorded"][:10])
    verdicts = evaluate(results)
    changes = threshold_changes(load_claims(), meta["thresholds"], kept_on)
    by = judged_by()
    note = (
        f"A kept record: the `{meta['profile']}` profile run at commit "
        f"`{str(meta['commit'])[:10]}` (kept {meta['recorded'][:10]}; `record.json`), judged "
        f"with today's checks (digest `{by['checks_digest']}`; their commit is the one that "
        f"last changed `{folder / layout.RECORD_CLAIMS}`)."
    )
    if changes:
        listed = "; ".join(change.describe() for change in changes)
        note += f" Thresholds changed since the record was kept: {listed}."
    record = claims_record(verdicts, meta["profile"], results, judged_by=by)
    record["threshold_changes"] = [asdict(change) for change in changes]
    kept = _as_kept(stage, folder, verdicts, by)
    kept_at = datetime.datetime.fromisoformat(kept["kept_with"]["judged_at"])
    statuses = {claim["id"]: claim["status"] for claim in kept["claims"]}
    changed = kept_verdicts(verdicts, statuses, kept_at)
    rules_since = rules_fixed_since(registry(), kept_at)
    record["as_kept"] = {
        "kept_with": kept["kept_with"],
        "rules_fixed_since": rules_since,
        "changed": [asdict(item) for item in changed],
    }
    stage.write_json(folder / layout.RECORD_CLAIMS, record, artifact="")
    report = claims_markdown(verdicts, meta["profile"], results, note=note)
    if changed:
        with_what = (
            f"by the checks of `{str(kept['kept_with']['commit'])[:10]}`, "
            f"{kept['kept_with']['judged_at'][:16]}: `{AS_KEPT}`"
        )
        report += kept_markdown(changed, rules_since, with_what)
    stage.write_text(folder / layout.RECORD_CLAIMS_REPORT, report, artifact="")


def _as_kept(
    stage: Stage, folder: Path, verdicts: list[ClaimResult], by: dict[str, str]
) -> dict[str, Any]:
    """The verdicts the record was kept with (``claims_as_kept.json``): written once, at its
    first judgement, and never again — a later rule shows beside them, not in their place."""
    path = folder / AS_KEPT
    if path.is_file():
        return read_json(path)
    kept = {
        "kept_with": {
            "commit": "the commit that adds this file",
            "judged_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "checks_digest": by["checks_digest"],
            "source": "pipelines.stages.report.rejudge, the record's first judgement",
        },
        "claims": [
            {"id": r.claim.id, "status": r.verdict.status, "evidence": r.verdict.evidence}
            for r in verdicts
        ],
    }
    stage.write_json(path, kept, artifact="")
    return kept


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", help="the record's folder under reports/")
    parser.add_argument("--verbose", action="store_true", help="tracebacks of errors")
    chosen = parser.parse_args().record
    run_stage(f"rejudge/{chosen}", lambda stage: main(stage, chosen))
    refresh_readme()
