"""DVC metrics: the small files of numbers that ``dvc metrics show/diff`` and ``dvc exp show``
tabulate, one per stage (``results/<stage>/metrics.json``, see ``dvc.yaml``).

DVC shows a number (or a boolean) as one column and silently drops lists, and every string and
every key becomes a column of its own: a metrics file holds numbers in nested dicts only
(:func:`check_scalar_metrics`), a handful per method. The stages keep their detailed results
(every seed, signatures, curves) in other files, which the claims and tables stages read.

Grid cells are keyed ``<group>/seed<k>`` (e.g. ``smoke/softmax/seed0``); :func:`cell_metrics`
turns their values into one entry per group, ``/`` in a group or a name nesting the dicts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from statistics import fmean
from typing import Any

from learnable_sparsity.errors import LearnableSparsityError

SEED = "/seed"


def split_seed(key: str) -> tuple[str, int]:
    """``("smoke/softmax", 0)`` for the cell key ``"smoke/softmax/seed0"``."""
    group, separator, seed = key.rpartition(SEED)
    if not separator or not seed.isdigit():
        raise ValueError(f"{key!r} is not a cell key ending in /seed<k>")
    return group, int(seed)


def scalar_summary(values_by_seed: Mapping[int, float]) -> dict[str, float]:
    """``{"mean": …, "seed0": …, "seed1": …}``: the mean over seeds, then each seed's value."""
    if not values_by_seed:
        raise ValueError("a summary needs at least one seed")
    seeds = {f"seed{seed}": float(values_by_seed[seed]) for seed in sorted(values_by_seed)}
    return {"mean": fmean(seeds.values()), **seeds}


def cell_metrics(
    values_by_cell: Mapping[str, Mapping[str, float | None]], per_seed: Collection[str] = ()
) -> dict[str, Any]:
    """Per group of cells, each named value over its seeds: a :func:`scalar_summary` for the
    names in ``per_seed`` (the headline numbers), the mean for the others. ``None`` values (not
    measured) are left out; ``/`` in group keys and names nests the result."""
    by_group: dict[str, dict[str, dict[int, float]]] = {}
    for key, values in values_by_cell.items():
        group, seed = split_seed(key)
        for name, value in values.items():
            if value is not None:
                by_group.setdefault(group, {}).setdefault(name, {})[seed] = value
    flat = {
        f"{group}/{name}": scalar_summary(seeds) if name in per_seed else fmean(seeds.values())
        for group, names in by_group.items()
        for name, seeds in names.items()
    }
    return nested(flat)


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a/b": 1}`` as ``{"a": {"b": 1}}``."""
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return tree


def check_scalar_metrics(data: Mapping[str, Any], where: str = "metrics") -> None:
    """Raise, naming the key, if ``data`` holds anything but numbers, booleans and dicts of them
    (DVC drops lists and turns strings into columns of their own)."""
    for key, value in data.items():
        path = f"{where}.{key}"
        if isinstance(value, Mapping):
            check_scalar_metrics(value, path)
        elif not isinstance(value, int | float):  # bool is an int
            kind = type(value).__name__
            raise LearnableSparsityError(f"{path} is a {kind}: a DVC metric must be a number")
