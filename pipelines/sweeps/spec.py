"""Sweep specs: the stages a trial runs, a base profile, fixed overrides and the keys to vary.

A spec is a small YAML file; its name (``sweeps/ssvae_lr.yaml``: ``ssvae_lr``) names the sweep:
its reports in ``reports/sweeps/<name>/`` and its MLflow parent run ``sweep/<name>``::

    stages: [train_lvm@ssvae]      # run in this order in every trial, one grid cell each
    profile: smoke                 # params.yaml, with profiles/<profile>.yaml applied
    params:                        # fixed overrides, dotted keys
      lvm.ssvae.steps: 1500
    search:                        # the keys to vary: grid, choice, uniform, loguniform, randint
      lvm.ssvae.methods: {grid: [sparsemax, sfe, gumbel]}
      lvm.ssvae.lr.default: {loguniform: [1.0e-4, 1.0e-2]}
      lvm.ssvae.seeds: {grid: [0, 1, 2]}
    num_samples: 2                 # draws of the random keys, for every point of the grids
    metric: accuracy               # a trial's result to rank and plot (mode: max or min)
    mode: max
    asha: {metric: loss, mode: min, max_t: 1500, grace_period: 300}   # optional early stopping

A trial is one point of the search space: its params are the profile's, with ``params`` and the
trial's values applied, and it runs one cell of each stage's grid. A value given for a key that
holds a list (``nmt.variants``, ``lvm.ssvae.methods``, ``*.seeds``) selects that one entry; a
name given for a key that holds a mapping (``ape.regimes``) selects that entry.
:meth:`SweepSpec.check_trials` builds every stage's grid for every combination of the discrete
values (and the bounds of the ranges) before anything runs: a key that is not in the params, a
value its settings refuse, or a trial whose grid is not one cell is an error naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from learnable_sparsity.errors import LearnableSparsityError, MissingInputError
from learnable_sparsity.settings import Settings, SettingsError, build, setting
from pipelines import stages
from pipelines.scaffold.cells import Grid
from pipelines.scaffold.params import Params, load_params, with_profile
from pipelines.scaffold.runner import RaySettings
from pipelines.scaffold.stage import Stage

# A stage of the chain: its module under pipelines/ and, after "@", the argument of its grid
# (the latent-variable experiment). Each exposes ``grid(stage[, argument]) -> Grid``.
SWEEPABLE = (
    "train_nmt",
    "evaluate_nmt",
    "analyze_heads",
    "train_ape",
    "evaluate_ape",
    "train_lvm",
)
SEARCH_KINDS = ("grid", "choice", "uniform", "loguniform", "randint")
# The checks build each stage's grid for every combination of the discrete values; past this
# many the spec is better split.
MAX_CHECKED_COMBINATIONS = 2000


@dataclass(frozen=True, kw_only=True)
class TrialResources(Settings):
    """What one trial asks Ray for; ``cpus`` are also its torch threads."""

    cpus: float = setting(1.0, above=0)
    gpus: float = setting(0.0, at_least=0)


@dataclass(frozen=True, kw_only=True)
class AshaSettings(Settings):
    """Asynchronous successive halving (Ray Tune's ASHA) on a metric the trials log while they
    train (e.g. ``train/loss``, ``valid_nll``), against their training ``step``."""

    metric: str
    mode: Literal["min", "max"]
    max_t: int = setting(above=0)
    grace_period: int = setting(1, above=0)
    reduction_factor: float = setting(2.0, above=1)


@dataclass(frozen=True, kw_only=True)
class PlotSettings(Settings):
    """The sweep's figure: the metric against ``x`` (a search key or a trial result, e.g.
    ``decoder_calls``), one series per value of ``group`` (a search key); null: the first
    numeric search key, and the first other search key."""

    x: str | None = None
    group: str | None = None


@dataclass(frozen=True, kw_only=True)
class SweepSettings(Settings):
    """The spec's fields besides ``params`` and ``search`` (see the module docstring).

    ``resources``: per trial (null: ``ray.task_cpus`` / ``ray.task_gpus`` of the profile, what
    a stage's grid cell gets); ``max_concurrent``: trials at a time (null: as many as the
    cluster has room for);
    ``max_failures``: retries of a trial whose worker died or that raised (it resumes from its
    cells' checkpoints); ``storage``: where Ray Tune keeps the sweep's state and the trials their
    checkpoints (null: ``models/sweeps`` of the working directory; on a cluster of several
    nodes, a shared filesystem mounted at the same path on each).
    """

    stages: tuple[str, ...] = setting(distinct=True)
    profile: str = "smoke"
    metric: str
    mode: Literal["min", "max"]
    num_samples: int = setting(1, above=0)
    resources: TrialResources | None = None
    max_concurrent: int | None = setting(None, above=0)
    max_failures: int = setting(2, at_least=0)
    storage: str | None = None
    asha: AshaSettings | None = None
    plot: PlotSettings = dataclasses.field(default_factory=PlotSettings)

    def validate(self) -> None:
        if not self.stages:
            raise SettingsError("stages", "must name at least one stage")
        for stage in self.stages:
            if stage.partition("@")[0] not in SWEEPABLE:
                raise SettingsError("stages", f"has {stage!r}; sweepable: {list(SWEEPABLE)}")


@dataclass(frozen=True)
class Axis:
    """One key of the search: ``kind`` (grid, choice, uniform, loguniform, randint) over
    ``values`` (the discrete values, or a range's [low, high])."""

    key: str
    kind: str
    values: tuple[Any, ...]

    @property
    def discrete(self) -> bool:
        return self.kind in ("grid", "choice")

    def space(self) -> Any:
        """The Ray Tune search space of this axis."""
        from ray import tune

        if self.kind == "grid":
            return tune.grid_search(list(self.values))
        if self.kind == "choice":
            return tune.choice(list(self.values))
        return getattr(tune, self.kind)(*self.values)

    def checked_values(self) -> tuple[Any, ...]:
        """The values the checks try: every discrete value, or both ends of a range."""
        if self.kind == "randint":
            return (self.values[0], self.values[1] - 1)  # high is exclusive
        return self.values


def parse_axis(key: str, entry: Any) -> Axis:
    """The axis of ``search.<key>``: ``{grid: [...]}``, ``{choice: [...]}``,
    ``{uniform|loguniform|randint: [low, high]}``."""
    where = f"search.{key}"
    if not isinstance(entry, Mapping) or len(entry) != 1 or next(iter(entry)) not in SEARCH_KINDS:
        raise SettingsError(where, f"must be one of {{{', '.join(SEARCH_KINDS)}: [...]}}")
    kind, values = next(iter(entry.items()))
    if not isinstance(values, list) or not values:
        raise SettingsError(f"{where}.{kind}", f"must be a non-empty list, got {values!r}")
    if kind in ("grid", "choice"):
        return Axis(key, kind, tuple(values))
    numbers = [_number(v, f"{where}.{kind}") for v in values]
    if len(numbers) != 2 or not numbers[0] < numbers[1]:
        raise SettingsError(f"{where}.{kind}", f"must be [low, high] with low < high, got {values}")
    if kind == "loguniform" and numbers[0] <= 0:
        raise SettingsError(f"{where}.{kind}", "must be > 0 (a log scale)")
    if kind == "randint" and not all(float(n).is_integer() for n in numbers):
        raise SettingsError(f"{where}.{kind}", f"must be integers, got {values}")
    if kind == "randint":
        numbers = [int(n) for n in numbers]
    return Axis(key, kind, tuple(numbers))


def _number(value: Any, where: str) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SettingsError(where, f"must hold numbers, got {value!r}")
    return value


def apply_override(data: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Set dotted ``key`` of the nested params ``data`` to ``value`` (in place). The key must
    exist. A value that is not a list, given for a key holding a list, selects that one entry;
    a name given for a key holding a mapping keeps only that entry."""
    *path, last = key.split(".")
    node = data
    for depth, part in enumerate(path):
        child = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(child, Mapping):
            raise SettingsError(
                where,
                f"names {key!r}, but {'.'.join(path[: depth + 1])} is not a section of the params",
            )
        node[part] = child = dict(child)
        node = child
    if last not in node:
        raise SettingsError(
            where,
            f"names {key!r}, which is not in the params; "
            f"{'.'.join(path) or 'the top level'} has {sorted(node)}",
        )
    current = node[last]
    if isinstance(current, list) and not isinstance(value, list):
        value = [value]
    elif isinstance(current, Mapping) and not isinstance(value, Mapping):
        if value not in current:
            raise SettingsError(where, f"selects {value!r} of {key}, which has {sorted(current)}")
        value = {value: current[value]}
    node[last] = value


def stage_grid(stage: Stage, name: str) -> Grid:
    """The grid of chain stage ``name`` (``train_lvm@ssvae``: ``train_lvm.grid(stage, "ssvae")``)
    on ``stage``'s params: the stage's own code, imported by name (a sweep is not a stage)."""
    argument = name.partition("@")[2]
    grid: Callable[..., Grid] = importlib.import_module(stages.module(name)).grid
    return grid(stage, argument) if argument else grid(stage)


@dataclass(frozen=True)
class SweepSpec:
    """A parsed, validated sweep spec; ``base`` is the profile's params with ``params`` applied."""

    name: str
    source: str
    settings: SweepSettings
    base: Mapping[str, Any]
    overrides: Mapping[str, Any]
    axes: tuple[Axis, ...]

    @property
    def resources(self) -> TrialResources:
        """What each trial asks for: the spec's ``resources``, else a grid cell's (params
        ``ray.task_cpus`` and ``ray.task_gpus``: the paper profile gives each a GPU)."""
        if self.settings.resources is not None:
            return self.settings.resources
        ray = self.params.settings("ray", RaySettings)
        return TrialResources(cpus=ray.task_cpus, gpus=ray.task_gpus)

    @property
    def params(self) -> Params:
        """The params every trial starts from (the profile with the fixed overrides)."""
        return Params(self.base, self.source)

    def params_for(self, config: Mapping[str, Any]) -> Params:
        """The params of the trial with the search values ``config`` (by key)."""
        data = _copy(self.base)
        for axis in self.axes:
            apply_override(data, axis.key, config[axis.key], f"{self.source}: search.{axis.key}")
        return Params(data, f"{self.source} (trial {dict(config)})")

    def search_space(self) -> dict[str, Any]:
        return {axis.key: axis.space() for axis in self.axes}

    def combinations(self) -> Iterator[dict[str, Any]]:
        """Every combination of the checked values of the axes."""
        keys = [axis.key for axis in self.axes]
        for values in itertools.product(*(axis.checked_values() for axis in self.axes)):
            yield dict(zip(keys, values, strict=True))

    def check_trials(self, uri: str) -> list[Path]:
        """Build each stage's grid for every combination of values (see the module docstring):
        errors name the spec, the values and the problem. Returns the input files the trials
        read that no stage of the chain writes (they must be there before any trial starts)."""
        count = math.prod(len(axis.checked_values()) for axis in self.axes)
        if count > MAX_CHECKED_COMBINATIONS:
            raise LearnableSparsityError(
                f"{self.source}: the search has {count} combinations of values to check (more "
                f"than {MAX_CHECKED_COMBINATIONS}); split the sweep"
            )
        inputs: set[Path] = set()
        for config in self.combinations():
            stores: list[Path] = []
            stage = Stage(f"sweep/{self.name}", self.params_for(config), uri)
            for name in self.settings.stages:
                try:
                    grid = stage_grid(stage, name)
                except LearnableSparsityError as error:
                    # A missing input stays one: the sweep says how to send the data along.
                    missing = isinstance(error, MissingInputError)
                    kind = MissingInputError if missing else LearnableSparsityError
                    raise kind(f"{name} of the trial {config}: {error}") from None
                if len(grid.cells) != 1:
                    raise LearnableSparsityError(
                        f"{self.source}: the trial {config} gives {name} {len(grid.cells)} grid "
                        f"cells ({[cell.key for cell in grid.cells]}), a trial runs one: vary or "
                        "fix the keys that make the grid (corpora, variants, methods, systems, "
                        "regimes, seeds)"
                    )
                inputs |= {
                    path
                    for path in grid.cells[0].inputs
                    if not any(path.is_relative_to(store) for store in stores)
                }
                stores.append(grid.store)
        return sorted(inputs)


def _copy(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {key: _copy(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_copy(value) for value in data]
    return data


def load_spec(path: Path, params_file: Path, profiles: Path) -> SweepSpec:
    """Parse and validate the spec at ``path`` on ``params_file`` (the smoke profile) and the
    profile overlays in ``profiles``; every error names the spec and the key."""
    source = str(path)
    if not path.is_file():
        raise LearnableSparsityError(f"sweep spec {path} does not exist")
    if not all(c.isalnum() or c in "-_." for c in path.stem):
        raise LearnableSparsityError(f"{path}: name it with letters, digits, -, _ and . only")
    raw = load_params(path).data
    entries = dict(raw)
    overrides, search = entries.pop("params", None) or {}, entries.pop("search", None) or {}
    try:
        if not isinstance(overrides, Mapping):
            raise SettingsError("params", "must be a mapping of dotted keys to values")
        if not isinstance(search, Mapping) or not search:
            raise SettingsError("search", "must map at least one dotted key to its values")
        settings = build(SweepSettings, entries)
        axes = tuple(parse_axis(str(key), entry) for key, entry in search.items())
        clash = sorted(set(overrides) & set(search))
        if clash:
            raise SettingsError("search", f"and params both set {clash}")
        try:
            profile = with_profile(load_params(params_file), settings.profile, profiles)
        except LearnableSparsityError as error:
            raise SettingsError("profile", str(error)) from None
        base = _copy(profile.data)
        for key, value in overrides.items():
            apply_override(base, str(key), value, f"params.{key}")
        for axis in axes:  # each key is in the params (its values are checked by check_trials)
            apply_override(_copy(base), axis.key, axis.checked_values()[0], f"search.{axis.key}")
        _check_plot(settings.plot, axes)
    except SettingsError as error:
        raise LearnableSparsityError(f"{source}: {error}") from None
    return SweepSpec(path.stem, source, settings, base, dict(overrides), axes)


def _check_plot(plot: PlotSettings, axes: Sequence[Axis]) -> None:
    keys = [axis.key for axis in axes]
    if plot.group is not None and plot.group not in keys:
        raise SettingsError("plot.group", f"must be a search key ({keys}), got {plot.group!r}")
