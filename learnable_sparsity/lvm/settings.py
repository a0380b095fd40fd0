r"""The settings and the grid of the latent-variable experiments.

:class:`LvmSettings` holds the settings the three experiments share (params
``lvm.<experiment>``; each experiment's module subclasses it with its own keys, its
``KNOWN_METHODS`` and its ``HEADLINE`` metric) and lists the grid of :class:`LvmCell`\ s (method
× seed, and the bit-vector VAE's latent sizes); :meth:`LvmSettings.for_cell` narrows per-method
tables and per-series overrides to one cell, :meth:`LvmSettings.run_settings` gives what a cell's
checkpoint is written under.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from learnable_sparsity.precision import Precision
from learnable_sparsity.settings import Settings, SettingsError, setting

# The entry of a per-method table (``lr``, ``entropy_coef``) that applies to unlisted methods.
DEFAULT = "default"


@dataclass(frozen=True)
class LvmCell:
    """One run of a grid: ``method`` with ``seed`` (and ``bits`` = D for the bit-vector VAE)."""

    method: str
    seed: int
    bits: int | None = None

    @property
    def series(self) -> str:
        """``[D<bits>/]<method>``: the cell's name without its seed (what ``overrides`` keys)."""
        prefix = "" if self.bits is None else f"D{self.bits}/"
        return f"{prefix}{self.method}"

    @property
    def key(self) -> str:
        """``[D<bits>/]<method>/seed<seed>``: the cell's name in paths and logs."""
        return f"{self.series}/seed{self.seed}"


@dataclass(frozen=True, kw_only=True)
class LvmSettings(Settings):
    """What the three latent-variable experiments share (params ``lvm.<experiment>``).

    ``data``: the image or game data set; ``methods`` × ``seeds``: the grid; ``steps`` Adam steps
    on batches of ``batch_size``, learning rate ``lr`` (a table: an entry per method, ``default``
    for the others) and ``weight_decay`` (Adam's L2 term; the released SSVAE code's 1e-5);
    ``gumbel_rate``: r of the Gumbel temperature τ = max(0.5, exp(−r·t));
    metrics logged every ``log_every`` steps, a checkpoint every ``checkpoint_every``;
    ``precision``: the arithmetic of the training steps (:mod:`learnable_sparsity.precision`).
    ``overrides``: settings of single series of cells, keyed by :attr:`LvmCell.series`
    (``sparsemap``, or ``D128/sparsemap`` where D is an axis), e.g.
    ``{D128/sparsemap: {batch_size: 16}}``: the released scripts set some values per method and
    size (any key but the grid's axes, ``data`` and ``overrides``; a per-method table's key takes
    the cell's value).

    A subclass sets ``KNOWN_METHODS`` (what ``methods`` may name), ``PER_METHOD`` (its tables
    keyed by method), ``GRID`` (its fields that are grid axes rather than a run's settings) and
    ``HEADLINE`` (its test metric and the label reports give it).
    """

    KNOWN_METHODS: ClassVar[tuple[str, ...]] = ()
    PER_METHOD: ClassVar[tuple[str, ...]] = ("lr",)
    GRID: ClassVar[tuple[str, ...]] = ("methods", "seeds")
    # The experiment's headline test metric: (key of the evaluation's metrics, label).
    HEADLINE: ClassVar[tuple[str, str]] = ("", "")

    data: str
    methods: tuple[str, ...] = setting(distinct=True)
    seeds: tuple[int, ...] = setting(at_least=0, distinct=True)
    steps: int = setting(at_least=1)
    batch_size: int = setting(at_least=1)
    lr: dict[str, float] = setting(above=0)
    weight_decay: float = setting(0.0, at_least=0)
    gumbel_rate: float = setting(at_least=0)
    log_every: int = setting(at_least=1)
    checkpoint_every: int = setting(at_least=1)
    precision: Precision = "float32"
    overrides: dict[str, dict[str, float]] | None = None

    def validate(self) -> None:
        for axis in self.GRID:
            if not getattr(self, axis):
                raise SettingsError(axis, "is empty: a grid axis needs at least one entry")
        known = self.KNOWN_METHODS
        for name in self.methods:
            if name not in known:
                raise SettingsError("methods", f"has {name!r}; choose from {sorted(known)}")
        for key in self.PER_METHOD:
            table = getattr(self, key)
            if DEFAULT not in table:
                raise SettingsError(f"{key}.{DEFAULT}", "is missing (it serves unlisted methods)")
            unknown = sorted(set(table) - {DEFAULT, *known})
            if unknown:
                raise SettingsError(
                    key, f"has {unknown}: neither {DEFAULT!r} nor one of {sorted(known)}"
                )
        for series, values in (self.overrides or {}).items():
            self._check_series(series)
            try:
                self._overridden(values)
            except SettingsError as error:
                raise error.within(f"overrides.{series}") from None

    def _check_series(self, series: str) -> None:
        """Refuse an ``overrides`` key that cannot name a series of this experiment's cells."""
        *size, method = series.split("/")
        sized = "bits" in self.GRID
        if (
            method not in self.KNOWN_METHODS
            or len(size) != sized
            or (sized and not (size[0].startswith("D") and size[0][1:].isdigit()))
        ):
            form = "D<bits>/<method>" if sized else "<method>"
            raise SettingsError(
                "overrides",
                f"has {series!r}, which is not {form} with a method of "
                f"{sorted(self.KNOWN_METHODS)}",
            )

    def _overridden(self, values: Mapping[str, float]) -> Self:
        """These settings with ``values`` in place (an override of one series, already resolved
        to its cell: no overrides left); integer keys take whole numbers only."""
        fixed = {*self.GRID, "data", "overrides"}
        known = [f.name for f in dataclasses.fields(self) if f.name not in fixed]
        hints = typing.get_type_hints(type(self))
        replaced: dict[str, Any] = {}
        for key, value in values.items():
            if key not in known:
                raise SettingsError(key, f"cannot be overridden per cell; choose from {known}")
            if key in self.PER_METHOD:
                replaced[key] = {DEFAULT: value}
            elif hints[key] is int:
                if not float(value).is_integer():
                    raise SettingsError(key, f"must be a whole number, got {value}")
                replaced[key] = int(value)
            else:
                replaced[key] = value
        return dataclasses.replace(self, overrides=None, **replaced)

    def per_method(self, key: str, method: str) -> float:
        """The value of the per-method table ``key`` (``lr``, …) for ``method``: its own entry,
        else the ``default`` one."""
        table = getattr(self, key)
        return table.get(method, table[DEFAULT])

    def cells(self) -> list[LvmCell]:
        """The grid: methods × seeds in params order (one method's seeds together)."""
        return [LvmCell(method, seed) for method in self.methods for seed in self.seeds]

    def for_cell(self, cell: LvmCell) -> Self:
        """These settings narrowed to ``cell``: its grid axes hold only the cell's values, each
        per-method table only the cell's value (as ``default``) and its series' overrides are in
        place. A one-cell grid whose settings
        say exactly what the cell's run depends on (the pipeline fingerprints them)."""
        values = {"methods": (cell.method,), "seeds": (cell.seed,), "bits": (cell.bits,)}
        axes = {axis: values[axis] for axis in self.GRID}
        tables = {key: {DEFAULT: self.per_method(key, cell.method)} for key in self.PER_METHOD}
        narrowed = dataclasses.replace(self, **axes, **tables, overrides=None)
        return narrowed._overridden((self.overrides or {}).get(cell.series, {}))

    def run_settings(self, cell: LvmCell) -> dict[str, Any]:
        """The settings the run of ``cell`` depends on (what its checkpoint is checked against):
        every field but the grid axes, each per-method table and override resolved for the cell
        (so that another method's entry leaves this run alone), and the cell itself."""
        narrowed = self.for_cell(cell)
        skipped = {*self.GRID, "overrides"}
        values = {k: v for k, v in dataclasses.asdict(narrowed).items() if k not in skipped}
        tables = {key: narrowed.per_method(key, cell.method) for key in self.PER_METHOD}
        return values | tables | dataclasses.asdict(cell)
