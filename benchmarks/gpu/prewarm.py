"""Compile the benchmarks' Triton kernels ahead of them, in parallel, into Triton's disk cache.

A fresh GPU machine has an empty Triton cache, and AdaSplash autotunes: for every sequence length
its causal attention compiles 60 kernel configurations (``_get_tau`` 30, five more kernels 6
each; N_CTX is a compile-time constant), and its ``triton_entmax`` 15 per dtype and row length,
forward and backward — a few hundred compilations of about a second each, one after the other,
inside the benchmarks' time. Run beside the tests (``run.sh`` step b), this script splits that
work over ``--workers`` processes: worker i keeps only the configurations i, i + n, i + 2n, ... of
each AdaSplash autotuner and calls AdaSplash (forward, and forward+backward) on exactly the shapes
and dtypes the benchmarks use, so every configuration is compiled once, by some worker, into the
shared cache (``~/.triton/cache`` or ``$TRITON_CACHE_DIR``). The benchmarks then autotune over
the full configuration space as usual (their choice is unaffected), but load the binaries from the
cache instead of compiling them. Our kernels (``learnable_sparsity.core.fused_triton``: no
autotuning) and AdaSplash's v1 kernels (non-causal, and causal for ``attention.py``'s
``adasplash_v1`` row) are compiled once each, the shapes dealt round-robin to the workers.
Nothing is timed; a failure is printed and the rest goes on. A failure of
``EXPECTED_FAILURES`` (known beforehand, with its reason) is reported as expected; the exit
status is 0 unless some other task failed. On the CPU the sparse normalizers' C++ kernels are
called instead (a rehearsal of the plumbing).

    python benchmarks/gpu/prewarm.py [--device cuda|cpu] [--quick] [--workers 8]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import error_text, log, optional_module

from learnable_sparsity.core import normalizers

# The shapes of the benchmarks (run.sh passes the same; see normalizers.py and attention.py).
# "short": the Transformer's attention rows (keys per query: up to 51 source and 56 target tokens
# in training, up to 71 in the fixed-length decoding): every row length up to it.
FULL = {
    "rows": 2048,
    "dims": (1024, 4096),
    "attention": ((4096, 1, 8), (16384, 1, 2)),
    "short": 128,
}
QUICK = {"rows": 64, "dims": (64, 256), "attention": ((128, 1, 2), (256, 1, 2)), "short": 32}
HEAD_DIM = 64
DTYPES = (torch.float32, torch.bfloat16)
Task = tuple[str, Callable[[], object]]
# Failures known before the run: (words of the task's name, words of the error, why). AdaSplash
# 0.2.2's triton_entmax computes in its inputs' dtype, and its backward's tl.sqrt takes only fp32
# or fp64: bf16 inputs do not compile under Triton 3.6 (the H100 run of 2026-11-26,
# results/benchmarks/gpu_run.log; docs/gpu-benchmarks.md). It is still tried, once per row
# length, so that a version that compiles it shows.
EXPECTED_FAILURES = (
    (
        ("adasplash triton_entmax", "bfloat16"),
        ("Expected dtype ['fp32', 'fp64'] but got bf16",),
        "AdaSplash's triton_entmax backward does not compile for bf16 (tl.sqrt takes fp32/fp64)",
    ),
)


def expected_failure(task: str, error: str) -> str | None:
    """Why the failure ``error`` of ``task`` was expected (``EXPECTED_FAILURES``), or None."""
    for names, errors, why in EXPECTED_FAILURES:
        if all(word in task for word in names) and all(word in error for word in errors):
            return why
    return None


def expected_to_fail(task: str) -> str | None:
    """Why ``task`` is expected to fail, whatever the error, or None."""
    for names, _, why in EXPECTED_FAILURES:
        if all(word in task for word in names):
            return why
    return None


def _slice_autotuners(index: int, workers: int) -> list[str]:
    """Keep configurations index, index + workers, ... of every AdaSplash autotuner (at least one:
    index modulo the count); returns what was kept, for the log."""
    from triton.runtime.autotuner import Autotuner

    kept = []
    for name in ("adasplash.adasplash_v2", "adasplash.triton_entmax_v2"):
        module, error = optional_module(name)
        if module is None:
            kept.append(f"{name}: {error}")
            continue
        for attribute, value in sorted(vars(module).items()):
            if isinstance(value, Autotuner):
                configs = list(value.configs)
                value.configs = configs[index::workers] or [configs[index % len(configs)]]
                kept.append(f"{attribute} {len(value.configs)}/{len(configs)}")
    return kept


def _backward(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> None:
    """One forward without autograd and one forward+backward of ``fn`` on copies of the inputs
    (the ones that are float and not α get gradients)."""
    with torch.no_grad():
        fn(*inputs)
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    out.backward(torch.randn_like(out))


def _short_lengths(longest: int) -> list[int]:
    """One row length per compiled variant of our kernels up to ``longest``: Triton compiles per
    block size (the next power of two) and specialises the length argument on being 1 or a
    multiple of 16."""
    variants: dict[tuple[int, bool, bool], int] = {}
    for d in range(1, longest + 1):
        variants.setdefault((1 << (d - 1).bit_length(), d == 1, d % 16 == 0), d)
    return sorted(variants.values())


def _short_rows(device: torch.device, d: int, dtype: torch.dtype = torch.float32) -> None:
    """Our three normalizers, forward and forward+backward, on ``dtype`` rows of length ``d``
    with a per-head α as the Transformer's attention calls them."""
    scores = torch.randn(2, 4, 8, d, device=device).to(dtype)
    alpha = torch.linspace(1.1, 1.9, 4, device=device).view(1, 4, 1, 1)
    _backward(normalizers.sparsemax, scores)
    _backward(normalizers.entmax15, scores)
    _backward(normalizers.entmax, scores, alpha)


def _tasks(device: torch.device, shapes: dict) -> tuple[list[Task], list[Task]]:
    """(tasks every worker runs: AdaSplash's autotuned kernels, tasks dealt round-robin)."""
    adasplash, _ = optional_module("adasplash")
    everyone: list[Task] = []
    dealt: list[Task] = [
        (f"ours short rows d={d}", lambda d=d: _short_rows(device, d))
        for d in _short_lengths(shapes["short"])
    ]
    rows = shapes["rows"]
    for d in shapes["dims"]:
        for dtype in DTYPES:

            def scores(d: int = d, dtype: torch.dtype = dtype) -> torch.Tensor:
                return torch.randn(rows, d, device=device).to(dtype)

            alpha = torch.linspace(1.1, 1.9, rows, device=device).view(rows, 1)
            label = f"d={d} {str(dtype).removeprefix('torch.')}"
            dealt += [
                (f"ours sparsemax {label}", lambda s=scores: _backward(normalizers.sparsemax, s())),
                (f"ours entmax15 {label}", lambda s=scores: _backward(normalizers.entmax15, s())),
                (
                    f"ours entmax {label}",
                    lambda s=scores, a=alpha: _backward(normalizers.entmax, s(), a),
                ),
            ]
            if adasplash is not None and device.type == "cuda":
                task = (
                    f"adasplash triton_entmax {label}",
                    lambda s=scores: _backward(adasplash.triton_entmax, s()),
                )
                # it autotunes: every worker compiles its share, unless it is expected to fail
                # (EXPECTED_FAILURES: once, by one worker)
                (dealt if expected_to_fail(task[0]) else everyone).append(task)
    for length, batch, heads in shapes["attention"]:
        shape = (batch, heads, length, HEAD_DIM)

        def qkv(shape: tuple[int, ...] = shape) -> list[torch.Tensor]:
            return [torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(3)]

        alpha = torch.linspace(1.1, 1.9, heads, device=device).view(1, heads, 1, 1)
        for causal in (False, True):
            label = f"L={length} {batch}x{heads} causal={causal}"
            mask = torch.ones(length, length, dtype=torch.bool, device=device).tril_()

            def ours(
                q: torch.Tensor,
                k: torch.Tensor,
                v: torch.Tensor,
                a: torch.Tensor,
                mask: torch.Tensor | None = mask if causal else None,
            ) -> torch.Tensor:
                scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
                return normalizers.entmax(scores, a, mask=mask) @ v

            dealt.append(
                (f"ours attention {label}", lambda f=ours, m=qkv, a=alpha: _backward(f, *m(), a))
            )
            if adasplash is None or device.type != "cuda":
                continue

            def splash(
                q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = causal
            ) -> torch.Tensor:
                return adasplash.adasplash(q, k, v, alpha=1.5, is_causal=causal)

            task = (f"adasplash {label}", lambda f=splash, m=qkv: _backward(f, *m()))
            # the causal path (AdaSplash-2) autotunes: every worker compiles its share
            (everyone if causal else dealt).append(task)
            if causal and hasattr(adasplash, "adasplash_v1"):  # attention.py's adasplash_v1 row

                def splash_v1(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                    return adasplash.adasplash_v1(q, k, v, alpha=1.5, is_causal=True, niter=10)

                v1 = (f"adasplash_v1 {label}", lambda f=splash_v1, m=qkv: _backward(f, *m()))
                dealt.append(v1)
    return everyone, dealt


def worker(index: int, workers: int, device: torch.device, shapes: dict) -> int:
    """Run this worker's share; the number of tasks that failed unexpectedly."""
    kept = _slice_autotuners(index, workers) if device.type == "cuda" else ["cpu: no autotuning"]
    print(f"worker {index}: configurations kept: {', '.join(kept)}", flush=True)
    everyone, dealt = _tasks(device, shapes)
    failed = 0
    for name, task in everyone + dealt[index::workers]:
        start = time.perf_counter()
        try:
            task()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            why = expected_to_fail(name)
            note = f" (expected to fail: {why}; it no longer does)" if why else ""
            print(f"worker {index}: {name}: {seconds:.1f} s{note}", flush=True)
        except Exception as error:
            text = error_text(error)
            why = expected_failure(name, text)
            if why is None:
                failed += 1
                print(f"worker {index}: {name}: FAILED {text}", flush=True)
            else:
                print(f"worker {index}: {name}: EXPECTED FAILURE ({why}): {text}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="the --quick benchmarks' shapes")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = QUICK if args.quick else FULL
    if args.worker is not None:
        if args.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--device cuda, but torch.cuda.is_available() is False")
        sys.exit(min(worker(args.worker, args.workers, torch.device(args.device), shapes), 100))
    start = time.perf_counter()
    log(f"prewarming with {args.workers} workers on {args.device} (quick: {args.quick})")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = [sys.executable, str(Path(__file__).resolve()), "--device", args.device]
    command += ["--quick"] if args.quick else []
    processes = [
        subprocess.Popen([*command, "--workers", str(args.workers), "--worker", str(i)], env=env)
        for i in range(args.workers)
    ]
    codes = [process.wait() for process in processes]
    log(
        f"prewarm done in {time.perf_counter() - start:.1f} s; worker exit codes {codes} "
        "(each: the tasks that failed unexpectedly)"
    )
    sys.exit(0 if not any(codes) else 1)


if __name__ == "__main__":
    main()
