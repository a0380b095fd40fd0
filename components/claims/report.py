"""The claims as the report shows them: one Markdown table (claim, source, verdict, evidence) and
a JSON-ready record of every verdict."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict

from components.claims.catalog import ClaimResult, Results, matched_nll_steps
from components.claims.checks import NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED

STATUSES = (REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def counts(results: Sequence[ClaimResult]) -> dict[str, int]:
    """How many claims have each verdict (every status listed, 0 included)."""
    tally = Counter(result.verdict.status for result in results)
    return {status.replace(" ", "_"): tally[status] for status in STATUSES}


def claims_record(
    results: Sequence[ClaimResult], profile: str, measured: Results
) -> dict[str, object]:
    """Every claim with its verdict, evidence and numbers, and the steps each NMT variant needed
    to reach softmax's final validation NLL (``results/claims/claims.json``)."""
    return {
        "profile": profile,
        "counts": counts(results),
        "steps_to_softmax_valid_nll": matched_nll_steps(measured),
        "claims": [{**asdict(result.claim), **asdict(result.verdict)} for result in results],
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


def claims_markdown(results: Sequence[ClaimResult], profile: str, measured: Results) -> str:
    """The claims section of the report: a summary line, one row per claim, then the training
    length each NMT variant needed to match softmax's validation NLL."""
    tally = counts(results)
    lines = [
        f"## The papers' claims, checked on these results ({profile} profile)",
        "",
        f"{tally['reproduced']} reproduced, {tally['not_reproduced']} not reproduced, "
        f"{tally['not_measurable']} not measurable in this profile, of {len(results)} claims. "
        "Comparisons are tested over seeds (Welch's t-test, one-sided, p < 0.05; mean ± sd over "
        "seeds); a claim is not measurable when training length would still decide it (one "
        "method still catching up with the other, α still moving, a run still improving), when "
        "its runs collapsed or have too few seeds — a longer profile "
        "(`python -m pipelines.profile evidence`) decides it.",
        "",
        "| Claim | Source | Verdict | Evidence |",
        "|---|---|---|---|",
    ]
    for result in results:
        claim, verdict = result.claim, result.verdict
        lines.append(
            f"| {_cell(claim.text)} | {claim.work}: {_cell(claim.source)} | "
            f"**{verdict.status}** | {_cell(verdict.evidence)} |"
        )
    lines += _matched_lines(measured)
    return "\n".join(lines) + "\n"
