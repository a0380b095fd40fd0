r"""Interleaved rounds of measurements, summarised as per-round ratios to a baseline.

Timing functions one after the other turns drift (load from other processes, clock and thermal
changes, the allocator's state) into error in their ratios. Here every measurement runs once per
*round*, in an order shuffled afresh each round (seeded), and each is divided by the baseline's
measurement *of the same round*: drift slower than a round cancels in the ratio, and the spread
of the per-round ratios shows what does not cancel.

The measurements are named twice: ``measures[function][quantity]`` is a callable that returns
one measurement of ``quantity`` for ``function`` (e.g. ``["sparsemax"]["forward"]``, or
``["entmax15"]["train"]``). A quantity's ratio is ``function``'s value ÷ the baseline function's
value of that quantity in the same round, whatever the unit: seconds (lower is better, see
:func:`timed`) or a rate such as tokens/s (higher is better) — the ratio is the same division,
read in the unit's direction.

:func:`interleaved_rounds` runs the rounds; :func:`summarize` turns per-round values into
:class:`RatioSummary` (per-round ratios, their median, quartiles, range, relative spread and the
:data:`NOISY_RELATIVE_SPREAD` flag) and can be used on its own for rounds recorded elsewhere.
"""

from __future__ import annotations

import math
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from learnable_sparsity.errors import LearnableSparsityError

T = TypeVar("T")

# A ratio is flagged noisy when the interquartile range of its per-round values exceeds 10% of
# their median. The targets this harness checks sit 5-10% apart (the project's speed goals: NMT
# tokens/s ratios of 0.85 / 0.90 / 0.95 of softmax; normalizer ratios of 2x / 3x / 4x), so a
# ratio whose middle half of rounds spans more than 10% cannot place itself on one side of such a
# target.
NOISY_RELATIVE_SPREAD = 0.10
# Quartiles need at least three rounds (with one or two there is no middle half to measure);
# with fewer the spread is unknown and the ratio is flagged noisy: an unknown is not trusted.
MIN_ROUNDS_FOR_SPREAD = 3


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """(first, third) quartile of ``values`` by linear interpolation between order statistics
    (``statistics.quantiles(method="inclusive")``): they lie within the observed range. A single
    value is both quartiles."""
    if not values:
        raise LearnableSparsityError("quartiles of no values")
    if len(values) == 1:
        return (float(values[0]), float(values[0]))
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q1, q3)


def spreads_overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether the interquartile ranges (:func:`quartiles`) of two sets of per-round ratios
    overlap: the two cannot be ordered within the spread of their rounds."""
    (a1, a3), (b1, b3) = quartiles(a), quartiles(b)
    return a1 <= b3 and b1 <= a3


@dataclass(frozen=True)
class RatioSummary:
    """One function's quantity over the rounds.

    ``values``: the measurement of each round (the median of its repeats); ``ratios``: each
    round's value ÷ the baseline's value of the same round; ``ratio``: the median of ``ratios``;
    ``ratio_quartiles``: their first and third quartiles (:func:`quartiles`); ``ratio_range``:
    their minimum and maximum; ``relative_spread``: interquartile range ÷ ``ratio`` (0 when the
    median is 0); ``noisy``: ``relative_spread`` > :data:`NOISY_RELATIVE_SPREAD`, or fewer than
    :data:`MIN_ROUNDS_FOR_SPREAD` rounds.
    """

    values: tuple[float, ...]
    ratios: tuple[float, ...]
    ratio: float
    ratio_quartiles: tuple[float, float]
    ratio_range: tuple[float, float]
    relative_spread: float
    noisy: bool

    @classmethod
    def of(cls, values: Sequence[float], baseline: Sequence[float]) -> RatioSummary:
        """The summary of per-round ``values`` against the baseline's values of the same
        rounds (equal lengths, baseline values non-zero)."""
        if len(values) != len(baseline) or not values:
            raise LearnableSparsityError(
                f"need one baseline value per round: {len(values)} values, {len(baseline)} "
                "baseline values"
            )
        if any(b == 0 for b in baseline):
            raise LearnableSparsityError(f"a baseline value is 0: {list(baseline)}")
        ratios = tuple(v / b for v, b in zip(values, baseline, strict=True))
        median = statistics.median(ratios)
        q1, q3 = quartiles(ratios)
        relative = (q3 - q1) / abs(median) if median else 0.0
        return cls(
            values=tuple(float(v) for v in values),
            ratios=ratios,
            ratio=median,
            ratio_quartiles=(q1, q3),
            ratio_range=(min(ratios), max(ratios)),
            relative_spread=relative,
            noisy=relative > NOISY_RELATIVE_SPREAD or len(ratios) < MIN_ROUNDS_FOR_SPREAD,
        )

    def seconds_fields(self, quantity: str) -> dict[str, Any]:
        """A benchmark row's fields of ``quantity`` measured in seconds: ``<quantity>_ms`` (the
        median round, in ms), ``_ratio``, the rounds' ms and ratios, the ratios' quartiles,
        range and relative spread, and ``_noisy``."""
        return {
            f"{quantity}_ms": 1e3 * statistics.median(self.values),
            f"{quantity}_ratio": self.ratio,
            f"{quantity}_ms_each_round": [1e3 * v for v in self.values],
            f"{quantity}_ratio_each_round": list(self.ratios),
            f"{quantity}_ratio_quartiles": list(self.ratio_quartiles),
            f"{quantity}_ratio_range": list(self.ratio_range),
            f"{quantity}_relative_spread": self.relative_spread,
            f"{quantity}_noisy": self.noisy,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields, tuples as lists."""
        return {
            "values": list(self.values),
            "ratios": list(self.ratios),
            "ratio": self.ratio,
            "ratio_quartiles": list(self.ratio_quartiles),
            "ratio_range": list(self.ratio_range),
            "relative_spread": self.relative_spread,
            "noisy": self.noisy,
        }


def summarize(
    values: Mapping[str, Mapping[str, Sequence[float]]], baseline: str
) -> dict[str, dict[str, RatioSummary]]:
    """function → quantity → :class:`RatioSummary`, from function → quantity → per-round values;
    ratios are to ``baseline``'s values of the same quantity and round."""
    if baseline not in values:
        raise LearnableSparsityError(f"the baseline {baseline!r} is missing, got {list(values)}")
    reference = values[baseline]
    summaries: dict[str, dict[str, RatioSummary]] = {}
    for function, quantities in values.items():
        missing = [q for q in quantities if q not in reference]
        if missing:
            raise LearnableSparsityError(
                f"{function!r} measures {missing}, which the baseline {baseline!r} does not"
            )
        summaries[function] = {
            quantity: RatioSummary.of(per_round, reference[quantity])
            for quantity, per_round in quantities.items()
        }
    return summaries


@dataclass(frozen=True)
class Rounds(Generic[T]):
    """What :func:`interleaved_rounds` measured.

    ``order``: per round, the (function, quantity) pairs in the order they ran; ``samples``:
    function → quantity → per round the raw results of its repeats; ``summary``: function →
    quantity → :class:`RatioSummary` of the per-round values (the median of the repeats).
    """

    baseline: str
    order: tuple[tuple[tuple[str, str], ...], ...]
    samples: dict[str, dict[str, list[list[T]]]]
    summary: dict[str, dict[str, RatioSummary]]

    def median_sample(self, function: str, quantity: str, value: Callable[[T], float]) -> T:
        """The raw result whose value is the median (lower median for an even count) of all
        rounds' and repeats' results of ``function``'s ``quantity``."""
        flat = [s for per_round in self.samples[function][quantity] for s in per_round]
        ordered = sorted(flat, key=value)
        return ordered[(len(ordered) - 1) // 2]


def check_count(name: str, value: int, minimum: int) -> None:
    """Raise naming ``name`` unless ``value`` is an integer (not a bool) of at least ``minimum``:
    a count of rounds, repeats, steps or calls."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LearnableSparsityError(f"{name} must be an integer >= {minimum}, got {value!r}")


def interleaved_rounds(
    measures: Mapping[str, Mapping[str, Callable[[], T]]],
    baseline: str,
    *,
    rounds: int,
    repeats: int = 1,
    warmup: int = 1,
    seed: int = 0,
    value: Callable[[T], float] = float,  # type: ignore[assignment]
    on_round: Callable[[int], None] | None = None,
) -> Rounds[T]:
    """Measure every (function, quantity) of ``measures`` once per round, interleaved.

    First every callable is called ``warmup`` times (results discarded: lazy initialisation,
    allocator, caches), in the order given. Then, for each of ``rounds`` rounds, the (function,
    quantity) pairs are shuffled by ``random.Random(seed)`` (a new order each round, so no
    measurement always follows the same neighbour) and each is called ``repeats`` times in a
    row; the round's value is the median of ``value(result)`` over those repeats. Ratios are to
    ``baseline``'s value of the same quantity in the same round (see :func:`summarize`);
    ``baseline`` must measure every quantity the others measure. ``on_round(i)`` is called
    after round ``i``.
    """
    check_count("rounds", rounds, 1)
    check_count("repeats", repeats, 1)
    check_count("warmup", warmup, 0)
    if baseline not in measures:
        raise LearnableSparsityError(f"the baseline {baseline!r} is missing, got {list(measures)}")
    pairs = [(f, q) for f, quantities in measures.items() for q in quantities]
    for function, quantity in pairs:
        if quantity not in measures[baseline]:
            raise LearnableSparsityError(
                f"{function!r} measures {quantity!r}, which the baseline {baseline!r} does not"
            )
    for function, quantity in pairs:
        for _ in range(warmup):
            measures[function][quantity]()
    rng = random.Random(seed)
    samples: dict[str, dict[str, list[list[T]]]] = {
        f: {q: [] for q in quantities} for f, quantities in measures.items()
    }
    values: dict[str, dict[str, list[float]]] = {
        f: {q: [] for q in quantities} for f, quantities in measures.items()
    }
    order = []
    for index in range(rounds):
        this_round = list(pairs)
        rng.shuffle(this_round)
        order.append(tuple(this_round))
        for function, quantity in this_round:
            results = [measures[function][quantity]() for _ in range(repeats)]
            samples[function][quantity].append(results)
            values[function][quantity].append(statistics.median(value(r) for r in results))
        if on_round is not None:
            on_round(index)
    return Rounds(baseline, tuple(order), samples, summarize(values, baseline))


def timed(
    fn: Callable[..., object],
    *,
    setup: Callable[[], object] | None = None,
    number: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> Callable[[], float]:
    """A measurement callable: the mean seconds by ``clock`` of one call of ``fn``, over
    ``number`` calls (a sample long enough to average out timer resolution and preemption).

    With ``setup``, each call first runs ``setup()`` untimed and then times
    ``fn(setup_result)`` (e.g. setup = a forward pass, fn = its backward); the times of the
    ``number`` timed parts are summed.
    """
    check_count("number", number, 1)

    def measure() -> float:
        if setup is None:
            start = clock()
            for _ in range(number):
                fn()
            return (clock() - start) / number
        total = 0.0
        for _ in range(number):
            prepared = setup()
            start = clock()
            fn(prepared)
            total += clock() - start
        return total / number

    return measure


def calls_for(measure: Callable[[], float], min_seconds: float, *, probes: int = 3) -> int:
    """How many calls make one sample last at least ``min_seconds``: ``measure`` (seconds of one
    call, e.g. :func:`timed`) is called ``probes`` times (the first also warms up) and the
    median probe decides, ``ceil(min_seconds / median)``, at least 1."""
    check_count("probes", probes, 1)
    if not min_seconds > 0:
        raise LearnableSparsityError(f"min_seconds must be > 0, got {min_seconds!r}")
    median = statistics.median(measure() for _ in range(probes))
    return max(1, math.ceil(min_seconds / median)) if median > 0 else 1


def machine() -> dict[str, object]:
    """What timings are measured on: torch's version and CPU threads, the processor, its cores."""
    import torch  # here only: the rest of the module times any callable, torch's or not

    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
    }
