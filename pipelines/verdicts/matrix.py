"""The claims matrix: every claim's verdict in the pipeline's own run and in every kept record.

``reports/index.md`` opens with it (stage ``tables``) and ``README.md`` shows it between its
markers; ``python -m pipelines.verdicts.matrix`` rewrites the README's block from the
``claims.json`` files, as ``make repro`` and ``python -m pipelines.stages.report.rejudge <record>``
do after their verdicts (a test fails while the block is stale).

The columns: the pipeline's own run (``results/claims/claims.json``, named by its profile; its
table ``reports/claims.md``), then every kept record (``reports/<name>/`` with ``record.json``
and ``claims.json``, re-judged by stage ``rejudge@<name>``), oldest first. Not a stage: the stages
``tables`` and ``rejudge`` use it.
"""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path

from learnable_sparsity.claims import load_claims, out_of_scope
from learnable_sparsity.claims.report import NOT_JUDGED, MatrixColumn, claims_matrix
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.files import atomic_write_text
from pipelines.scaffold import layout
from pipelines.scaffold.files import read_json

log = logging.getLogger(__name__)

README = Path("README.md")
START = "<!-- claims-matrix:start (python -m pipelines.verdicts.matrix rewrites this block) -->"
END = "<!-- claims-matrix:end -->"
HEADING = (
    "## The papers' claims, run by run"  # reports/index.md: the matrix, before the run's table
)


def kept_records(root: Path) -> list[Path]:
    """The folders of the records kept under ``reports/`` (relative to ``root``) that have been
    judged (a ``record.json`` and a ``claims.json``), oldest first."""
    folders = [
        meta.parent.relative_to(root)
        for meta in (root / layout.REPORTS).glob(f"*/{layout.RECORD_META}")
        if (meta.parent / layout.RECORD_CLAIMS).is_file()
    ]
    return sorted(
        folders,
        key=lambda f: datetime.datetime.fromisoformat(
            read_json(root / f / layout.RECORD_META)["recorded"]
        ),
    )


def _column(name: str, verdicts: Path, table: Path, page: Path, root: Path) -> MatrixColumn:
    """A run's column: its statuses, its fragile verdicts (a ±10% move of a threshold or rule
    flips them: ``numbers.sensitivity.flips``) and, for a kept record, the statuses it was kept
    with where today's differ (``as_kept.changed``, written by stage rejudge)."""
    judged = read_json(root / verdicts)
    statuses = {claim["id"]: claim["status"] for claim in judged["claims"]}
    fragile = frozenset(
        claim["id"]
        for claim in judged["claims"]
        if claim.get("numbers", {}).get("sensitivity", {}).get("flips")
    )
    kept = {item["claim"]: item["kept"] for item in judged.get("as_kept", {}).get("changed", [])}
    link = Path(os.path.relpath(table, page)).as_posix()
    return MatrixColumn(name, link, statuses, fragile, kept)


def matrix_columns(page: Path, root: Path) -> list[MatrixColumn]:
    """The matrix's runs, linked from a page in the folder ``page`` (both relative to the
    repository ``root``): the pipeline's own run, where its claims stage has run, then every kept
    record, oldest first."""
    columns = []
    if (root / layout.CLAIMS_VERDICTS).is_file():
        profile = read_json(root / layout.CLAIMS_VERDICTS)["profile"]
        columns.append(_column(profile, layout.CLAIMS_VERDICTS, layout.CLAIMS_REPORT, page, root))
    else:
        log.warning("%s is missing: the matrix shows the kept records only", layout.CLAIMS_VERDICTS)
    for folder in kept_records(root):
        verdicts, table = folder / layout.RECORD_CLAIMS, folder / layout.RECORD_CLAIMS_REPORT
        columns.append(_column(folder.name, verdicts, table, page, root))
    return columns


def matrix_markdown(page: Path, root: Path = Path()) -> str:
    """The claims matrix (:func:`~learnable_sparsity.claims.report.claims_matrix`) of today's
    claims for a page in the folder ``page``, after a sentence on what its columns are."""
    intro = (
        "Every claim's verdict, run by run: first the pipeline's own run (named by its profile: "
        "`results/claims/claims.json`), then each record kept under `reports/`, oldest first, "
        f"re-judged with today's checks. Each verdict links to its evidence; {NOT_JUDGED}: the "
        "run was judged before the claim existed."
    )
    columns = matrix_columns(page, root)
    return f"{intro}\n\n{claims_matrix(load_claims(), columns, out_of_scope())}"


def with_matrix(readme: str, matrix: str) -> str:
    """``readme`` with the block between :data:`START` and :data:`END` replaced by ``matrix``."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise LearnableSparsityError(
            f"{README} has no claims matrix block: a line {START!r}, later a line {END!r}"
        )
    return f"{readme[: start + len(START)]}\n\n{matrix.rstrip()}\n\n{readme[end:]}"


def refresh_readme(root: Path = Path()) -> bool:
    """Rewrite the README's claims matrix from the ``claims.json`` files; whether it changed."""
    text = (root / README).read_text(encoding="utf-8")
    rewritten = with_matrix(text, matrix_markdown(Path(), root))
    if rewritten != text:
        atomic_write_text(root / README, rewritten)
    return rewritten != text


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        changed = refresh_readme()
    except LearnableSparsityError as error:
        log.error("claims matrix: %s", error)
        raise SystemExit(1) from None
    log.info("%s: claims matrix %s", README, "rewritten" if changed else "already current")


if __name__ == "__main__":
    main()
