"""The claims as the report shows them: one Markdown table (claim, source, pre-registered
thresholds, verdict, evidence), the claims left out of scope with their reasons, a JSON-ready
record of every verdict, and the matrix of every claim's verdict in several runs (a row per claim,
a column per run, each verdict linked to the claim's row in that run's table)."""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from learnable_sparsity.claims.catalog import ClaimResult, out_of_scope
from learnable_sparsity.claims.checks import NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED
from learnable_sparsity.claims.nmt_checks import matched_nll_steps
from learnable_sparsity.claims.preregistered import (
    WORKS,
    Claim,
    OutOfScope,
    thresholds_fixed_since,
)
from learnable_sparsity.claims.results import Results
from learnable_sparsity.errors import LearnableSparsityError

STATUSES = (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)
# A verdict in the matrix: a mark that reads in plain text too, then its words.
MARKS = {REPRODUCED: "✓", NOT_REPRODUCED: "✗", NOT_MEASURABLE: "?"}
NOT_JUDGED = "—"  # a claim the run was judged without (it did not exist yet)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def claim_anchor(claim_id: str) -> str:
    """The HTML anchor of a claim's row in a claims table (``claims.md#claim-<id>``)."""
    return f"claim-{claim_id}"


def _jsonable(value: Any) -> Any:
    """Dates as ISO strings, everything else as it is (dataclasses already turned into dicts)."""
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return value


def counts(results: Sequence[ClaimResult]) -> dict[str, int]:
    """How many claims have each verdict (every status listed, 0 included), and how many claims
    of the seed documents are out of scope."""
    tally = Counter(result.verdict.status for result in results)
    return {
        **{status.replace(" ", "_"): tally[status] for status in STATUSES},
        "out_of_scope": len(out_of_scope()),
    }


def thresholds_text(claim: Claim) -> str:
    """The claim's pre-registered thresholds, one ``name = value unit (source)`` each with its
    earlier values; "—" for a claim decided by the statistics alone."""
    return "; ".join(t.describe(name) for name, t in claim.thresholds.items()) or "—"


def claims_record(
    results: Sequence[ClaimResult],
    profile: str,
    measured: Results,
    judged_by: Mapping[str, str] | None = None,
) -> dict[str, object]:
    """Every claim with its thresholds, verdict, evidence and numbers, the claims out of scope,
    the steps each NMT variant needed to reach softmax's final validation NLL and ``judged_by``
    (the code that gave the verdicts) — ``claims.json``."""
    return {
        "profile": profile,
        **({"judged_by": dict(judged_by)} if judged_by else {}),
        "counts": counts(results),
        "steps_to_softmax_valid_nll": matched_nll_steps(measured),
        "claims": [
            _jsonable({**asdict(result.claim), **asdict(result.verdict)}) for result in results
        ],
        "out_of_scope": [asdict(claim) for claim in out_of_scope()],
    }


def _matched_lines(measured: Results) -> list[str]:
    """A table per corpus: the steps each variant needed to reach softmax's final NLL."""
    lines = []
    for corpus, variants in matched_nll_steps(measured).items():
        lines += [
            "",
            f"Training length ({corpus}): the step at which each seed's validation NLL first "
            "reached softmax's final one (— never): where a variant needs more steps, a BLEU gap "
            "at equal steps is partly training length.",
            "",
            "| Variant | Steps, per seed |",
            "|---|---|",
        ]
        for variant, steps in variants.items():
            shown = ", ".join("—" if s is None else f"{s:g}" for s in steps)
            lines.append(f"| {variant} | {shown} |")
    return lines


def _out_of_scope_lines() -> list[str]:
    excluded = out_of_scope()
    if not excluded:
        return []
    lines = [
        "",
        f"Out of scope: {len(excluded)} claims of the publications that no check tests, and why.",
        "",
        "| Claim | Source | Why it is not checked |",
        "|---|---|---|",
    ]
    lines += [
        f"| {_cell(claim.text)} | {claim.work}: {_cell(claim.source)} | {_cell(claim.reason)} |"
        for claim in excluded
    ]
    return lines


def claims_markdown(
    results: Sequence[ClaimResult], profile: str, measured: Results, note: str = ""
) -> str:
    """The claims section of a report: a summary line (and ``note``, e.g. where a kept record
    came from), one row per claim with its pre-registered thresholds, the claims out of scope,
    then the training length each NMT variant needed to match softmax's validation NLL."""
    tally = counts(results)
    lines = [
        f"## The papers' claims, checked on these results ({profile} profile)",
        "",
        *([note, ""] if note else []),
        f"{tally['reproduced']} reproduced, {tally['not_reproduced']} not reproduced, "
        f"{tally['not_measurable']} not measurable in this profile, of {len(results)} claims "
        f"checked; {tally['out_of_scope']} more are out of scope (listed below, with why). "
        "Comparisons are decided by one-sided 95% confidence bounds over seeds (paired by seed "
        'where both methods ran the same seeds; mean ± sd over seeds): "as good as" by '
        'non-inferiority (the deficit\'s upper bound below the margin), "beats" by the bound of '
        "the difference beyond 0; a claim is one family (Holm over its refuting tests and over "
        "its gap gates). The thresholds are fixed before the run, each derived from the "
        "publication (`learnable_sparsity/claims/claims.yaml` gives its source, reason, the "
        "commit that fixed it and its earlier values, and the rules of the statistics). Each "
        "verdict ends with its edge (the statistic beside the threshold that decides it) and "
        "whether a ±10% move of a threshold or rule it uses flips it (FRAGILE). A claim is not "
        "measurable when training length would still decide it (one method still catching up "
        "with the other, α still moving, a run still improving "
        "or shorter than the claim's pre-registered length), when its runs collapsed or have "
        "too few seeds; a part that is not reproduced decides the claim whatever the other "
        "parts say.",
        "",
        "| Claim | Source | Thresholds (pre-registered) | Verdict | Evidence |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        claim, verdict = result.claim, result.verdict
        lines.append(
            f'| <a id="{claim_anchor(claim.id)}"></a>{_cell(claim.text)} | '
            f"{claim.work}: {_cell(claim.source)} | "
            f"{_cell(thresholds_text(claim))} | **{verdict.status}** | "
            f"{_cell(verdict.evidence)} |"
        )
    lines += _out_of_scope_lines()
    lines += _matched_lines(measured)
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class KeptVerdict:
    """A claim whose verdict today differs from the one its record was kept with: ``kept``
    (status then), ``today`` (status now) and the registry entries fixed since (``since``: the
    claim's thresholds)."""

    claim: str
    kept: str | None
    today: str
    since: tuple[str, ...]


def kept_verdicts(
    results: Sequence[ClaimResult],
    kept: Mapping[str, str],
    kept_at: datetime.datetime,
) -> list[KeptVerdict]:
    """Each claim of ``results`` whose status differs from ``kept`` (claim id → status as the
    record was kept, at ``kept_at``; absent: the claim did not exist), with its thresholds fixed
    since (:func:`~learnable_sparsity.claims.preregistered.thresholds_fixed_since`)."""
    return [
        KeptVerdict(
            result.claim.id,
            kept.get(result.claim.id),
            result.verdict.status,
            tuple(thresholds_fixed_since(result.claim, kept_at)),
        )
        for result in results
        if kept.get(result.claim.id) != result.verdict.status
    ]


def kept_markdown(
    changed: Sequence[KeptVerdict], rules_since: Sequence[str], kept_with: str
) -> str:
    """The section of a kept record's claims table that shows both rule sets: the verdicts the
    record was kept with (``kept_with`` says by which checks) beside today's where they differ,
    the claim's thresholds fixed since, and the rules fixed since (which every claim uses)."""
    lines = [
        "",
        "### Verdicts as kept and today",
        "",
        f"The record was judged when kept ({kept_with}); today's rules give another verdict for "
        f"{len(changed)} claims. A rule changed after a record was kept applies to it beside the "
        "verdict it was kept with, never in its place. Changes of the checks' code that no "
        "registry entry names (before 2026-11-28 the gates' constants were code) lie between "
        "the two checks' commits (`git log <kept commit>..HEAD -- learnable_sparsity/claims`).",
        "",
        "Rules fixed since the record was kept: "
        + ("; ".join(rules_since) if rules_since else "none")
        + ".",
        "",
        "| Claim | As kept | Today | Its thresholds fixed since |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| [{item.claim}](#{claim_anchor(item.claim)}) | "
        f"{item.kept or 'not yet a claim'} | **{item.today}** | "
        f"{_cell('; '.join(item.since)) or '—'} |"
        for item in changed
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class MatrixColumn:
    """One run in the claims matrix: its ``name``, the ``link`` to its claims table (its
    ``claims.md``, relative to the page that shows the matrix), its verdicts' statuses by claim
    id, the claims whose verdict is ``fragile`` (a ±10% move of a threshold or rule flips it) and,
    for a kept record, the statuses it was ``kept`` with where they differ from today's."""

    name: str
    link: str
    statuses: Mapping[str, str]
    fragile: frozenset[str] = frozenset()
    kept: Mapping[str, str | None] = field(default_factory=dict)


# The matrix's marks beside a verdict: one that ±10% on a threshold or rule flips, and the
# verdict a kept record was kept with where today's rules give another.
FRAGILE = "≈"
MATRIX_LEGEND = (
    f"{MARKS[REPRODUCED]} reproduced, {MARKS[NOT_REPRODUCED]} not reproduced, "
    f"{MARKS[NOT_MEASURABLE]} not measurable; {FRAGILE}: fragile, a ±10% move of one threshold "
    "or rule the verdict uses flips it (its evidence names which); (kept …): a kept record's "
    "verdict under the rules it was kept with, where today's differ (its table shows why)."
)


def _matrix_cell(column: MatrixColumn, claim_id: str) -> str:
    status = column.statuses.get(claim_id)
    if status is None:
        return NOT_JUDGED
    if status not in MARKS:
        raise LearnableSparsityError(
            f"run {column.name!r}: claim {claim_id!r} has an unknown verdict {status!r}"
        )
    edge = f"{FRAGILE} " if claim_id in column.fragile else ""
    cell = f"[{edge}{MARKS[status]} {status}]({column.link}#{claim_anchor(claim_id)})"
    was = column.kept.get(claim_id)
    if was:  # a claim the record was kept without shows today's verdict alone
        cell += f" (kept {MARKS[was]})"
    return cell


def _matrix_totals(column: MatrixColumn, claim_ids: Sequence[str]) -> str:
    tally = Counter(column.statuses.get(claim_id, NOT_JUDGED) for claim_id in claim_ids)
    shown = [f"{tally[status]} {mark}" for status, mark in MARKS.items()]
    fragile = sum(claim_id in column.fragile for claim_id in claim_ids)
    shown += [f"{fragile} {FRAGILE}"] if fragile else []
    return " · ".join(shown + ([f"{tally[NOT_JUDGED]} {NOT_JUDGED}"] if tally[NOT_JUDGED] else []))


def claims_matrix(
    claims: Sequence[Claim],
    columns: Sequence[MatrixColumn],
    excluded: Sequence[OutOfScope] = (),
) -> str:
    """Every claim's verdict in every run, as Markdown: a row per claim of ``claims`` (its title,
    by work in the order of :data:`WORKS`), a column per run of ``columns`` (each verdict a link
    to the claim's row in that run's claims table; "—" where the run has no verdict for the
    claim), a row per claim a run judged that ``claims`` no longer has (titled by its id, marked
    retired), a totals row, then the titles of the ``excluded`` claims (out of scope)."""
    current = {claim.id for claim in claims}
    retired = dict.fromkeys(i for column in columns for i in column.statuses if i not in current)
    rows = [
        (claim.work, _cell(claim.title), claim.id)
        for claim in sorted(claims, key=lambda claim: WORKS.index(claim.work))
    ]
    rows += [("", f"`{claim_id}` (retired)", claim_id) for claim_id in retired]
    names = " | ".join(f"[{_cell(column.name)}]({column.link})" for column in columns)
    lines = [
        f"| Work | Claim | {names} |",
        "|---|---|" + "---|" * len(columns),
    ]
    shown_work = None
    for work, title, claim_id in rows:
        cells = " | ".join(_matrix_cell(column, claim_id) for column in columns)
        lines.append(f"| {work if work != shown_work else ''} | {title} | {cells} |")
        shown_work = work
    ids = [claim_id for _, _, claim_id in rows]
    totals = " | ".join(_matrix_totals(column, ids) for column in columns)
    lines.append(f"| | **{len(rows)} claims** | {totals} |")
    lines += ["", MATRIX_LEGEND]
    if excluded:
        titles = "; ".join(f"{_cell(claim.title)} ({claim.work})" for claim in excluded)
        lines += [
            "",
            f"Out of scope, no check tests them (why: each run's table): {titles}.",
        ]
    return "\n".join(lines) + "\n"
