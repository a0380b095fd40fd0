"""GPU benchmark of the sparse normalizers on attention-logit-like rows, as ratios to torch.softmax.

For each row length d (default 1024 and 4096) and dtype (float32, bfloat16), scores of shape
[rows, d] (default 2048 rows; ``scale`` × N(0, 1), the QKᵀ/√d of unit-variance queries and keys
at scale 1) are normalised along the last dimension by:

* ``torch.softmax`` — the baseline;
* ours: ``learnable_sparsity.core.normalizers.sparsemax``, ``entmax15`` and ``entmax`` with a
  learned per-row α (a [rows, 1] float32 tensor with requires_grad, values uniform in (1.1, 1.9);
  its gradient is computed in every backward) — on CUDA tensors the Triton kernels of
  ``learnable_sparsity.core.fused_triton`` where they take the input (the row's ``path`` says which
  code ran: ``triton``, ``eager`` or, on the CPU, ``cpu-kernels``);
* the same three on the eager PyTorch solvers (rows "(eager)": the calls inside
  ``fused_triton.disabled()``; on the CPU that context changes nothing);
* ``adasplash.triton_entmax`` (AdaSplash's Triton α-entmax, fixed α = 1.5, its defaults:
  n_iter = 2 with histogram initialisation) — CUDA only;
* the ``entmax`` package's ``sparsemax``, ``entmax15`` and ``entmax_bisect`` (the learned α
  tensor, n_iter = 50, its default).

Timing (``learnable_sparsity.timing``): every callable's clock calls ``torch.cuda.synchronize``
before reading ``time.perf_counter`` (``common.clock_for``). After a probe call (whose output gives
the error) and a calibration (``calls_for``: as many calls per sample as make it last 10 ms, which
also warms up: Triton's compilation and autotuning happen there), the forward (under
``torch.no_grad``) and the forward+backward (``backward`` of a fixed random upstream gradient)
of every function run interleaved — in a new seeded order each round — for ``--rounds`` rounds
(≥ 5 on the GPU), ``--repeats`` samples each per round (the round's value: their median). A
row's ``*_ms`` is the median of its round values, ``*_ratio`` the median of the per-round ratios
to torch.softmax *of the same round*, with the per-round ratios, their quartiles, range,
relative spread (IQR ÷ median) and ``*_noisy`` (relative spread above
``learnable_sparsity.timing.NOISY_RELATIVE_SPREAD``). Ours add ``forward_backward_speedup``: per
counterpart (the same mapping on the eager solvers, in the ``entmax`` package, in AdaSplash) the
median over rounds of the counterpart's fwd+bwd time ÷ ours in the same round.

Accuracy: ``max_abs_error_vs_fp64`` is the max abs difference of the forward output (cast to
float64) from an fp64 oracle on the same (already rounded) scores: the ``entmax`` package's
``sparsemax`` / ``entmax15`` in float64, ``entmax_bisect`` with n_iter = 100 in float64 for the
learned-α rows, float64 softmax for the baseline. Errors are reported, never asserted. A function
that fails (missing package, API error, out of memory) gets its error string in ``error`` and
the others go on. The JSON is rewritten after every (d, dtype), so a run cut short keeps what it
finished.

    python benchmarks/gpu/normalizers.py [--device cuda|cpu] [--rows 2048] [--dims 1024 4096]
        [--dtypes float32 bfloat16] [--rounds 5] [--repeats 3] [--scale 1.0] [--seed 0]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from common import (
    QUANTITIES,
    device_of,
    eager,
    error_text,
    free_memory,
    log,
    machine,
    measures,
    optional_module,
    ours_path,
    stage,
    write_json,
)
from torch import Tensor

from learnable_sparsity.core import normalizers as ours
from learnable_sparsity.timing import interleaved_rounds, summarize

reference, REFERENCE_ERROR = optional_module("entmax")
adasplash, ADASPLASH_ERROR = optional_module("adasplash")

BASELINE = "torch.softmax"
LEARNED = "entmax (learned α)"
ALPHA_RANGE = (1.1, 1.9)
BISECT_ITERATIONS = 50
ORACLE_BISECT_ITERATIONS = 100
ADASPLASH_ALPHA = 1.5
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Candidate:
    """A function of (scores, α) with its fp64 oracle's name, the code it runs (``path``; None:
    ask ``common.ours_path``), the context it runs in and why it is skipped (None: it runs)."""

    fn: Callable[[Tensor, Tensor], Tensor]
    oracle: str
    path: str | None
    context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext
    skipped: str | None = None


def _candidates(device: torch.device) -> dict[str, Candidate]:
    no_reference = None if reference is not None else f"skipped: {REFERENCE_ERROR}"
    if device.type != "cuda":
        no_adasplash: str | None = "skipped: needs CUDA"
    elif adasplash is None:
        no_adasplash = f"skipped: {ADASPLASH_ERROR}"
    else:
        no_adasplash = None
    mine: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], str]] = {
        "sparsemax": (lambda x, a: ours.sparsemax(x), "sparsemax"),
        "entmax15": (lambda x, a: ours.entmax15(x), "entmax15"),
        LEARNED: (lambda x, a: ours.entmax(x, a), "bisect"),
    }
    candidates = {
        BASELINE: Candidate(lambda x, a: torch.softmax(x, dim=-1), "softmax", "torch"),
        **{f"ours {name}": Candidate(fn, oracle, None) for name, (fn, oracle) in mine.items()},
        **{
            f"ours {name} (eager)": Candidate(fn, oracle, None, eager)
            for name, (fn, oracle) in mine.items()
        },
        "adasplash triton_entmax α=1.5": Candidate(
            lambda x, a: adasplash.triton_entmax(x, alpha=ADASPLASH_ALPHA),
            "entmax15",
            "adasplash triton",
            skipped=no_adasplash,
        ),
        "entmax pkg sparsemax": Candidate(
            lambda x, a: reference.sparsemax(x, dim=-1),
            "sparsemax",
            "entmax pkg",
            skipped=no_reference,
        ),
        "entmax pkg entmax15": Candidate(
            lambda x, a: reference.entmax15(x, dim=-1),
            "entmax15",
            "entmax pkg",
            skipped=no_reference,
        ),
        f"entmax pkg entmax_bisect (learned α, n_iter={BISECT_ITERATIONS})": Candidate(
            lambda x, a: reference.entmax_bisect(x, a, dim=-1, n_iter=BISECT_ITERATIONS),
            "bisect",
            "entmax pkg",
            skipped=no_reference,
        ),
    }
    return candidates


# Per ours row, the rows it is compared with (fwd+bwd time of the other ÷ ours, per round).
COUNTERPARTS = {
    "ours sparsemax": ("ours sparsemax (eager)", "entmax pkg sparsemax"),
    "ours entmax15": (
        "ours entmax15 (eager)",
        "entmax pkg entmax15",
        "adasplash triton_entmax α=1.5",
    ),
    f"ours {LEARNED}": (
        f"ours {LEARNED} (eager)",
        f"entmax pkg entmax_bisect (learned α, n_iter={BISECT_ITERATIONS})",
    ),
}


def _oracle(name: str, x64: Tensor, alpha64: Tensor) -> Tensor:
    """The fp64 reference output of ``name`` (the entmax package in float64)."""
    if name == "softmax":
        return torch.softmax(x64, dim=-1)
    if reference is None:
        raise RuntimeError(f"no oracle: {REFERENCE_ERROR}")
    if name == "sparsemax":
        return reference.sparsemax(x64, dim=-1)
    if name == "entmax15":
        return reference.entmax15(x64, dim=-1)
    return reference.entmax_bisect(x64, alpha64, dim=-1, n_iter=ORACLE_BISECT_ITERATIONS)


def _measures_of(
    candidate: Candidate, x: Tensor, alpha: Tensor, grad: Tensor, device: torch.device
) -> dict[str, Callable[[], float]]:
    """The forward and forward+backward measurements of one candidate on its own copy of x."""
    leaf = x.detach().clone().requires_grad_(True)

    def forward() -> None:
        with candidate.context(), torch.no_grad():
            candidate.fn(x, alpha)

    def forward_backward() -> None:
        leaf.grad = None
        alpha.grad = None
        with candidate.context():
            candidate.fn(leaf, alpha).backward(grad)

    return measures(forward, forward_backward, device)


def _speedups(values: dict[str, dict[str, list[float]]], mine: str) -> dict[str, object]:
    """Per counterpart that was measured: median over rounds of its fwd+bwd time ÷ ours."""
    out: dict[str, object] = {}
    for other in COUNTERPARTS.get(mine, ()):
        if other not in values:
            continue
        summary = summarize(
            {
                mine: {"t": values[mine]["forward_backward"]},
                other: {"t": values[other]["forward_backward"]},
            },
            mine,
        )[other]["t"]
        out[other] = {
            "ratio": summary.ratio,
            "quartiles": list(summary.ratio_quartiles),
            "noisy": summary.noisy,
        }
    return out


def run_config(
    d: int, dtype_name: str, args: argparse.Namespace, device: torch.device
) -> list[dict[str, object]]:
    """Rows of every candidate at one (d, dtype)."""
    dtype = DTYPES[dtype_name]
    torch.manual_seed(args.seed)
    x = (args.scale * torch.randn(args.rows, d, device=device)).to(dtype)
    grad = torch.randn(args.rows, d, device=device).to(dtype)
    low, high = ALPHA_RANGE
    alpha = (low + (high - low) * torch.rand(args.rows, 1, device=device)).requires_grad_(True)
    x64, alpha64 = x.double(), alpha.detach().double()
    oracles: dict[str, Tensor | str] = {}
    rows: dict[str, dict[str, object]] = {}
    measured: dict[str, dict[str, Callable[[], float]]] = {}
    for name, candidate in _candidates(device).items():
        row: dict[str, object] = {
            "d": d,
            "rows": args.rows,
            "dtype": dtype_name,
            "function": name,
            "path": candidate.path,
            "error": None,
            "skipped": candidate.skipped,
            "max_abs_error_vs_fp64": None,
        }
        rows[name] = row
        if row["path"] is None:  # ours: which code takes x in the candidate's context
            with candidate.context():
                row["path"] = ours_path(x)
        if candidate.skipped:
            continue
        setup_start = time.perf_counter()
        try:
            with candidate.context(), torch.no_grad():
                out = candidate.fn(x, alpha)
            if candidate.oracle not in oracles:
                try:
                    oracles[candidate.oracle] = _oracle(candidate.oracle, x64, alpha64)
                except Exception as error:
                    oracles[candidate.oracle] = error_text(error)
            oracle = oracles[candidate.oracle]
            if isinstance(oracle, Tensor):
                row["max_abs_error_vs_fp64"] = (out.double() - oracle).abs().max().item()
            else:
                row["oracle_error"] = oracle
            row["output_dtype"] = str(out.dtype).removeprefix("torch.")
            row["mean_nonzeros_per_row"] = (out != 0).sum(dim=-1).double().mean().item()
            del out
            measured[name] = _measures_of(candidate, x, alpha, grad, device)
            # the probe and the calibration: Triton's compilation and autotuning happen here
            row["setup_seconds"] = time.perf_counter() - setup_start
        except Exception as error:
            row["error"] = error_text(error)
            log(f"d={d} {dtype_name} {name}: {row['error']}")
            free_memory(device)
    if BASELINE not in measured:
        raise RuntimeError(f"the baseline failed: {rows[BASELINE]['error']}")
    result = interleaved_rounds(
        measured, BASELINE, rounds=args.rounds, repeats=args.repeats, warmup=1, seed=args.seed
    )
    values = {
        name: {q: list(result.summary[name][q].values) for q in QUANTITIES} for name in measured
    }
    for name in measured:
        row = rows[name]
        for quantity in QUANTITIES:
            row.update(result.summary[name][quantity].seconds_fields(quantity))
        row["noisy"] = any(result.summary[name][q].noisy for q in QUANTITIES)
        row["rounds"], row["repeats"] = args.rounds, args.repeats
        if name in COUNTERPARTS:
            row["forward_backward_speedup"] = _speedups(values, name)
    return list(rows.values())


def _format_row(row: dict[str, object]) -> str:
    head = f"| {row['d']:>5} | {row['dtype']:<8} | {row['function']:<46} | {row['path']:<16} "
    if "forward_ms" not in row:
        return head + f"| {row['skipped'] or row['error']}"
    error = row["max_abs_error_vs_fp64"]
    error_cell = "n/a" if error is None else f"{error:.1e}"
    q1, q3 = row["forward_backward_ratio_quartiles"]  # type: ignore[misc]
    return (
        head
        + f"| {row['forward_ms']:8.3f} | {row['forward_backward_ms']:8.3f} "
        + f"| {row['forward_ratio']:6.2f}x | {row['forward_backward_ratio']:6.2f}x "
        + f"| {q1:5.2f}–{q3:<5.2f} | {error_cell:>7} | {'NOISY' if row['noisy'] else ''}"
    )


HEADER = (
    f"| {'d':>5} | {'dtype':<8} | {'function':<46} | {'path':<16} | {'fwd ms':>8} "
    f"| {'f+b ms':>8} | {'fwd/sm':>7} | {'f+b/sm':>7} | {'f+b IQR':<11} | {'err64':>7} |"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--dims", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--repeats", type=int, default=3, help="samples per measurement per round")
    parser.add_argument("--scale", type=float, default=1.0, help="standard deviation of the scores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-normalizers.json"))
    args = parser.parse_args()
    device = device_of(args.device)
    payload: dict[str, object] = {
        "benchmark": "normalizers",
        "machine": machine(device),
        "settings": {
            **{k: v for k, v in vars(args).items() if k != "out"},
            "alpha_range": ALPHA_RANGE,
            "adasplash_alpha": ADASPLASH_ALPHA,
            "entmax_bisect_n_iter": BISECT_ITERATIONS,
            "oracle_bisect_n_iter": ORACLE_BISECT_ITERATIONS,
        },
        "results": [],
        "failed_configs": [],
    }
    log(f"machine: {payload['machine']}")
    print(HEADER, flush=True)
    results: list[dict[str, object]] = payload["results"]  # type: ignore[assignment]
    for d in args.dims:
        for dtype_name in args.dtypes:
            try:
                with stage(f"d={d} {dtype_name}"):
                    rows = run_config(d, dtype_name, args, device)
            except Exception as error:
                failure = {"d": d, "dtype": dtype_name, "error": error_text(error)}
                payload["failed_configs"].append(failure)  # type: ignore[attr-defined]
                log(f"FAILED d={d} {dtype_name}: {failure['error']}")
                free_memory(device)
                write_json(args.out, payload)
                continue
            for row in rows:
                print(_format_row(row), flush=True)
            results.extend(rows)
            write_json(args.out, payload)
            free_memory(device)
    noisy = [f"d={r['d']} {r['dtype']} {r['function']}" for r in results if r.get("noisy")]
    if noisy:
        log(
            f"WARNING: {len(noisy)} of {len(results)} rows noisy (IQR of the per-round ratios "
            f"> 10% of the median), e.g. {'; '.join(noisy[:4])}"
        )
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
