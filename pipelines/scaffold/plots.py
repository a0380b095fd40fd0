"""DVC plot data: long CSVs that the top-level ``plots:`` of ``dvc.yaml`` draw, one chart per
family of curves.

One row per point: the chart's x and y columns, ``series`` (the colour: a variant, a method, a
head) and ``run`` (one line or point set: a grid cell), plus ``facet`` (a panel: an attention
block) where a chart has panels. The templates in ``.dvc/plots/`` draw by these columns, so a
chart has one series per variant, method or seed whatever the params name, and
``dvc plots diff`` tells revisions apart by the dashes of their lines.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pipelines.scaffold.metrics import split_seed

SERIES, RUN, FACET = "series", "run", "facet"


def long_csv(rows: Iterable[Mapping[str, object]], columns: Sequence[str]) -> str:
    """``rows`` as CSV with the header ``columns`` (each row has every column)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n", extrasaction="raise")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def curve_rows(curve: Iterable[tuple[float, float]], y: str, key: str) -> list[dict[str, object]]:
    """The points (step, value) of grid cell ``key``: series is the cell without its seed."""
    series = split_seed(key)[0]
    return [{"step": step, SERIES: series, RUN: key, y: value} for step, value in curve]


def curves_csv(histories: Mapping[str, Mapping], part: str, column: str) -> str:
    """A long CSV (step, series, run, ``column``) of the training history ``part`` (train or
    valid rows) of every cell."""
    rows = [
        row
        for key, history in histories.items()
        for row in curve_rows(((r["step"], r[column]) for r in history[part]), column, key)
    ]
    return long_csv(rows, ("step", SERIES, RUN, column))


def read_curves(path: Path, y: str) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """series → run → [(step, y)] of a long CSV, in the order of its rows (empty y left out)."""
    curves: dict[str, dict[str, list[tuple[float, float]]]] = {}
    with Path(path).open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row[y]:
                point = (float(row["step"]), float(row[y]))
                curves.setdefault(row[SERIES], {}).setdefault(row[RUN], []).append(point)
    return curves
