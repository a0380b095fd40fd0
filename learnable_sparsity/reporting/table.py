r"""The comparison-table model: the publications' numbers beside the numbers reproduced here.

A :class:`ComparisonTable` has rows (:class:`Row`: a system — an attention variant, an
estimator, an attention block) and metric columns (:class:`Metric`). Each :class:`TableCell` holds
the reproduced values over seeds and the published numbers it should be read beside
(:class:`Reference`). A reproduced cell stands for

    mean ± spread (n=…)      spread = sample std (ddof 1) or standard error std/√n,

with the spread only when n ≥ 2. The difference reproduced − published is computed **only**
when the run used the ``paper`` profile (:data:`PAPER_PROFILE`) *and* the published number was
measured on one of the data sets the run used (``Reference.data`` ∈ ``Provenance.data``).
Otherwise there is no difference, and for any profile other than ``paper`` the scope of the
reproduced numbers (:attr:`Provenance.scope`) and the caption say
"<profile> profile on <data> — not comparable to the publication" (:data:`NOT_COMPARABLE`):
smoke or CI numbers are never presented as a paper-scale reproduction.

The ``check_*`` helpers and :func:`file_stem` validate the builders' plain inputs (names,
finite numbers, per-seed values, known keys) and name the table files; each error names the
offending input.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Literal

from learnable_sparsity.errors import LearnableSparsityError

PAPER_PROFILE = "paper"
NOT_COMPARABLE = "not comparable to the publication"
Spread = Literal["std", "se"]
SPREAD_LABELS: dict[str, str] = {"std": "mean ± std", "se": "mean ± standard error"}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


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
class TableCell:
    """One system and metric: the reproduced ``values`` (one per seed), the published
    ``references`` to read them beside, and a ``note`` shown instead of the reproduced value
    when there is none (e.g. "not measurable"; None: "—") and after it otherwise (e.g. the
    strongest head when no head holds a role)."""

    values: tuple[float, ...] = ()
    references: tuple[Reference, ...] = ()
    note: str | None = None

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
    cells: Mapping[str, TableCell]


@dataclass(frozen=True)
class Provenance:
    """Where the reproduced numbers come from: the scale ``profile`` ("smoke", "paper", "ci",
    …), the ``data`` sets used, the sacreBLEU ``signatures``, the ``device``, when given, and
    what a cell's n values are (``replicates``: training seeds, or the timing rounds of one
    model)."""

    profile: str
    data: tuple[str, ...]
    signatures: tuple[str, ...] = ()
    device: str | None = None
    replicates: str = "seeds"

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

    def difference(self, metric: Metric, cell: TableCell, reference: Reference) -> float | None:
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
            for ref in row.cells.get(metric.key, TableCell()).references
            if ref.value is not None and metric.comparable and not self.comparable(metric, ref)
        }
        if elsewhere:
            text += (
                f" Published numbers on other data ({', '.join(sorted(elsewhere))}) are"
                " shown for reference only; no difference is computed for them."
            )
        return text


# ---------------------------------------------------------------------------- input checks


def check_names(key: str, value: str | Sequence[str] | None) -> tuple[str, ...]:
    """A name or names as a tuple (None: empty); each a non-empty string."""
    names = () if value is None else (value,) if isinstance(value, str) else tuple(value)
    for name in names:
        if not isinstance(name, str) or not name:
            raise LearnableSparsityError(f"{key} must hold non-empty strings, got {name!r}")
    return names


def check_number(key: str, value: object, low: float = -math.inf, high: float = math.inf) -> float:
    """``value`` as a float; it must be a finite real number in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise LearnableSparsityError(f"{key} must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise LearnableSparsityError(f"{key} must lie in [{low}, {high}], got {value!r}")
    return float(value)


def check_seed_values(key: str, values: float | Sequence[float]) -> tuple[float, ...]:
    """One value or a sequence of per-seed values, checked."""
    if isinstance(values, Real):
        values = [values]
    return tuple(check_number(f"{key}[{i}]", v) for i, v in enumerate(values))


def check_known(key: str, name: str, known: Iterable[str]) -> str:
    """``name``, which must be one of ``known``."""
    known = list(known)
    if name not in known:
        raise LearnableSparsityError(f"unknown {key} {name!r}; expected one of {', '.join(known)}")
    return name


def check_ordered(key: str, names: Iterable[str], order: Sequence[str]) -> list[str]:
    """``names`` (each checked against ``order``) sorted in ``order``."""
    present = {check_known(key, name, order) for name in names}
    if not present:
        raise LearnableSparsityError(f"no {key} given; expected some of {', '.join(order)}")
    return [name for name in order if name in present]


def file_stem(prefix: str, names: Sequence[str]) -> str:
    """``prefix_name1_name2`` with characters outside [A-Za-z0-9_.-] replaced by "-"."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", "_".join([prefix, *names]))
