r"""Comparison tables: the publications' numbers beside the numbers this project reproduced.

A :class:`ComparisonTable` has rows (a system: an attention variant, an estimator, an attention
block) and metric columns. Each cell holds the reproduced values over seeds and the published
numbers it should be read beside (:class:`Reference`, from ``paper_results.yaml``, which ships
with this package; :func:`paper_table` reads one entry). A reproduced cell shows

    mean ± spread (n=…)      spread = sample std (ddof 1) or standard error std/√n,

with the spread only when n ≥ 2. The difference reproduced − published is computed **only** when
the run used the ``paper`` profile *and* the published number was measured on one of the data
sets the run used (``Reference.data`` ∈ ``Provenance.data``). Otherwise no difference column is
rendered (profiles other than ``paper``) or its cell is blank, and for any profile other than
``paper`` every reproduced column header and the caption say
"<profile> profile on <data> — not comparable to the publication": smoke or CI numbers are never
presented as a paper-scale reproduction.

Renderers: :func:`to_markdown`, :func:`to_csv` (long format, one line per system, metric and
published reference), :func:`to_latex` (booktabs), :func:`table_files` (all three under
``tables/``) and :func:`render_report` (the body of ``reports/index.md``).

Builders turn the pipeline's plain metric dicts into tables: :func:`ast_bleu_table`,
:func:`speed_comparison_table`, :func:`head_summary_table` and :func:`lvm_table`; each docstring
gives the expected input shape. Data-set names are this project's: the corpus names of
``components.data.download`` (``iwslt17_de_en``, ``iwslt14_de_en``, …) and the image data sets
of :data:`LVM_DATA`.
"""

from __future__ import annotations

import copy
import csv
import io
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from numbers import Real
from typing import Any, Literal

import yaml

from components.analysis.blocks import ATTENTION_TYPES, ROLES, split_block
from components.errors import LearnableSparsityError
from components.nmt.speed import VARIANT_LABELS

PAPER_PROFILE = "paper"
NOT_COMPARABLE = "not comparable to the publication"
TABLES_DIR = "tables"
Spread = Literal["std", "se"]
SPREAD_LABELS: dict[str, str] = {"std": "mean ± std", "se": "mean ± standard error"}

# Data sets of the publications, in this project's naming.
EST_SPEED_CORPUS = "iwslt14_de_en"  # EST Table 4: BLEU de-en and speeds on IWSLT 2014 De-En
AST_HEADS_CORPUS = "wmt14_en_de"  # AST head-role analysis: the WMT 2014 en->de models
LVM_DATA: dict[str, str] = {
    "ssvae": "mnist",
    "signal_game": "egg_imagenet",
    "bitvector_vae": "fashion_mnist",
}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# ---------------------------------------------------------------------------- published numbers


@cache
def _paper_results() -> dict[str, dict[str, Any]]:
    """{id: entry} over the yaml's ``tables`` and ``in_text_results`` (parsed once)."""
    text = resources.files(__package__).joinpath("paper_results.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    return {entry["id"]: entry for entry in [*data["tables"], *data["in_text_results"]]}


def paper_table(table_id: str) -> dict[str, Any]:
    """A copy of the published table or in-text result ``table_id`` of ``paper_results.yaml``."""
    entries = _paper_results()
    if table_id not in entries:
        raise LearnableSparsityError(
            f"unknown paper table id {table_id!r}; known ids: {', '.join(entries)}"
        )
    return copy.deepcopy(entries[table_id])


def _published_row(table_id: str, system: str) -> dict[str, Any]:
    """The row of published table ``table_id`` whose ``system`` is ``system``."""
    for row in _paper_results()[table_id]["rows"]:
        if row["system"] == system:
            return row
    raise LearnableSparsityError(f"paper table {table_id!r} has no row {system!r}")


# ---------------------------------------------------------------------------- the table model


@dataclass(frozen=True)
class Reference:
    """A published number: its ``column`` header, ``value`` (None: not published), the ``±``
    printed beside it, and ``data``, the data set it was measured on (None: unknown or not a
    like-for-like measurement; never compared)."""

    column: str
    value: float | None
    spread: float | None = None
    data: str | None = None


@dataclass(frozen=True)
class Cell:
    """One system and metric: the reproduced ``values`` (one per seed) and the published
    ``references`` to read them beside."""

    values: tuple[float, ...] = ()
    references: tuple[Reference, ...] = ()

    @property
    def n(self) -> int:
        """Number of reproduced values (seeds)."""
        return len(self.values)

    @property
    def mean(self) -> float | None:
        """Mean over seeds, None without values."""
        return statistics.fmean(self.values) if self.values else None

    def spread(self, kind: Spread) -> float | None:
        """Sample std (ddof 1) or standard error std/√n; None when n < 2."""
        if self.n < 2:
            return None
        std = statistics.stdev(self.values)
        return std if kind == "std" else std / math.sqrt(self.n)

    def reference(self, column: str) -> Reference | None:
        """The reference shown in ``column``, if this cell has one."""
        return next((ref for ref in self.references if ref.column == column), None)


@dataclass(frozen=True)
class Metric:
    """A metric column: ``key`` (of ``Row.cells``), header ``label``, the ``spread`` shown over
    seeds, decimal ``digits``, and whether reproduced − published is ever meaningful
    (``comparable``; False e.g. for absolute tokens/s, which depend on the hardware)."""

    key: str
    label: str
    spread: Spread = "std"
    digits: int = 2
    comparable: bool = True


@dataclass(frozen=True)
class Row:
    """A system and its cells by metric key (a metric without a cell renders as "—")."""

    system: str
    cells: Mapping[str, Cell]


@dataclass(frozen=True)
class Provenance:
    """Where the reproduced numbers come from: the scale ``profile`` ("smoke", "paper", "ci",
    …), the ``data`` sets used, the sacreBLEU ``signatures`` and the ``device``, when given."""

    profile: str
    data: tuple[str, ...]
    signatures: tuple[str, ...] = ()
    device: str | None = None

    @property
    def is_paper(self) -> bool:
        """Whether the run used the publications' settings."""
        return self.profile == PAPER_PROFILE

    @property
    def scope(self) -> str:
        """Profile and data, with the not-comparable label unless the paper profile."""
        scope = f"{self.profile} profile on {', '.join(self.data)}"
        return scope if self.is_paper else f"{scope} — {NOT_COMPARABLE}"


@dataclass(frozen=True)
class ComparisonTable:
    """Reproduced beside published numbers. ``name`` is the file stem under ``tables/``;
    ``sources`` cite the published tables; ``row_header`` heads the first column."""

    name: str
    title: str
    caption: str
    metrics: tuple[Metric, ...]
    rows: tuple[Row, ...]
    provenance: Provenance
    sources: tuple[str, ...] = ()
    row_header: str = "System"

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise LearnableSparsityError(
                f"table name {self.name!r} is not a file stem ([A-Za-z0-9_.-], no leading dot)"
            )
        if not self.provenance.profile:
            raise LearnableSparsityError(f"table {self.name!r}: profile is empty")
        if not self.provenance.data:
            raise LearnableSparsityError(f"table {self.name!r}: data names no data set")
        keys = [metric.key for metric in self.metrics]
        if len(set(keys)) != len(keys):
            raise LearnableSparsityError(f"table {self.name!r}: duplicate metric keys {keys}")
        for row in self.rows:
            unknown = sorted(set(row.cells) - set(keys))
            if unknown:
                raise LearnableSparsityError(
                    f"table {self.name!r}, row {row.system!r}: cells for unknown metrics {unknown}"
                )

    @property
    def n_seeds(self) -> tuple[int, ...]:
        """The distinct numbers of reproduced values over the cells that have any."""
        return tuple(sorted({c.n for row in self.rows for c in row.cells.values() if c.n}))

    def comparable(self, metric: Metric, reference: Reference) -> bool:
        """Paper profile, a comparable metric, and the published number measured on our data."""
        return (
            self.provenance.is_paper
            and metric.comparable
            and reference.value is not None
            and reference.data in self.provenance.data
        )

    def difference(self, metric: Metric, cell: Cell, reference: Reference) -> float | None:
        """Reproduced mean − published value, or None where the two are not comparable."""
        if cell.mean is None or not self.comparable(metric, reference):
            return None
        return cell.mean - reference.value

    def full_caption(self) -> str:
        """The caption with the comparability statement appended."""
        text = f"{self.caption} Reproduced: {self.provenance.scope}."
        if not self.provenance.is_paper:
            return f"{text} No differences to the published numbers are computed."
        elsewhere = {
            ref.data or "data not stated"
            for metric in self.metrics
            for row in self.rows
            for ref in row.cells.get(metric.key, Cell()).references
            if ref.value is not None and metric.comparable and not self.comparable(metric, ref)
        }
        if elsewhere:
            text += (
                f" Published numbers on other data ({', '.join(sorted(elsewhere))}) are"
                " shown for reference only; no difference is computed for them."
            )
        return text


# ---------------------------------------------------------------------------- rendering


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
        for ref in row.cells.get(metric.key, Cell()).references:
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


def _reproduced_text(cell: Cell, metric: Metric) -> str:
    if cell.mean is None:
        return "—"
    text = _number(cell.mean, metric.digits)
    spread = cell.spread(metric.spread)
    if spread is not None:
        text += f" ± {_number(spread, metric.digits)}"
    return f"{text} (n={cell.n})"


def _published_text(ref: Reference | None, metric: Metric) -> str:
    if ref is None or ref.value is None:
        return "—"
    text = _number(ref.value, max(metric.digits, _decimals(ref.value)))
    if ref.spread is not None:
        text += f" ± {_number(ref.spread, max(metric.digits, _decimals(ref.spread)))}"
    return text


def _cell_text(table: ComparisonTable, row: Row, column: _Column) -> str:
    cell = row.cells.get(column.metric.key, Cell())
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
        ("seeds (n per cell)", seeds),
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
)


def _csv_number(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def to_csv(table: ComparisonTable) -> str:
    """Long-format CSV: one line per (system, metric, published reference) — one line with
    empty reference fields where a cell has none. ``values`` are the seeds' values joined by
    ";", ``spread`` is ``spread_kind`` (std or se; empty when n < 2), ``diff`` is reproduced
    mean − published (empty unless comparable), ``data`` the data sets joined by ";"."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_CSV_FIELDS)
    for row in table.rows:
        for metric in table.metrics:
            cell = row.cells.get(metric.key, Cell())
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


def render_report(tables: Sequence[ComparisonTable], figures: Sequence[tuple[str, str]]) -> str:
    """The body of ``reports/index.md``: every table (with links to its files of
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


# ---------------------------------------------------------------------------- input checks


def _names(key: str, value: str | Sequence[str] | None) -> tuple[str, ...]:
    """A name or names as a tuple (None: empty); each a non-empty string."""
    names = () if value is None else (value,) if isinstance(value, str) else tuple(value)
    for name in names:
        if not isinstance(name, str) or not name:
            raise LearnableSparsityError(f"{key} must hold non-empty strings, got {name!r}")
    return names


def _number_value(key: str, value: object, low: float = -math.inf, high: float = math.inf) -> float:
    """``value`` as a float; it must be a finite real number in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise LearnableSparsityError(f"{key} must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise LearnableSparsityError(f"{key} must lie in [{low}, {high}], got {value!r}")
    return float(value)


def _seed_values(key: str, values: float | Sequence[float]) -> tuple[float, ...]:
    """One value or a sequence of per-seed values, checked."""
    if isinstance(values, Real):
        values = [values]
    return tuple(_number_value(f"{key}[{i}]", v) for i, v in enumerate(values))


def _known(key: str, name: str, known: Iterable[str]) -> str:
    known = list(known)
    if name not in known:
        raise LearnableSparsityError(f"unknown {key} {name!r}; expected one of {', '.join(known)}")
    return name


def _ordered(key: str, names: Iterable[str], order: Sequence[str]) -> list[str]:
    """``names`` (each checked against ``order``) sorted in ``order``."""
    present = {_known(key, name, order) for name in names}
    if not present:
        raise LearnableSparsityError(f"no {key} given; expected some of {', '.join(order)}")
    return [name for name in order if name in present]


# ---------------------------------------------------------------------------- NMT builders

_BLEU_ORDER = ("softmax", "entmax15", "entmax_alpha", "sparsemax", "topk")
_AST_BLEU_SYSTEMS = {
    "softmax": "softmax",
    "entmax15": "1.5-entmax",
    "entmax_alpha": "alpha-entmax (learned alpha per head)",
}
_EST_SYSTEMS = {
    "softmax": "Transformer (softmax)",
    "sparsemax": "Sparsemax (Martins & Astudillo, 2016)",
    "entmax15": "Entmax-1.5 (Peters et al., 2019)",
    "entmax_alpha": "Entmax-alpha (Correia et al., 2019)",
    "topk": "Proposal (top-k before softmax)",
}


def ast_bleu_table(
    bleu_by_variant_seed: Mapping[str, Sequence[float]],
    profile: str,
    data: str | Sequence[str],
    signature: str | Sequence[str] | None = None,
) -> ComparisonTable:
    """Test BLEU of the attention variants beside AST Table 4.1 and EST Table 4 (de-en).

    ``bleu_by_variant_seed``: {variant: [BLEU of each seed]} with variants among softmax,
    entmax15, entmax_alpha, sparsemax, topk (rows in that order; only given variants appear).
    ``data``: the corpus (or corpora) the BLEU was measured on. Published columns: the AST
    column of that corpus when it is one of AST's four (iwslt17_de_en, kftt_ja_en, wmt16_ro_en,
    wmt14_en_de), otherwise all four for reference; and EST Table 4 BLEU de-en
    (iwslt14_de_en) for every variant. ``signature``: the sacreBLEU signature(s).
    """
    corpora = _names("data", data)
    variants = _ordered("variant", bleu_by_variant_seed, _BLEU_ORDER)
    ast = _paper_results()["ast_mt_bleu"]
    ast_corpora = [m["name"].removeprefix("bleu_") for m in ast["metrics"]]
    shown = [c for c in ast_corpora if c in corpora] or ast_corpora
    est_id = "est_sparse_attention_speed"
    rows = []
    for variant in variants:
        refs = [
            Reference(
                f"published {corpus} (AST Table 4.1)",
                _published_row("ast_mt_bleu", _AST_BLEU_SYSTEMS[variant])[f"bleu_{corpus}"]
                if variant in _AST_BLEU_SYSTEMS
                else None,
                data=corpus,
            )
            for corpus in shown
        ]
        refs.append(
            Reference(
                f"published {EST_SPEED_CORPUS} (EST Table 4)",
                _published_row(est_id, _EST_SYSTEMS[variant])["bleu_de_en"],
                data=EST_SPEED_CORPUS,
            )
        )
        values = _seed_values(f"bleu_by_variant_seed[{variant!r}]", bleu_by_variant_seed[variant])
        rows.append(Row(VARIANT_LABELS[variant], {"bleu": Cell(values, tuple(refs))}))
    return ComparisonTable(
        name=_stem("ast_bleu", corpora),
        title=f"NMT test BLEU by attention variant ({', '.join(corpora)})",
        caption=(
            "Test BLEU of the Transformer with each attention normalizer. Reproduced BLEU is "
            "sacreBLEU (signature below); AST Table 4.1 reports tokenized BLEU and EST Table 4 "
            "BLEU on IWSLT 2014 De-En, so small differences can come from tokenization alone."
        ),
        metrics=(Metric("bleu", "BLEU"),),
        rows=tuple(rows),
        provenance=Provenance(profile, corpora, _names("signature", signature)),
        sources=(ast["source"], _paper_results()[est_id]["source"]),
    )


def _stem(prefix: str, names: Sequence[str]) -> str:
    """``prefix_name1_name2`` with characters outside [A-Za-z0-9_.-] replaced by "-"."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", "_".join([prefix, *names]))


_SPEED_PHASES = {"train": "train_tokens_per_second", "inference": "inference_tokens_per_second"}
_EST_SPEED_KEYS = {"train": "train_speed_ktok_per_s", "inference": "infer_speed_ktok_per_s"}
_AST_SPEED_SYSTEMS = {"entmax15": "1.5-entmax", "entmax_alpha": "alpha-entmax"}


def speed_comparison_table(
    rows: Sequence[Mapping[str, Any]],
    profile: str,
    device: str,
    data: str | Sequence[str],
) -> ComparisonTable:
    """Training / inference tokens per second and their ratios to softmax, as in EST Table 4.

    ``rows``: [{"variant": …, "train_tokens_per_second": …, "inference_tokens_per_second": …}],
    one per variant and measurement round (variants as in ``VARIANT_LABELS``, softmax required;
    every variant must have as many rounds as softmax). A ratio divides round i of a variant by
    round i of softmax, so each round gives one ratio. Published: EST Table 4 speeds (thousand
    tokens/s, shown ×1000) and their ratios to its softmax row, measured on iwslt14_de_en, and
    AST's in-text training speeds relative to softmax (α-entmax 75%, 1.5-entmax 90%; no data set
    is attached, so no difference is computed). Absolute speeds depend on the hardware and are
    never differenced. ``data``: the corpus the speeds were measured on.
    """
    corpora = _names("data", data)
    measured: dict[str, dict[str, list[float]]] = {}
    for i, row in enumerate(rows):
        variant = _known(f"rows[{i}] variant", row.get("variant"), VARIANT_LABELS)
        phases = measured.setdefault(variant, {phase: [] for phase in _SPEED_PHASES})
        for phase, key in _SPEED_PHASES.items():
            if key not in row:
                raise LearnableSparsityError(f"rows[{i}] ({variant}) lacks {key!r}")
            phases[phase].append(_number_value(f"rows[{i}] {key}", row[key], low=0.0))
    if "softmax" not in measured:
        raise LearnableSparsityError(f"the softmax baseline is missing, got {sorted(measured)}")
    baseline = measured["softmax"]
    if any(value == 0.0 for values in baseline.values() for value in values):
        raise LearnableSparsityError("softmax tokens_per_second is 0; ratios are undefined")
    est_id = "est_sparse_attention_speed"
    est_softmax = _published_row(est_id, _EST_SYSTEMS["softmax"])
    est_source = f"published {EST_SPEED_CORPUS} (EST Table 4, FP16)"
    table_rows = []
    for variant in _ordered("variant", measured, VARIANT_LABELS):
        if len(measured[variant]["train"]) != len(baseline["train"]):
            raise LearnableSparsityError(
                f"variant {variant!r} has {len(measured[variant]['train'])} rounds, softmax "
                f"{len(baseline['train'])}; ratios pair round i with round i"
            )
        est = _published_row(est_id, _EST_SYSTEMS[variant])
        cells = {}
        for phase in _SPEED_PHASES:
            speeds = measured[variant][phase]
            published = est[_EST_SPEED_KEYS[phase]]
            ratio_refs = [
                Reference(
                    est_source,
                    published / est_softmax[_EST_SPEED_KEYS[phase]],
                    data=EST_SPEED_CORPUS,
                )
            ]
            if phase == "train" and variant in _AST_SPEED_SYSTEMS:
                pct = _published_row("ast_training_speed", _AST_SPEED_SYSTEMS[variant])
                ratio_refs.append(
                    Reference("published AST (in text)", pct["relative_train_speed_pct"] / 100)
                )
            cells[f"{phase}_speed"] = Cell(
                tuple(speeds), (Reference(est_source, published * 1000, data=EST_SPEED_CORPUS),)
            )
            cells[f"{phase}_ratio"] = Cell(
                tuple(s / b for s, b in zip(speeds, baseline[phase], strict=True)),
                tuple(ratio_refs),
            )
        table_rows.append(Row(VARIANT_LABELS[variant], cells))
    return ComparisonTable(
        name=_stem("speed", corpora),
        title="Training and inference speed by attention variant (EST Table 4 layout)",
        caption=(
            "Tokens per second of the same Transformer with each attention normalizer, and the "
            "ratio to softmax (per measurement round). EST measured with FP16 training and "
            "128-sentence inference batches on unstated hardware: absolute speeds are shown for "
            "reference only, ratios are the comparable quantity."
        ),
        metrics=(
            Metric("train_speed", "train tokens/s", digits=0, comparable=False),
            Metric("train_ratio", "train ratio to softmax"),
            Metric("inference_speed", "inference tokens/s", digits=0, comparable=False),
            Metric("inference_ratio", "inference ratio to softmax"),
        ),
        rows=tuple(table_rows),
        provenance=Provenance(profile, corpora, device=device),
        sources=(
            _paper_results()[est_id]["source"],
            _paper_results()["ast_training_speed"]["source"],
        ),
    )


_AST_HEAD_SYSTEMS = {"softmax": "softmax", "entmax15": "1.5-entmax", "entmax_alpha": "alpha-entmax"}
ROLE_LABELS: dict[str, str] = {
    "positional_prev": "positional (previous token)",
    "positional_next": "positional (next token)",
    "bpe_merge": "BPE merging",
    "interrogation": "interrogation",
}


def _published_roles(variant: str, role: str) -> tuple[float | None, float | None]:
    """(number of heads, median confidence %) that AST reports for ``variant`` and ``role``."""
    if variant not in _AST_HEAD_SYSTEMS or role == "interrogation":
        return None, None
    system = _AST_HEAD_SYSTEMS[variant]
    if role == "positional_prev":
        row = _published_row("ast_positional_heads", system)
        return row["n_heads"], row["median_confidence_pct"]
    if role == "positional_next":
        row = _published_row("ast_positional_heads", "each of the three models")
        return row["n_heads"], row["confidence_pct_approx"]
    row = _published_row("ast_bpe_merging_heads", system)
    scores = row["scores_pct"]
    return row["heads_above_80pct"], statistics.median(scores) if scores else None


def head_summary_table(
    js_by_variant: Mapping[str, Mapping[str, float | Sequence[float]]],
    roles: Sequence[Mapping[str, Any]],
    profile: str,
    data: str | Sequence[str],
) -> tuple[ComparisonTable, ComparisonTable]:
    """Two tables: head diversity (JS) per attention block, and head-role counts.

    ``js_by_variant``: {variant: {block key: mean JS}} with block keys as in
    :meth:`components.analysis.heads.HeadAnalysis.result` ("encoder.self.layer0", …; layers
    0-based) and a float (one model) or a list of per-seed floats per block. ``roles``: the
    entries of :func:`components.analysis.heads.roles`, each with an added "variant"; only
    "role", "variant" and "confidence" (in [0, 1]) are read. ``data``: the corpus analysed.

    The JS table has one row per block and one column per variant (nothing is published). The
    role table has one row per (variant, role) with the number of heads found and their median
    confidence (%), beside AST's positional and BPE-merging heads (WMT 2014 en→de models; the
    next-token figures are "each of the three models", ≈95%; the BPE median is the median of
    the published scores).
    """
    corpora = _names("data", data)
    role_variants = [
        _known(f"roles[{i}] variant", r.get("variant"), VARIANT_LABELS) for i, r in enumerate(roles)
    ]
    variants = _ordered("variant", [*js_by_variant, *role_variants], VARIANT_LABELS)
    provenance = Provenance(profile, corpora)
    blocks = sorted(
        {block for by_block in js_by_variant.values() for block in by_block},
        key=lambda key: (ATTENTION_TYPES.index(split_block(key)[0]), split_block(key)[1]),
    )
    js_variants = [v for v in variants if v in js_by_variant]
    js_table = ComparisonTable(
        name=_stem("head_js", corpora),
        title="Head diversity (Jensen–Shannon divergence) per attention block",
        caption=(
            "Mean generalized Jensen–Shannon divergence among the heads of each block "
            "(0 = identical heads); layers are 0-based. No published values exist."
        ),
        metrics=tuple(Metric(v, VARIANT_LABELS[v], digits=3) for v in js_variants),
        rows=tuple(
            Row(
                block,
                {
                    v: Cell(
                        _seed_values(f"js_by_variant[{v!r}][{block!r}]", js_by_variant[v][block])
                    )
                    for v in js_variants
                    if block in js_by_variant[v]
                },
            )
            for block in blocks
        ),
        provenance=provenance,
        row_header="Attention block",
    )
    confidences: dict[tuple[str, str], list[float]] = {}
    for i, entry in enumerate(roles):
        role = _known(f"roles[{i}] role", entry.get("role"), ROLES)
        confidence = _number_value(f"roles[{i}] confidence", entry.get("confidence"), 0.0, 1.0)
        confidences.setdefault((role_variants[i], role), []).append(100 * confidence)
    source = f"published {AST_HEADS_CORPUS} (AST)"
    role_rows = []
    for variant in variants:
        for role in ROLES:
            found = confidences.get((variant, role), [])
            heads, median = _published_roles(variant, role)
            role_rows.append(
                Row(
                    f"{VARIANT_LABELS[variant]} — {ROLE_LABELS[role]}",
                    {
                        "heads": Cell(
                            (float(len(found)),), (Reference(source, heads, data=AST_HEADS_CORPUS),)
                        ),
                        "median_confidence": Cell(
                            (statistics.median(found),) if found else (),
                            (Reference(source, median, data=AST_HEADS_CORPUS),),
                        ),
                    },
                )
            )
    role_table = ComparisonTable(
        name=_stem("head_roles", corpora),
        title="Specialized attention heads by role",
        caption=(
            "Heads whose role score passes the analysis threshold, and their median score (%). "
            "AST counts BPE-merging heads above 80%; its next-token figures hold for each of "
            "the three models (≈95%)."
        ),
        metrics=(
            Metric("heads", "heads", digits=0),
            Metric("median_confidence", "median confidence (%)", digits=1),
        ),
        rows=tuple(role_rows),
        provenance=provenance,
        sources=tuple(
            _paper_results()[i]["source"] for i in ("ast_positional_heads", "ast_bpe_merging_heads")
        ),
    )
    return js_table, role_table


# ---------------------------------------------------------------------------- LVM builder


@dataclass(frozen=True)
class _LvmMetric:
    key: str  # in the per-seed dicts
    label: str
    fraction: bool  # a fraction in [0, 1], shown as %
    published: str | None  # metric name in the published table
    spread: str | None = None  # its ± field


@dataclass(frozen=True)
class _LvmSpec:
    table_id: str
    title: str
    methods: Mapping[str, str]  # method key -> published system, in the thesis order
    extras: Mapping[str, str]  # method key -> row label (no published value)
    metrics: tuple[_LvmMetric, ...]


_MC_SYSTEMS = {
    "sfe": "SFE",
    "sfe_plus": "SFE+",
    "nvil": "NVIL",
    "gumbel": "Gumbel",
    "st_gumbel": "ST Gumbel",
}
_MARGINALIZATION = {
    "dense": "Dense (softmax, exact marginalization)",
    "sparsemax": "Sparse (sparsemax, proposed)",
}
_UNORDERED_SET = {"unordered_set": "Unordered set (Kool et al., 2020)"}
LVM_SPECS: dict[str, _LvmSpec] = {
    "ssvae": _LvmSpec(
        "marg_ssvae_mnist",
        "Semi-supervised VAE on MNIST (thesis Table 5.1)",
        {
            **{k: _MC_SYSTEMS[k] for k in ("sfe", "sfe_plus", "nvil")},
            "sum_and_sample": "Sum&Sample",
            **{k: _MC_SYSTEMS[k] for k in ("gumbel", "st_gumbel")},
            **_MARGINALIZATION,
        },
        _UNORDERED_SET,
        (
            _LvmMetric("accuracy", "accuracy (%)", True, "accuracy", "accuracy_se"),
            _LvmMetric(
                "decoder_calls", "decoder calls", False, "decoder_calls", "decoder_calls_se"
            ),
        ),
    ),
    "signal_game": _LvmSpec(
        "marg_signal_game",
        "Emergent communication game (thesis Table 5.2)",
        {
            "sfe_nll": "SFE (NLL)",
            "sfe_zero_one": "SFE (0/1)",
            "sfe_plus": "SFE+ (0/1)",
            **{k: _MC_SYSTEMS[k] for k in ("nvil", "gumbel", "st_gumbel")},
            **_MARGINALIZATION,
        },
        {"sum_and_sample": "Sum&Sample", **_UNORDERED_SET},
        (
            _LvmMetric(
                "communication_success",
                "communication success (%)",
                True,
                "communication_success",
                "communication_success_pm",
            ),
            _LvmMetric(
                "decoder_calls", "decoder calls", False, "decoder_calls", "decoder_calls_pm"
            ),
        ),
    ),
    "bitvector_vae": _LvmSpec(
        "marg_bitvector_vae_fmnist",
        "Bit-vector VAE on Fashion-MNIST (thesis Table 5.3)",
        {
            **_MC_SYSTEMS,
            "topk_sparsemax": "Top-k sparsemax",
            "sparsemap": "SparseMAP",
            "sparsemap_budget": "SparseMAP (w/ budget)",
        },
        {},
        (
            _LvmMetric("nll_bits_per_dim", "NLL bits/dim", False, "nll_bits_per_dim"),
            _LvmMetric("decoder_calls", "decoder calls", False, None),
        ),
    ),
}


def _latent_dims(results: Mapping[str, Sequence[Mapping[str, Any]]], published: dict) -> list[int]:
    """The bit-vector sizes D of the published columns and of the results, ascending."""
    dims = {int(m["name"].rsplit("_D", 1)[1]) for m in published["metrics"]}
    for method, runs in results.items():
        for i, run in enumerate(runs):
            value = run.get("latent_dim")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LearnableSparsityError(
                    f"results[{method!r}][{i}] latent_dim must be a positive integer, got {value!r}"
                )
            dims.add(value)
    return sorted(dims)


def lvm_table(
    experiment: str,
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    profile: str,
    data: str | Sequence[str],
) -> ComparisonTable:
    """Latent-variable results beside thesis Tables 5.1–5.3: mean ± standard error over seeds.

    ``experiment``: "ssvae", "signal_game" or "bitvector_vae". ``results``: {method: [one
    metric dict per seed]}; rows follow the thesis order, then the extra methods (no published
    value); only given methods appear. Methods and per-seed keys:

    * ssvae — sfe, sfe_plus, nvil, sum_and_sample, gumbel, st_gumbel, dense, sparsemax,
      unordered_set; {"accuracy": test accuracy as a fraction in [0, 1], "decoder_calls": …}.
    * signal_game — sfe_nll, sfe_zero_one (SFE with the NLL / 0-1 reward), sfe_plus (the thesis
      ran SFE+ with the 0-1 reward), nvil, gumbel, st_gumbel, dense, sparsemax, sum_and_sample,
      unordered_set; {"communication_success": fraction in [0, 1], "decoder_calls": …}.
    * bitvector_vae — sfe, sfe_plus, nvil, gumbel, st_gumbel, topk_sparsemax, sparsemap,
      sparsemap_budget; {"latent_dim": D, "nll_bits_per_dim": …, "decoder_calls": …}; one
      column pair per D (the published D = 32 and 128, and any D of the results).

    Fractions are shown as %. ``data``: the data set used (the publications': ``LVM_DATA``).
    """
    spec = LVM_SPECS[_known("experiment", experiment, LVM_SPECS)]
    datasets = _names("data", data)
    published = _paper_results()[spec.table_id]
    methods = _ordered("method", results, [*spec.methods, *spec.extras])
    for method in methods:
        for i, run in enumerate(results[method]):
            if not isinstance(run, Mapping):
                raise LearnableSparsityError(
                    f"results[{method!r}][{i}] must be a metric dict, got {type(run).__name__}"
                )
    dims: list[int | None] = (
        _latent_dims(results, published) if experiment == "bitvector_vae" else [None]
    )

    def column(metric: _LvmMetric, dim: int | None) -> tuple[str, str, str | None]:
        """(cell key, header label, published field) of ``metric`` at latent size ``dim``."""
        if dim is None:
            return metric.key, metric.label, metric.published
        field = None if metric.published is None else f"{metric.published}_D{dim}"
        return f"{metric.key}_D{dim}", f"{metric.label}, D={dim}", field

    rows = []
    for method in methods:
        system = spec.methods.get(method)
        row = _published_row(spec.table_id, system) if system else {}
        runs = results[method]
        cells = {}
        for dim in dims:
            selected = [(i, r) for i, r in enumerate(runs) if dim is None or r["latent_dim"] == dim]
            for metric in spec.metrics:
                key, _, field = column(metric, dim)
                values = []
                for i, run in selected:
                    if metric.key not in run:
                        raise LearnableSparsityError(
                            f"results[{method!r}][{i}] lacks {metric.key!r}"
                        )
                    name = f"results[{method!r}][{i}] {metric.key}"
                    if metric.fraction:
                        values.append(100 * _number_value(name, run[metric.key], 0.0, 1.0))
                    else:
                        values.append(_number_value(name, run[metric.key], 0.0))
                ref = Reference(
                    f"published {LVM_DATA[experiment]} ({published['source'].split(' (')[0]})",
                    row.get(field) if field else None,
                    row.get(metric.spread) if metric.spread else None,
                    LVM_DATA[experiment],
                )
                cells[key] = Cell(tuple(values), (ref,) if field else ())
        rows.append(Row(system or spec.extras[method], cells))
    pm = published.get("pm_meaning", "the source prints no ± for this table")
    return ComparisonTable(
        name=_stem(f"lvm_{experiment}", datasets),
        title=spec.title,
        caption=(
            f"{published['caption_summary']} Reproduced: mean ± standard error over seeds; "
            f"published ±: {pm}."
        ),
        metrics=tuple(
            Metric(key, label, spread="se")
            for dim in dims
            for key, label, _ in (column(metric, dim) for metric in spec.metrics)
        ),
        rows=tuple(rows),
        provenance=Provenance(profile, datasets),
        sources=(published["source"],),
    )
