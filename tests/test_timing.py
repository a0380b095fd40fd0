"""Tests for ``learnable_sparsity.timing``: interleaving, warm-up, per-round ratios, spread, noisy
flag.

Every measurement here is a fake whose value the test controls (no clock is read except the fake
one), so the checks are exact and never depend on the machine's speed.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.timing import (
    NOISY_RELATIVE_SPREAD,
    RatioSummary,
    calls_for,
    interleaved_rounds,
    machine,
    quartiles,
    spreads_overlap,
    summarize,
    timed,
)
from tests.conftest import refused


class Fake:
    """Measurement callables that log each call and return the next value of a script."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def measure(self, function: str, quantity: str, values: list[float]):
        script = iter(values)

        def call() -> float:
            self.calls.append((function, quantity))
            return next(script)

        return call


def test_warmup_runs_each_measurement_first_then_rounds_run_every_pair_in_a_shuffled_order():
    fake = Fake()
    names = ["base", "a", "b", "c"]
    # warm-up value 99 (must be discarded), then one value per round
    measures = {
        n: {q: fake.measure(n, q, [99.0] + [1.0] * 6) for q in ("fwd", "bwd")} for n in names
    }
    result = interleaved_rounds(measures, "base", rounds=6, warmup=1, seed=3)
    pairs = [(n, q) for n in names for q in ("fwd", "bwd")]
    assert fake.calls[: len(pairs)] == pairs  # warm-up: once each, in the given order
    rounds = [fake.calls[len(pairs) * (i + 1) : len(pairs) * (i + 2)] for i in range(6)]
    assert [tuple(r) for r in rounds] == list(result.order)
    assert all(sorted(r) == sorted(pairs) for r in rounds)  # every pair once per round
    assert len({tuple(r) for r in rounds}) > 1  # the order changes between rounds
    # no measurement always follows the same neighbour
    for pair in pairs:
        before = {r[r.index(pair) - 1] if r.index(pair) else None for r in rounds}
        assert len(before) > 1, pair
    assert result.summary["a"]["fwd"].values == (1.0,) * 6  # the warm-up's 99 is not counted
    # the order is reproducible with the seed and differs with another seed
    again = interleaved_rounds(
        {n: {q: (lambda: 1.0) for q in ("fwd", "bwd")} for n in names},
        "base",
        rounds=6,
        seed=3,
    )
    assert again.order == result.order
    other = interleaved_rounds(
        {n: {q: (lambda: 1.0) for q in ("fwd", "bwd")} for n in names},
        "base",
        rounds=6,
        seed=4,
    )
    assert other.order != result.order


def test_no_warmup_and_repeats_in_a_row_with_the_median_as_the_rounds_value() -> None:
    fake = Fake()
    measures = {
        "base": {"t": fake.measure("base", "t", [2.0, 2.0, 2.0, 4.0, 4.0, 4.0])},
        "x": {"t": fake.measure("x", "t", [1.0, 9.0, 3.0, 5.0, 6.0, 100.0])},
    }
    result = interleaved_rounds(measures, "base", rounds=2, repeats=3, warmup=0)
    assert len(fake.calls) == 12  # no warm-up call
    for order in result.order:  # each pair's repeats run back to back
        assert len(order) == 2
    starts = [fake.calls[i] for i in (0, 3, 6, 9)]
    assert all(fake.calls[i : i + 3] == [starts[k]] * 3 for k, i in enumerate((0, 3, 6, 9)))
    x = result.summary["x"]["t"]
    assert x.values == (3.0, 6.0)  # medians of (1, 9, 3) and (5, 6, 100)
    assert x.ratios == (1.5, 1.5)  # 3 / 2 in round 1, 6 / 4 in round 2
    assert result.samples["x"]["t"] == [[1.0, 9.0, 3.0], [5.0, 6.0, 100.0]]
    assert result.median_sample("x", "t", float) in (5.0, 6.0)


def test_ratios_pair_each_round_with_the_baseline_of_the_same_round() -> None:
    # Round 2 ran on a machine twice as slow for everyone: the ratio does not move.
    base = [10.0, 20.0, 10.0, 10.0, 10.0]
    fast = [5.0, 10.0, 5.0, 5.5, 5.0]
    summary = summarize({"softmax": {"ms": base}, "fast": {"ms": fast}}, "softmax")
    fast_summary = summary["fast"]["ms"]
    assert fast_summary.ratios == (0.5, 0.5, 0.5, 0.55, 0.5)
    assert fast_summary.ratio == 0.5  # the median of the per-round ratios
    assert fast_summary.ratio_range == (0.5, 0.55)
    assert fast_summary.ratio_quartiles == (0.5, 0.5)
    assert fast_summary.relative_spread == 0.0 and not fast_summary.noisy
    assert summary["softmax"]["ms"].ratios == (1.0,) * 5
    # comparing the medians of the raw values instead would mix rounds: 5 / 10 happens to agree
    # here, but the per-round pairing is what the spread is computed from
    assert fast_summary.values == tuple(fast)


def test_quartiles_spread_and_the_noisy_flag() -> None:
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
    assert quartiles([0.69, 0.70, 0.72]) == pytest.approx((0.695, 0.71))
    assert quartiles([7.0]) == (7.0, 7.0)
    base = [1.0] * 5
    steady = RatioSummary.of([1.00, 1.02, 0.98, 1.01, 0.99], base)
    assert steady.relative_spread == pytest.approx(0.02) and not steady.noisy
    wide = RatioSummary.of([0.8, 1.0, 1.2, 0.9, 1.1], base)
    assert wide.ratio == 1.0 and wide.ratio_quartiles == pytest.approx((0.9, 1.1))
    assert wide.relative_spread == pytest.approx(0.2) and wide.noisy
    assert wide.to_dict()["noisy"] is True and wide.to_dict()["ratio_range"] == [0.8, 1.2]
    # just inside and just outside the threshold: with 3 rounds the IQR is half the range
    edge = NOISY_RELATIVE_SPREAD
    assert not RatioSummary.of([1 - edge + 0.01, 1.0, 1 + edge - 0.01], [1.0] * 3).noisy
    outside = [1 - edge - 0.01, 1.0, 1 + edge + 0.01]
    assert RatioSummary.of([2 * v for v in outside], [2.0] * 3).noisy
    # fewer rounds than a spread needs: flagged, whatever the values
    assert RatioSummary.of([1.0, 1.0], [1.0, 1.0]).noisy


def test_a_benchmark_rows_fields_of_a_quantity_in_seconds() -> None:
    fields = RatioSummary.of([0.003, 0.001, 0.002], [0.001, 0.001, 0.002]).seconds_fields("fwd")
    assert fields["fwd_ms"] == pytest.approx(2.0)  # the median round, not a ratio
    assert fields["fwd_ms_each_round"] == pytest.approx([3.0, 1.0, 2.0])
    assert fields["fwd_ratio"] == 1.0 and fields["fwd_ratio_each_round"] == [3.0, 1.0, 1.0]
    assert fields["fwd_ratio_range"] == [1.0, 3.0] and fields["fwd_noisy"] is True
    assert {k for k in fields if not k.startswith("fwd_")} == set()


def test_spreads_overlap() -> None:
    assert spreads_overlap([0.64, 0.71, 0.78], [0.62, 0.70, 0.78])  # 0.71 ± 0.07 vs 0.70 ± 0.08
    assert not spreads_overlap([0.69, 0.70, 0.72], [0.9, 0.9, 0.9])


def test_rates_and_times_use_the_same_division() -> None:
    # tokens/s: higher is better; the ratio 0.5 means half as fast as the baseline
    result = interleaved_rounds(
        {"softmax": {"train": lambda: 1000.0}, "alpha": {"train": lambda: 500.0}},
        "softmax",
        rounds=3,
    )
    assert result.summary["alpha"]["train"].ratio == 0.5


def test_timed_reads_the_clock_around_the_call_only() -> None:
    ticks = itertools.count(start=0.0, step=1.0)
    clock_reads: list[float] = []

    def clock() -> float:
        clock_reads.append(next(ticks))
        return clock_reads[-1]

    log: list[str] = []
    measure = timed(lambda: log.append("run"), clock=clock)
    assert measure() == 1.0 and log == ["run"] and len(clock_reads) == 2

    def setup() -> str:
        log.append("setup")
        next(ticks)  # setup takes "time" too; it must not be counted
        return "prepared"

    with_setup = timed(lambda prepared: log.append(prepared), setup=setup, clock=clock)
    assert with_setup() == 1.0
    assert log[-2:] == ["setup", "prepared"]


def test_timed_measures_through_the_harness() -> None:
    ticks = iter(range(100))

    def clock() -> float:  # each call advances one second
        return float(next(ticks))

    result = interleaved_rounds(
        {"base": {"t": timed(lambda: None, clock=clock)}, "x": {"t": timed(clock, clock=clock)}},
        "base",
        rounds=3,
        warmup=0,
    )
    # base: 2 clock reads, 1 s; x calls the clock once inside: 2 s
    assert result.summary["x"]["t"].ratios == (2.0, 2.0, 2.0)


def test_timed_averages_over_number_calls_and_calls_for_calibrates_it() -> None:
    ticks = itertools.count(start=0.0, step=0.5)
    calls: list[int] = []

    def clock() -> float:
        return next(ticks)

    def run() -> None:
        calls.append(1)
        next(ticks)  # each call "takes" one tick of 0.5 s more

    measure = timed(run, number=4, clock=clock)
    # 4 calls: 4 ticks inside, plus the closing read's tick: (5 * 0.5) / 4
    assert measure() == pytest.approx(2.5 / 4) and len(calls) == 4
    per_call = iter([0.002, 0.004, 0.003])  # probes: median 3 ms
    assert calls_for(lambda: next(per_call), 0.010) == 4  # ceil(10 / 3)
    assert calls_for(lambda: 0.5, 0.010) == 1  # already long enough
    with pytest.raises(LearnableSparsityError, match="min_seconds must be > 0"):
        calls_for(lambda: 0.5, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rounds": 0}, "rounds must be an integer >= 1, got 0"),
        ({"rounds": 1, "repeats": 0}, "repeats must be an integer >= 1"),
        ({"rounds": 1, "warmup": -1}, "warmup must be an integer >= 0"),
    ],
)
def test_invalid_counts_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(LearnableSparsityError, match=match):
        interleaved_rounds({"b": {"t": lambda: 1.0}}, "b", **kwargs)


def test_the_baseline_must_measure_every_quantity() -> None:
    with pytest.raises(LearnableSparsityError, match="baseline 'b' is missing"):
        interleaved_rounds({"x": {"t": lambda: 1.0}}, "b", rounds=1)
    with pytest.raises(LearnableSparsityError, match="'x' measures 'u', which the baseline"):
        interleaved_rounds({"b": {"t": lambda: 1.0}, "x": {"u": lambda: 1.0}}, "b", rounds=1)
    with pytest.raises(LearnableSparsityError, match="a baseline value is 0"):
        RatioSummary.of([1.0], [0.0])


def test_the_spread_is_relative_to_the_median_and_on_its_bound_not_noisy() -> None:
    """The interquartile range divided by the median (not multiplied: equal at a median of 1), a
    median of 0 giving no relative spread, and a spread exactly at the bound not noisy."""
    assert RatioSummary.of([1.8, 2.0, 2.2], [1.0] * 3).relative_spread == pytest.approx(0.1)
    still = RatioSummary.of([0.0, 0.0, 0.0], [1.0] * 3)
    assert still.relative_spread == 0.0 and not still.noisy
    # quartiles 9.5 and 10.5 of a median of 10: exactly 1 / 10, the bound
    at_the_bound = RatioSummary.of([9.0, 10.0, 11.0], [1.0] * 3)
    assert at_the_bound.relative_spread == NOISY_RELATIVE_SPREAD and not at_the_bound.noisy


def test_a_summary_as_json_names_every_field() -> None:
    summary = RatioSummary.of([2.0, 4.0, 3.0], [1.0, 2.0, 1.0])
    assert summary.to_dict() == {
        "values": [2.0, 4.0, 3.0],
        "ratios": [2.0, 2.0, 3.0],
        "ratio": 2.0,
        "ratio_quartiles": [2.0, 2.5],
        "ratio_range": [2.0, 3.0],
        "relative_spread": 0.25,
        "noisy": True,
    }


def test_spreads_that_touch_overlap() -> None:
    # [1, 1, 1]: quartiles (1, 1); [0, 1, 1]: quartiles (0.5, 1): they meet at 1
    assert spreads_overlap([1.0, 1.0, 1.0], [0.0, 1.0, 1.0])
    assert spreads_overlap([0.0, 1.0, 1.0], [1.0, 1.0, 1.0])


def test_empty_or_unpaired_values_are_refused_by_name() -> None:
    with refused("quartiles of no values"):
        quartiles([])
    with refused("need one baseline value per round: 0 values, 0 baseline values"):
        RatioSummary.of([], [])
    with refused("the baseline 'b' is missing, got ['x']"):
        summarize({"x": {"t": [1.0]}}, "b")
    with refused("'x' measures ['u'], which the baseline 'b' does not"):
        summarize({"b": {"t": [1.0]}, "x": {"u": [1.0]}}, "b")
    with refused("rounds must be an integer >= 1, got True"):
        interleaved_rounds({"b": {"t": lambda: 1.0}}, "b", rounds=True)
    with refused("number must be an integer >= 1, got 0"):
        timed(lambda: None, number=0)
    with refused("probes must be an integer >= 1, got 0"):
        calls_for(lambda: 1.0, 1.0, probes=0)


def test_the_defaults_warm_up_once_and_shuffle_with_seed_0() -> None:
    fake = Fake()
    names = ["base", "a", "b", "c", "d"]
    measures = {n: {"t": fake.measure(n, "t", [1.0] * 3)} for n in names}
    rounds: list[int] = []
    result = interleaved_rounds(measures, "base", rounds=2, on_round=rounds.append)
    assert len(fake.calls) == len(names) * 3  # one warm-up call each, then two rounds
    assert rounds == [0, 1] and result.baseline == "base"
    expected = random.Random(0)
    for order in result.order:
        pairs = [(n, "t") for n in names]
        expected.shuffle(pairs)
        assert list(order) == pairs


def test_the_median_sample_is_the_lower_median_by_the_value_read() -> None:
    """Samples ordered by ``value``, not by their own order: (name, seconds) pairs whose names
    sort the other way round."""
    script = iter(
        [("z", 1.0), ("y", 2.0), ("x", 3.0), ("w", 4.0), ("v", 7.0), ("u", 6.0), ("t", 5.0)]
    )
    result = interleaved_rounds(
        {"b": {"t": lambda: next(script)}}, "b", rounds=2, repeats=2, warmup=0,
        value=lambda sample: sample[1],
    )  # fmt: skip
    assert result.median_sample("b", "t", lambda sample: sample[1]) == ("y", 2.0)
    odd = interleaved_rounds(
        {"b": {"t": lambda: next(script)}}, "b", rounds=3, repeats=1, warmup=0,
        value=lambda sample: sample[1],
    )  # fmt: skip
    assert odd.median_sample("b", "t", lambda sample: sample[1]) == ("u", 6.0)


def test_timed_with_setup_sums_its_timed_parts_and_averages_them() -> None:
    ticks = itertools.count(start=0.0, step=1.0)

    def clock() -> float:
        return next(ticks)

    def setup() -> None:
        next(ticks)  # untimed

    def run(_: None) -> None:
        next(ticks)
        next(ticks)  # each timed part: 3 ticks between its two clock reads

    measure = timed(run, setup=setup, number=3, clock=clock)
    assert measure() == 3.0


def test_calls_for_a_measure_of_zero_seconds_is_one_and_one_probe_is_enough() -> None:
    assert calls_for(lambda: 0.0, 0.01) == 1
    assert calls_for(lambda: 0.004, 0.01, probes=1) == 3


def test_the_machine_names_what_timings_ran_on() -> None:
    assert machine() == {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": machine()["machine"],
        "processor": machine()["processor"],
        "cpu_count": machine()["cpu_count"],
    }
