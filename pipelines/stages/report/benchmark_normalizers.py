"""Benchmark of the sparse normalizers on attention-shaped inputs, as ratios to torch.softmax.

For each key length S, scores of shape [B, H, T, S] (B·H·T ≈ 4096 rows) are normalised along
the last dimension by torch.softmax (the baseline), this project's sparsemax, entmax15, entmax
(α = 1.5 as a learnable per-head tensor, α-gradient included), topk_softmax (k = 8) and any other
normalizer of the registry (``learnable_sparsity.core.registry``: rows by name) — on the
fused CPU kernels (``learnable_sparsity.core.fused``) where they are built, and again on the eager
solvers (rows "(eager)") — and the `entmax` package's sparsemax, entmax15 and entmax_bisect (50
and 25 iterations).

Timing (``learnable_sparsity.timing``): after one warm-up call of each, the forward, backward and
forward+backward of every function run interleaved — in a new seeded order each round — for
``--rounds`` rounds, ``--repeats`` samples each per round (the round's value: their median; a
sample averages as many calls as make it last 10 ms). A
row's ``*_ms`` is the median of its round values, ``*_ratio`` the median of the per-round ratios
to torch.softmax *of the same round*, with the per-round ratios, their quartiles, range, relative
spread (IQR ÷ median) and ``*_noisy`` (relative spread above
``learnable_sparsity.timing.NOISY_RELATIVE_SPREAD``); ``noisy`` is set when any of the three is. Our
α-entmax rows add ``speedup_vs_entmax_bisect_50``: the median over rounds of entmax_bisect
(50 it.)'s forward+backward time ÷ ours in the same round. Each row also gives the max abs error
against an fp64 oracle and, for ours, ``eager_mean_iterations``: the mean number of iterations
of the eager solver (``entmax_threshold``) on the same scores. The kernels run the same solvers
for sparsemax and 1.5-entmax, but start α-entmax's Newton steps from a tighter bound, so for
α-entmax they take fewer than this count says. Prints a table
(noisy rows marked), writes JSON, then warns on stderr about every noisy ratio; a noisy run still
writes its output and exits 0.

    python -m pipelines.stages.report.benchmark_normalizers [--lengths 64 256 1024] [--rounds 7]
        [--repeats 3] [--seed 0] [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from learnable_sparsity.core import fused
from learnable_sparsity.core import normalizers as ours
from learnable_sparsity.core.registry import NORMALIZERS
from learnable_sparsity.timing import (
    MIN_ROUNDS_FOR_SPREAD,
    NOISY_RELATIVE_SPREAD,
    calls_for,
    interleaved_rounds,
    machine,
    summarize,
    timed,
)
from pipelines.scaffold.files import write_json

try:  # the reference implementation, a `dev` extra (never imported by learnable_sparsity/)
    import entmax as reference
except ImportError as error:
    raise SystemExit(
        "the benchmark compares with the `entmax` package: make test installs it (the lock)"
    ) from error

HEADS = 8
ROWS = 4096
K = 8
ALPHA = 1.5
BASELINE = "torch.softmax"
LEARNED_ALPHA = "entmax (learned α)"
BISECT_50 = "entmax pkg bisect n_iter=50"
QUANTITIES = ("forward", "backward", "forward_backward")
# The registered normalizers that have rows of their own below, beside the entmax package's.
OWN_ROWS = ("softmax", "sparsemax", "entmax15", "entmax_alpha", "topk")
# A sample lasts at least 10 ms (a fast function is called several times per sample): longer
# than a scheduler time slice (a few ms), so one preemption by another process is a fraction of
# the sample rather than all of it, and far above perf_counter's resolution.
MIN_SAMPLE_SECONDS = 0.010


def _measures(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    scores: torch.Tensor,
    alpha: torch.Tensor,
    grad: torch.Tensor,
) -> dict[str, Callable[[], float]]:
    """Seconds of one forward (no autograd), one backward (its forward untimed) and one
    forward+backward of ``fn`` on its own copy of ``scores``, each averaged over as many calls
    as make a sample last :data:`MIN_SAMPLE_SECONDS` (calibrated here, which also warms up)."""
    x = scores.detach().clone().requires_grad_(True)

    def forward() -> None:
        with torch.no_grad():
            fn(x, alpha)

    def forward_with_graph() -> torch.Tensor:
        x.grad = None
        alpha.grad = None
        return fn(x, alpha)

    def forward_backward() -> None:
        forward_with_graph().backward(grad)

    once = {
        "forward": (forward, None),
        "backward": (lambda out: out.backward(grad), forward_with_graph),
        "forward_backward": (forward_backward, None),
    }
    return {
        quantity: timed(
            run,
            setup=setup,
            number=calls_for(timed(run, setup=setup), MIN_SAMPLE_SECONDS),
        )
        for quantity, (run, setup) in once.items()
    }


def _eager(fn: Callable) -> Callable:
    """``fn`` on the eager solvers (the backward follows the forward's choice)."""

    def run(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        with fused.disabled():
            return fn(x, alpha)

    return run


def _candidates() -> dict[str, tuple[Callable, Callable, float | None]]:
    """name -> (function of (x, alpha), fp64 oracle of x, α for the iteration count)."""

    def oracle_alpha(x: torch.Tensor) -> torch.Tensor:
        return reference.entmax_bisect(x, ALPHA, n_iter=200)

    def oracle_topk(x: torch.Tensor) -> torch.Tensor:
        kth = x.topk(K, dim=-1).values[..., -1:]
        return torch.softmax(x.masked_fill(x < kth, float("-inf")), dim=-1)

    candidates = {
        BASELINE: (lambda x, a: torch.softmax(x, dim=-1), lambda x: x.softmax(-1), None),
        "sparsemax": (lambda x, a: ours.sparsemax(x), reference.sparsemax, 2.0),
        "entmax15": (lambda x, a: ours.entmax15(x), reference.entmax15, 1.5),
        LEARNED_ALPHA: (lambda x, a: ours.entmax(x, a), oracle_alpha, ALPHA),
        f"topk_softmax (k={K})": (lambda x, a: ours.topk_softmax(x, K), oracle_topk, None),
        # The same functions on the eager solvers (the fall-back where the kernels are not).
        "sparsemax (eager)": (_eager(lambda x, a: ours.sparsemax(x)), reference.sparsemax, None),
        "entmax15 (eager)": (_eager(lambda x, a: ours.entmax15(x)), reference.entmax15, None),
        f"{LEARNED_ALPHA} (eager)": (_eager(lambda x, a: ours.entmax(x, a)), oracle_alpha, None),
        f"topk_softmax (k={K}, eager)": (
            _eager(lambda x, a: ours.topk_softmax(x, K)),
            oracle_topk,
            None,
        ),
        "entmax pkg sparsemax": (lambda x, a: reference.sparsemax(x), reference.sparsemax, None),
        "entmax pkg entmax15": (lambda x, a: reference.entmax15(x), reference.entmax15, None),
        BISECT_50: (
            lambda x, a: reference.entmax_bisect(x, a, n_iter=50),
            oracle_alpha,
            None,
        ),
        "entmax pkg bisect n_iter=25": (
            lambda x, a: reference.entmax_bisect(x, a, n_iter=25),
            oracle_alpha,
            None,
        ),
    }
    # Every other registered normalizer (learnable_sparsity.core.registry), with k = K and the
    # learnable α; its oracle is itself on the fp64 scores.
    for spec in NORMALIZERS.values():
        if spec.name not in OWN_ROWS:
            candidates[spec.name] = (
                lambda x, a, spec=spec: spec(x, k=K, alpha=a),
                lambda x, spec=spec: spec(x, k=K, alpha=ALPHA),
                None,
            )
    return candidates


def _speedup(values: dict[str, Sequence[float]], ours: str) -> dict[str, object]:
    """Per round, entmax_bisect (50 it.)'s fwd+bwd seconds ÷ ours of the same round."""
    summary = summarize({ours: {"t": values[ours]}, BISECT_50: {"t": values[BISECT_50]}}, ours)
    speedup = summary[BISECT_50]["t"]
    return {
        "speedup_vs_entmax_bisect_50": speedup.ratio,
        "speedup_vs_entmax_bisect_50_each_round": list(speedup.ratios),
        "speedup_vs_entmax_bisect_50_quartiles": list(speedup.ratio_quartiles),
        "speedup_vs_entmax_bisect_50_noisy": speedup.noisy,
    }


def run(lengths: list[int], rounds: int, repeats: int, seed: int) -> list[dict]:
    """One row per key length and function: ``rounds`` interleaved rounds
    (learnable_sparsity.timing) of every function's forward, backward and forward+backward,
    ``repeats`` calls each per round, ratios to torch.softmax of the same round."""
    results = []
    for length in lengths:
        torch.manual_seed(seed)
        queries = ROWS // HEADS
        scores = torch.randn(1, HEADS, queries, length)
        grad = torch.randn_like(scores)
        alpha = torch.full((1, HEADS, 1, 1), ALPHA, requires_grad=True)
        scores64 = scores.double()
        candidates = _candidates()
        measured = interleaved_rounds(
            {name: _measures(fn, scores, alpha, grad) for name, (fn, _, _) in candidates.items()},
            BASELINE,
            rounds=rounds,
            repeats=repeats,
            warmup=1,
            seed=seed,
        )
        fwd_bwd = {name: measured.summary[name]["forward_backward"].values for name in candidates}
        for name, (fn, oracle, iter_alpha) in candidates.items():
            with torch.no_grad():
                error = (fn(scores, alpha).double() - oracle(scores64)).abs().max().item()
            iterations = None
            if iter_alpha is not None:
                # the learned-α row counts the tensor-α solver; entmax15's (also α = 1.5) its own
                a = alpha.detach() if name == LEARNED_ALPHA else iter_alpha
                root = ours.entmax_threshold(scores, a)
                iterations = root.iterations.double().mean().item()
            summary = measured.summary[name]
            row: dict[str, object] = {
                "key_length": length,
                "rows": queries * HEADS,
                "function": name,
            }
            for quantity in QUANTITIES:
                row.update(summary[quantity].seconds_fields(quantity))
            row["max_abs_error_vs_fp64"] = error
            row["eager_mean_iterations"] = iterations
            row["rounds"] = rounds
            row["repeats"] = repeats
            row["noisy"] = any(summary[q].noisy for q in QUANTITIES)
            if name == LEARNED_ALPHA:
                row.update(_speedup(fwd_bwd, name))
            results.append(row)
            print(_format_row(row), flush=True)
    return results


def _format_row(row: dict) -> str:
    iterations = row["eager_mean_iterations"]
    iterations = "" if iterations is None else f"{iterations:.2f}"
    q1, q3 = row["forward_backward_ratio_quartiles"]
    spread = max(row[f"{q}_relative_spread"] for q in QUANTITIES)
    mark = "NOISY" if row["noisy"] else ""
    return (
        f"| {row['key_length']:>5} | {row['function']:<28} | {row['forward_ms']:8.2f} "
        f"| {row['backward_ms']:8.2f} | {row['forward_backward_ms']:8.2f} "
        f"| {row['forward_ratio']:6.1f}x | {row['backward_ratio']:6.1f}x "
        f"| {row['forward_backward_ratio']:6.1f}x | {q1:6.1f}–{q3:<6.1f} | {100 * spread:5.0f}% "
        f"| {row['max_abs_error_vs_fp64']:.1e} | {iterations:>11} | {mark:<5} |"
    )


HEADER = (
    f"| {'S':>5} | {'function':<28} | {'fwd ms':>8} | {'bwd ms':>8} | {'f+b ms':>8} "
    f"| {'fwd/sm':>7} | {'bwd/sm':>7} | {'f+b/sm':>7} | {'f+b/sm IQR':<13} | {'spread':>6} "
    f"| {'err fp64':>7} | {'eager iters':>11} | {'':<5} |"
)
RULE = "|" + "|".join("-" * w for w in (7, 30, 10, 10, 10, 9, 9, 9, 15, 8, 10, 13, 7)) + "|"


def _warn_noisy(results: list[dict]) -> None:
    """A loud warning on stderr naming every noisy ratio and every row whose fwd+bwd median is
    below its forward's (a symptom of drift the rounds did not cancel)."""
    noisy = [
        f"S={row['key_length']} {row['function']} {q} "
        f"(IQR {100 * row[f'{q}_relative_spread']:.0f}% of the median)"
        for row in results
        for q in QUANTITIES
        if row[f"{q}_noisy"]
    ]
    odd = [
        f"S={row['key_length']} {row['function']}"
        for row in results
        if row["forward_backward_ms"] < row["forward_ms"]
    ]
    if noisy:
        print(
            f"WARNING: {len(noisy)} ratio(s) are noisy — the interquartile range of the "
            f"per-round ratios exceeds {100 * NOISY_RELATIVE_SPREAD:.0f}% of the median (or "
            f"fewer than {MIN_ROUNDS_FOR_SPREAD} rounds): do not read them as measured; rerun "
            f"with more --rounds on a quieter machine:\n  " + "\n  ".join(noisy),
            file=sys.stderr,
            flush=True,
        )
    if odd:
        print(
            "WARNING: forward+backward measured faster than forward alone in: " + ", ".join(odd),
            file=sys.stderr,
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--repeats", type=int, default=3, help="calls per measurement per round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch CPU threads (issue 16's goals: 2)"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/normalizers.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(HEADER)
    print(RULE)
    results = run(args.lengths, args.rounds, args.repeats, args.seed)
    write_json(args.out, {**machine(), "results": results})
    print(f"wrote {args.out}")
    _warn_noisy(results)


if __name__ == "__main__":
    main()
