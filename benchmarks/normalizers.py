"""Benchmark of the sparse normalizers on attention-shaped inputs, as ratios to torch.softmax.

For each key length S, scores of shape [B, H, T, S] (B·H·T ≈ 4096 rows) are normalised along
the last dimension. Forward, backward and forward+backward median wall times are reported for
torch.softmax (the baseline, measured in the same run), this project's sparsemax, entmax15,
entmax (α = 1.5 as a learnable per-head tensor, α-gradient included) and topk_softmax (k = 8),
and for the `entmax` package's sparsemax, entmax15 and entmax_bisect (50 and 25 iterations).
Each row also gives the max abs error against an fp64 oracle and, for ours, the mean number of
root-finder iterations. Prints a table and writes JSON.

    python benchmarks/normalizers.py [--lengths 64 256 1024] [--repeats 15] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from timing import median_ms, write_json

from components.core import normalizers as ours

try:  # the reference implementation, a `dev` extra (never imported by components/)
    import entmax as reference
except ImportError as error:
    raise SystemExit(
        "the benchmark compares with the `entmax` package: pip install -e '.[dev]'"
    ) from error

HEADS = 8
ROWS = 4096
K = 8
ALPHA = 1.5


def _time_function(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    scores: torch.Tensor,
    alpha: torch.Tensor,
    grad: torch.Tensor,
    repeats: int,
) -> dict[str, float]:
    x = scores.detach().clone().requires_grad_(True)

    def forward() -> torch.Tensor:
        return fn(x, alpha)

    def forward_backward() -> None:
        x.grad = None
        alpha.grad = None
        fn(x, alpha).backward(grad)

    def backward_only() -> float:
        out = fn(x, alpha)
        start = time.perf_counter()
        out.backward(grad)
        return time.perf_counter() - start

    with torch.no_grad():
        fwd = median_ms(forward, repeats)
    fwd_bwd = median_ms(forward_backward, repeats)
    backward_only()
    bwd = 1e3 * statistics.median(backward_only() for _ in range(repeats))
    return {"forward_ms": fwd, "backward_ms": bwd, "forward_backward_ms": fwd_bwd}


def _candidates() -> dict[str, tuple[Callable, Callable, float | None]]:
    """name -> (function of (x, alpha), fp64 oracle of x, α for the iteration count)."""

    def oracle_alpha(x: torch.Tensor) -> torch.Tensor:
        return reference.entmax_bisect(x, ALPHA, n_iter=200)

    def oracle_topk(x: torch.Tensor) -> torch.Tensor:
        kth = x.topk(K, dim=-1).values[..., -1:]
        return torch.softmax(x.masked_fill(x < kth, float("-inf")), dim=-1)

    return {
        "torch.softmax": (lambda x, a: torch.softmax(x, dim=-1), lambda x: x.softmax(-1), None),
        "sparsemax": (lambda x, a: ours.sparsemax(x), reference.sparsemax, 2.0),
        "entmax15": (lambda x, a: ours.entmax15(x), reference.entmax15, 1.5),
        "entmax (learned α)": (lambda x, a: ours.entmax(x, a), oracle_alpha, ALPHA),
        f"topk_softmax (k={K})": (lambda x, a: ours.topk_softmax(x, K), oracle_topk, None),
        "entmax pkg sparsemax": (lambda x, a: reference.sparsemax(x), reference.sparsemax, None),
        "entmax pkg entmax15": (lambda x, a: reference.entmax15(x), reference.entmax15, None),
        "entmax pkg bisect n_iter=50": (
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


def run(lengths: list[int], repeats: int, seed: int) -> list[dict]:
    results = []
    for length in lengths:
        torch.manual_seed(seed)
        queries = ROWS // HEADS
        scores = torch.randn(1, HEADS, queries, length)
        grad = torch.randn_like(scores)
        alpha = torch.full((1, HEADS, 1, 1), ALPHA, requires_grad=True)
        scores64 = scores.double()
        baseline = None
        for name, (fn, oracle, iter_alpha) in _candidates().items():
            timing = _time_function(fn, scores, alpha, grad, repeats)
            if baseline is None:
                baseline = timing
            with torch.no_grad():
                error = (fn(scores, alpha).double() - oracle(scores64)).abs().max().item()
            iterations = None
            if iter_alpha is not None:
                a = iter_alpha if iter_alpha != ALPHA else alpha.detach()
                root = ours.entmax_threshold(scores, a)
                iterations = root.iterations.double().mean().item()
            row = {
                "key_length": length,
                "rows": queries * HEADS,
                "function": name,
                **timing,
                **{
                    f"{key.removesuffix('_ms')}_ratio": value / baseline[key]
                    for key, value in timing.items()
                },
                "max_abs_error_vs_fp64": error,
                "mean_iterations": iterations,
            }
            results.append(row)
            print(_format_row(row), flush=True)
    return results


def _format_row(row: dict) -> str:
    iterations = "" if row["mean_iterations"] is None else f"{row['mean_iterations']:.2f}"
    return (
        f"| {row['key_length']:>5} | {row['function']:<28} | {row['forward_ms']:8.2f} "
        f"| {row['backward_ms']:8.2f} | {row['forward_backward_ms']:8.2f} "
        f"| {row['forward_ratio']:6.1f}x | {row['backward_ratio']:6.1f}x "
        f"| {row['forward_backward_ratio']:6.1f}x | {row['max_abs_error_vs_fp64']:.1e} "
        f"| {iterations:>5} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/normalizers.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"| {'S':>5} | {'function':<28} | {'fwd ms':>8} | {'bwd ms':>8} | {'f+b ms':>8} "
        f"| {'fwd/sm':>7} | {'bwd/sm':>7} | {'f+b/sm':>7} | {'err fp64':>7} | {'iters':>5} |"
    )
    print("|" + "|".join("-" * w for w in (7, 30, 10, 10, 10, 9, 9, 9, 10, 7)) + "|")
    results = run(args.lengths, args.repeats, args.seed)
    write_json(args.out, results)


if __name__ == "__main__":
    main()
