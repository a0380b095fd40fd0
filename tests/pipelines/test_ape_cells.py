"""The APE cells' input fitting: BERT's positions restart at each segment of ``src [SEP] mt``."""

from __future__ import annotations

from pipelines.cells.ape import fit_positions, segment_lengths

SEP = 3


def test_segment_lengths_count_the_separator_with_src() -> None:
    assert segment_lengths([10, 11, SEP, 20, 21, 22], SEP) == (3, 3)
    assert segment_lengths([10, SEP], SEP) == (2, 0)


def test_fit_positions_cuts_each_segment_and_keeps_the_separator() -> None:
    joint = [10, 11, 12, 13, SEP, 20, 21, 22, 23, 24]
    assert fit_positions(joint, SEP, 3) == [10, 11, SEP, 20, 21, 22]
    assert max(segment_lengths(fit_positions(joint, SEP, 3), SEP)) == 3
    assert fit_positions(joint, SEP, 10) == joint  # short inputs are left alone
