"""A sweep's summary: one row per trial (its outcome, search values and results) as CSV and
Markdown, and the figure of its metric against a search key or another result."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    from matplotlib.figure import Figure

Row = Mapping[str, Any]


def columns(rows: Sequence[Row]) -> list[str]:
    """Every column of ``rows``, in the order they first appear."""
    return list(dict.fromkeys(key for row in rows for key in row))


def summary_csv(rows: Sequence[Row]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns(rows), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value).replace("|", "\\|")


def summary_markdown(
    title: str,
    rows: Sequence[Row],
    shown: Sequence[str],
    metric: str,
    mode: str,
    groups: Sequence[str] = (),
) -> str:
    """A Markdown table of ``rows`` with the ``shown`` columns, best ``metric`` first (the
    trials that did not finish last), under a line naming the best trial and the counts; with
    ``groups`` (the search keys other than seeds), first a table of the metric's mean ± sd over
    the trials of each combination of their values."""
    finished = [row for row in rows if isinstance(row.get(metric), float)]
    ordered = sorted(finished, key=lambda row: row[metric], reverse=mode == "max")
    ordered += [row for row in rows if row not in finished]
    counts = {status: sum(row["status"] == status for row in rows) for status in _statuses(rows)}
    lines = [f"# Sweep {title}", ""]
    lines.append(", ".join(f"{n} {status}" for status, n in counts.items()) + f" of {len(rows)}.")
    if ordered and ordered[0] in finished:
        best = ordered[0]
        lines.append(f"Best {metric} ({mode}): {_text(best[metric])}, trial {best['name']}.")
    if groups and finished:
        lines += ["", *_means(finished, groups, metric, mode)]
    lines += ["", "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(_text(row.get(c)) for c in shown) + " |" for row in ordered]
    failed = [row for row in ordered if row.get("error")]
    if failed:
        lines += ["", "Errors:", ""]
        lines += [f"- {row['name']}: {_text(row['error'])}" for row in failed]
    return "\n".join(lines) + "\n"


def _means(finished: Sequence[Row], groups: Sequence[str], metric: str, mode: str) -> list[str]:
    """A Markdown table: per combination of ``groups`` values, the mean ± sd of ``metric``
    over its finished trials (seeds), best first."""
    values: dict[tuple, list[float]] = {}
    for row in finished:
        values.setdefault(tuple(row.get(key) for key in groups), []).append(row[metric])
    ranked = sorted(values.items(), key=lambda item: statistics.fmean(item[1]))
    if mode == "max":
        ranked.reverse()
    lines = [f"| {' | '.join(groups)} | {metric} (mean ± sd) | trials |"]
    lines.append("|" + "---|" * (len(groups) + 2))
    for key, numbers in ranked:
        spread = statistics.stdev(numbers) if len(numbers) > 1 else 0.0
        cells = [_text(value) for value in key]
        mean = f"{statistics.fmean(numbers):.4g} ± {spread:.2g}"
        lines.append(f"| {' | '.join(cells)} | {mean} | {len(numbers)} |")
    return lines


def _statuses(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(row["status"] for row in rows))


def sweep_figure(
    rows: Sequence[Row], x: str, y: str, group: str | None, *, log_x: bool = False
) -> Figure:
    """``y`` against ``x`` for the finished ``rows``, a series per value of ``group``: every
    trial as a faint point, the mean over trials with equal ``x`` (seeds) as a line with ±1 sd.
    An ``x`` of names (systems, methods) is drawn as categories, in the order they come."""
    figure = Figure(figsize=(6.4, 4.2), layout="constrained")
    axes = figure.subplots()
    usable = [row for row in rows if row.get(x) is not None and _is_number(row.get(y))]
    names = list(dict.fromkeys(str(r[x]) for r in usable if not _is_number(r[x])))
    if names:  # categories at 0, 1, 2, ...
        usable = [{**row, x: names.index(str(row[x]))} for row in usable]
        axes.set_xticks(range(len(names)), names, rotation=20, ha="right")
    series: dict[str, list[Row]] = {}
    for row in usable:
        series.setdefault("all" if group is None else str(row.get(group)), []).append(row)
    for index, (label, members) in enumerate(sorted(series.items())):
        colour = f"C{index % 10}"
        axes.scatter([r[x] for r in members], [r[y] for r in members], color=colour, alpha=0.35)
        points = sorted({r[x] for r in members})
        values = [[r[y] for r in members if r[x] == point] for point in points]
        means = [statistics.fmean(v) for v in values]
        spread = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
        axes.errorbar(points, means, yerr=spread, color=colour, marker="o", capsize=3, label=label)
    if log_x and not names:
        axes.set_xscale("log")
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    if group is not None and series:
        axes.legend(title=group, fontsize="small")
    if not usable:
        axes.text(0.5, 0.5, "no finished trial", ha="center", transform=axes.transAxes)
    return figure


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
