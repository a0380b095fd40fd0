"""The latent-variable figures: what they draw, and their errors."""

from __future__ import annotations

import pytest

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.reporting.figures import metric_against_decoder_calls, support_over_training


def test_one_marker_per_method_and_seed_on_a_log_axis() -> None:
    figure = metric_against_decoder_calls(
        {"dense": ([10.0, 10.0], [0.9, 0.92]), "sparsemax": ([1.2, 1.4], [0.91, 0.9])}, "accuracy"
    )
    (ax,) = figure.axes
    assert ax.get_xscale() == "log" and ax.get_ylabel() == "accuracy"
    offsets = [collection.get_offsets().tolist() for collection in ax.collections]
    assert offsets == [[[10.0, 0.9], [10.0, 0.92]], [[1.2, 0.91], [1.4, 0.9]]]
    assert [text.get_text() for text in ax.get_legend().get_texts()] == ["dense", "sparsemax"]


def test_support_curves_one_line_per_method() -> None:
    figure = support_over_training({"sparsemap": ([50, 100], [11.0, 6.0])})
    (line,) = figure.axes[0].get_lines()
    assert line.get_xdata().tolist() == [50, 100] and line.get_ydata().tolist() == [11.0, 6.0]


def test_errors_name_the_method() -> None:
    with pytest.raises(LearnableSparsityError, match="'sfe' has 2 decoder-call values for 1"):
        metric_against_decoder_calls({"sfe": ([1.0, 1.0], [0.5])}, "accuracy")
    with pytest.raises(LearnableSparsityError, match="at least one"):
        support_over_training({})
