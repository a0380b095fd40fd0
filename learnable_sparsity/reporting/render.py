r"""Renderers of a :class:`~learnable_sparsity.reporting.table.ComparisonTable`, and the report
index.

The Markdown and LaTeX tables have, per metric, a reproduced column ("<metric>: reproduced,
mean ± std|standard error (n) (<scope>)", cells "mean ± spread (n=…)"), one column per published
reference ("<metric>: <reference>") and — paper profile only — a "Δ vs <reference>" column
(reproduced mean − published, signed) for each reference that is comparable in at least one
row. A missing value is "—" (or the cell's note, e.g. "not measurable"; a cell with values
shows its note after them), a difference that is not computed is blank; a published number
keeps its printed decimals (up to 3) where they exceed the metric's. The provenance follows the
table: profile, data, seeds, sacreBLEU signatures, device and the published sources.

* :func:`to_markdown` — a Markdown section: title, caption, table, provenance list.
* :func:`to_csv` — long format, one line per system, metric and published reference.
* :func:`to_latex` — a booktabs ``table`` environment (:func:`latex_escape` escapes the text).
* :func:`table_files` — all three, as ``tables/<name>.{md,csv,tex}`` under ``reports/``.
* :func:`render_report` — the body of ``reports/index.md``: every table and figure, relative
  links only.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.reporting.table import (
    NOT_COMPARABLE,
    PAPER_PROFILE,
    SPREAD_LABELS,
    ComparisonTable,
    Metric,
    Reference,
    Row,
    TableCell,
)

TABLES_DIR = "tables"


@dataclass(frozen=True)
class _Column:
    header: str
    kind: Literal["reproduced", "published", "difference"]
    metric: Metric
    reference: str | None = None


def _reference_columns(table: ComparisonTable, metric: Metric) -> list[str]:
    """Reference column names of ``metric``, in order of first appearance over the rows."""
    names: dict[str, None] = {}
    for row in table.rows:
        for ref in row.cells.get(metric.key, TableCell()).references:
            names.setdefault(ref.column)
    return list(names)


def _columns(table: ComparisonTable) -> list[_Column]:
    """Per metric: reproduced, each published column, and (paper profile only) a Δ column for
    each published column that is comparable in at least one row."""
    columns: list[_Column] = []
    scope = table.provenance.scope
    for metric in table.metrics:
        spread = SPREAD_LABELS[metric.spread]
        columns.append(
            _Column(f"{metric.label}: reproduced, {spread} (n) ({scope})", "reproduced", metric)
        )
        names = _reference_columns(table, metric)
        columns += [_Column(f"{metric.label}: {name}", "published", metric, name) for name in names]
        for name in names:
            refs = [
                row.cells[metric.key].reference(name)
                for row in table.rows
                if metric.key in row.cells
            ]
            if any(ref is not None and table.comparable(metric, ref) for ref in refs):
                columns.append(_Column(f"{metric.label}: Δ vs {name}", "difference", metric, name))
    return columns


def _decimals(value: float) -> int:
    """Decimal places of ``value`` as written (32.7 → 1, 0.002 → 3), at most 3."""
    text = repr(float(value))
    if "e" in text or "." not in text:
        return 3
    return min(len(text.split(".")[1].rstrip("0")), 3)


def _number(value: float, digits: int) -> str:
    return f"{value:.{digits}f}"


def _reproduced_text(cell: TableCell, metric: Metric) -> str:
    if cell.mean is None:
        return cell.note or "—"
    text = _number(cell.mean, metric.digits)
    spread = cell.spread(metric.spread)
    if spread is not None:
        text += f" ± {_number(spread, metric.digits)}"
    text += f" (n={cell.n})"
    return f"{text} — {cell.note}" if cell.note else text


def _published_text(ref: Reference | None, metric: Metric) -> str:
    if ref is None or ref.value is None:
        return "—"
    text = _number(ref.value, max(metric.digits, _decimals(ref.value)))
    if ref.spread is not None:
        text += f" ± {_number(ref.spread, max(metric.digits, _decimals(ref.spread)))}"
    return text


def _cell_text(table: ComparisonTable, row: Row, column: _Column) -> str:
    cell = row.cells.get(column.metric.key, TableCell())
    if column.kind == "reproduced":
        return _reproduced_text(cell, column.metric)
    ref = cell.reference(column.reference)
    if column.kind == "published":
        return _published_text(ref, column.metric)
    diff = None if ref is None else table.difference(column.metric, cell, ref)
    return "" if diff is None else f"{diff:+.{column.metric.digits}f}"


def _grid(table: ComparisonTable) -> tuple[list[str], list[list[str]]]:
    """Header and body cells shared by the Markdown and LaTeX renderers."""
    columns = _columns(table)
    header = [table.row_header, *(column.header for column in columns)]
    body = [[row.system, *(_cell_text(table, row, c) for c in columns)] for row in table.rows]
    return header, body


def _provenance_lines(table: ComparisonTable) -> list[tuple[str, str]]:
    """(label, text) pairs of the provenance block."""
    p = table.provenance
    ns = table.n_seeds
    seeds = "—" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
    lines = [
        ("profile", p.profile if p.is_paper else f"{p.profile} — {NOT_COMPARABLE}"),
        ("data", ", ".join(p.data)),
        (f"{p.replicates} (n per cell)", seeds),
    ]
    lines += [("sacreBLEU signature", signature) for signature in p.signatures]
    if p.device is not None:
        lines.append(("device", p.device))
    lines += [("published source", source) for source in table.sources]
    return lines


def _markdown_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _markdown_item(label: str, text: str) -> str:
    """A provenance list item; signatures go in code spans (they contain "|")."""
    return f"- {label}: `{text}`" if label == "sacreBLEU signature" else f"- {label}: {text}"


def to_markdown(table: ComparisonTable) -> str:
    """The table as a Markdown section: title, caption, table and provenance list."""
    header, body = _grid(table)
    lines = [
        f"### {table.title}",
        "",
        table.full_caption(),
        "",
        "| " + " | ".join(map(_markdown_escape, header)) + " |",
        "|---|" + "---:|" * (len(header) - 1),
        *("| " + " | ".join(map(_markdown_escape, cells)) + " |" for cells in body),
        "",
        "Provenance:",
        "",
        *(_markdown_item(label, text) for label, text in _provenance_lines(table)),
    ]
    return "\n".join(lines) + "\n"


_CSV_FIELDS = (
    "table",
    "system",
    "metric",
    "reference",
    "published",
    "published_spread",
    "published_data",
    "values",
    "n",
    "mean",
    "spread",
    "spread_kind",
    "diff",
    "profile",
    "data",
    "note",
)


def _csv_number(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def to_csv(table: ComparisonTable) -> str:
    """Long-format CSV: one line per (system, metric, published reference) — one line with
    empty reference fields where a cell has none. ``values`` are the seeds' values joined by
    ";", ``spread`` is ``spread_kind`` (std or se; empty when n < 2), ``diff`` is reproduced
    mean − published (empty unless comparable), ``data`` the data sets joined by ";", ``note``
    the cell's note (e.g. "not measurable")."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_CSV_FIELDS)
    for row in table.rows:
        for metric in table.metrics:
            cell = row.cells.get(metric.key, TableCell())
            for ref in cell.references or (None,):
                writer.writerow(
                    [
                        table.name,
                        row.system,
                        metric.key,
                        "" if ref is None else ref.column,
                        _csv_number(None if ref is None else ref.value),
                        _csv_number(None if ref is None else ref.spread),
                        "" if ref is None or ref.data is None else ref.data,
                        ";".join(map(_csv_number, cell.values)),
                        cell.n,
                        _csv_number(cell.mean),
                        _csv_number(cell.spread(metric.spread)),
                        metric.spread,
                        _csv_number(None if ref is None else table.difference(metric, cell, ref)),
                        table.provenance.profile,
                        ";".join(table.provenance.data),
                        cell.note or "",
                    ]
                )
    return out.getvalue()


_LATEX = str.maketrans(
    {
        "\\": r"\textbackslash{}",
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}",
        "±": r"$\pm$",
        "—": "---",
        "–": "--",
        "−": "-",
        "α": r"$\alpha$",
        "Δ": r"$\Delta$",
        "√": r"$\surd$",
        "≥": r"$\geq$",
        "<": r"$<$",  # in text mode the default font encoding prints them as ¡ and ¿
        ">": r"$>$",
        "≈": r"$\approx$",
        "→": r"$\rightarrow$",
    }
)


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped and the symbols used here spelled out."""
    return text.translate(_LATEX)


def to_latex(table: ComparisonTable) -> str:
    """A booktabs ``table`` environment with the caption, provenance and ``tab:<name>`` label."""
    header, body = _grid(table)
    provenance = "; ".join(f"{label}: {text}" for label, text in _provenance_lines(table))
    lines = [
        r"\begin{table}[ht]",
        r"\centering",
        r"\small",
        r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
        r"\toprule",
        " & ".join(map(latex_escape, header)) + r" \\",
        r"\midrule",
        *(" & ".join(map(latex_escape, cells)) + r" \\" for cells in body),
        r"\bottomrule",
        r"\end{tabular}",
        r"\caption{" + latex_escape(f"{table.title}. {table.full_caption()} {provenance}.") + "}",
        r"\label{tab:" + table.name + "}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


# Link text -> (file extension, renderer) of the files written for each table.
_FORMATS = {"Markdown": ("md", to_markdown), "CSV": ("csv", to_csv), "LaTeX": ("tex", to_latex)}


def table_files(table: ComparisonTable) -> dict[str, str]:
    """{path relative to ``reports/``: text} of the table's Markdown, CSV and LaTeX files."""
    return {f"{TABLES_DIR}/{table.name}.{ext}": render(table) for ext, render in _FORMATS.values()}


def _check_relative(path: str) -> str:
    if not path or path.startswith(("/", "\\")) or "://" in path or ".." in path.split("/"):
        raise LearnableSparsityError(
            f"figure path {path!r} must be relative to reports/ (no scheme, no leading /, no ..)"
        )
    return path


def render_report(
    tables: Sequence[ComparisonTable], figures: Sequence[tuple[str, str]], claims: str = ""
) -> str:
    """The body of ``reports/index.md``: the ``claims`` section (Markdown, first: what the
    numbers below say about the papers), every table (with links to its files of
    :func:`table_files`) and every figure ``(title, path relative to reports/)``. Plain
    Markdown with relative links only, so it renders offline."""
    names = [table.name for table in tables]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise LearnableSparsityError(f"duplicate table names in the report: {duplicates}")
    lines = [
        "# Reproduction report",
        "",
        "Published numbers (copied from the publications) beside the numbers reproduced here.",
        f"Tables from a profile other than `{PAPER_PROFILE}` (smoke, ci) are labelled "
        f"“{NOT_COMPARABLE}”: they run on small or generated data and show qualitative "
        "effects only; no differences are computed for them.",
        "",
        *([claims.rstrip("\n"), ""] if claims else []),
        "## Tables",
        "",
    ]
    for table in tables:
        links = " · ".join(
            f"[{kind}]({TABLES_DIR}/{table.name}.{ext})" for kind, (ext, _) in _FORMATS.items()
        )
        lines += [to_markdown(table), f"Files: {links}", ""]
    lines += ["## Figures", ""]
    if not figures:
        lines += ["No figures.", ""]
    for title, path in figures:
        lines += [f"### {title}", "", f"![{title}]({_check_relative(path)})", ""]
    return "\n".join(lines)
