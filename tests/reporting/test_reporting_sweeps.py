"""A sweep's summary: the table best first, the counts, the errors; the figure of its metric."""

from __future__ import annotations

import csv
import io

import pytest

from learnable_sparsity.reporting.sweeps import summary_csv, summary_markdown, sweep_figure

ROWS = [
    {"trial": "a", "name": "lr=0.001 m=sfe", "status": "finished", "lr": 0.001, "m": "sfe",
     "accuracy": 0.61},
    {"trial": "b", "name": "lr=0.01 m=sfe", "status": "failed", "lr": 0.01, "m": "sfe",
     "error": "LearnableSparsityError: non-finite loss | at step 3"},
    {"trial": "c", "name": "lr=0.001 m=dense", "status": "finished", "lr": 0.001, "m": "dense",
     "accuracy": 0.83},
    {"trial": "d", "name": "lr=0.01 m=dense", "status": "stopped early", "lr": 0.01, "m": "dense"},
]  # fmt: skip


def test_the_markdown_summary_puts_the_best_first_and_says_what_failed() -> None:
    text = summary_markdown("demo", ROWS, ["name", "status", "accuracy"], "accuracy", "max")
    assert "2 finished, 1 failed, 1 stopped early of 4." in text
    assert "Best accuracy (max): 0.83, trial lr=0.001 m=dense." in text
    rows = [line for line in text.splitlines() if line.startswith("| lr=")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| lr=0.001 m=dense",
        "| lr=0.001 m=sfe",
        "| lr=0.01 m=sfe",
        "| lr=0.01 m=dense",
    ]
    assert "- lr=0.01 m=sfe: LearnableSparsityError: non-finite loss \\| at step 3" in text
    lowest = summary_markdown("demo", ROWS, ["name", "accuracy"], "accuracy", "min")
    assert "Best accuracy (min): 0.61" in lowest


def test_the_csv_summary_has_every_column_of_every_row() -> None:
    rows = list(csv.DictReader(io.StringIO(summary_csv(ROWS))))
    assert list(rows[0]) == ["trial", "name", "status", "lr", "m", "accuracy", "error"]
    assert [row["accuracy"] for row in rows] == ["0.61", "", "0.83", ""]


@pytest.mark.parametrize("log_x", [False, True])
def test_the_figure_draws_a_series_per_group_with_the_mean_over_seeds(log_x: bool) -> None:
    rows = [
        {"lr": lr, "m": m, "seed": seed, "accuracy": 0.5 + lr * 10 + (m == "dense") * 0.2 + seed}
        for lr in (0.001, 0.01)
        for m in ("sfe", "dense")
        for seed in (0.0, 0.01)
    ]
    figure = sweep_figure([*rows, ROWS[1]], "lr", "accuracy", "m", log_x=log_x)
    axes = figure.axes[0]
    assert axes.get_xscale() == ("log" if log_x else "linear")
    lines = [container.lines[0] for container in axes.containers]  # the errorbar lines
    assert len(lines) == 2  # one mean line per method; the failed trial is left out
    means = sorted(tuple(line.get_ydata()) for line in lines)
    assert means[0] == pytest.approx((0.515, 0.605))  # sfe: the mean of two seeds per lr
    assert [t.get_text() for t in axes.get_legend().get_texts()] == ["dense", "sfe"]


def test_names_on_the_x_axis_are_categories() -> None:
    rows = [{"system": s, "ter": t} for s, t in [("tied", 20.0), ("init", 22.0), ("tied", 21.0)]]
    axes = sweep_figure(rows, "system", "ter", None).axes[0]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["tied", "init"]
    (line,) = [container.lines[0] for container in axes.containers]
    assert list(line.get_ydata()) == [20.5, 22.0]


def test_the_means_over_seeds_rank_the_settings() -> None:
    rows = [
        {"name": f"{m} {s}", "status": "finished", "m": m, "seed": s, "acc": acc}
        for m, s, acc in [("a", 0, 0.5), ("a", 1, 0.7), ("b", 0, 0.8), ("b", 1, 0.8)]
    ]
    text = summary_markdown("demo", rows, ["name", "acc"], "acc", "max", ["m"])
    means = text[text.index("| m | acc (mean ± sd) | trials |") :].splitlines()
    assert means[2:4] == ["| b | 0.8 ± 0 | 2 |", "| a | 0.6 ± 0.14 | 2 |"]
