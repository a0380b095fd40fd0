"""GPU benchmark of whole attention, forward and forward+backward: ours vs AdaSplash and SDPA.

Ours is α-entmax with a learned per-head α, unfused and fused, beside AdaSplash's fused sparse
attention and PyTorch's SDPA (FlashAttention).

For each sequence length L (default 1024, 4096, 16384), head dim 64, bfloat16, causal and not,
queries, keys and values are N(0, 1) of shape [B, H, L, 64] (B × H per L: ``--shapes``, default
2×8 at 1K, 1×8 at 4K, 1×2 at 16K) and three attentions run:

* ``ours`` — S = QKᵀ/√d (bf16, materialised: [B, H, L, L]), then
  ``learnable_sparsity.core.normalizers.entmax(S, alpha, mask=causal or None)`` with a learned
  per-head α (a [1, H, 1, 1] float32 tensor with requires_grad, values spread evenly over [1.1,
  1.9]; its gradient is computed in every backward), then P·V. Unfused: the scores and the
  probabilities are materialised in HBM (the normalizer computes bf16 in float32: an fp32 copy of S
  too); ``scores_bytes`` gives their sizes and ``peak_bytes_forward_backward`` the measured peak of
  one fwd+bwd. At the default shapes S is B·H·L² = 16.8M entries at 1K (32 MiB bf16, 64 MiB
  fp32), 134M at 4K (256 / 512 MiB) and 537M at 16K (1 / 2 GiB); the fwd+bwd holds a few
  fp32- and bf16-sized copies of it at once (S, its fp32 copy, the masked copy, P in fp32 and
  bf16, their gradients): an estimated 8 fp32 copies, ≈ 16 GiB at 16K, a fifth of an 80 GB
  card (the measured peak is in the row);
* ``ours_fused`` — ``learnable_sparsity.core.fused_attention.entmax_attention`` (the same function
  and learned per-head α, in fused Triton kernels that recompute the scores tile by tile and skip
  the all-zero tiles; on the CPU it is skipped);
* ``adasplash`` — ``adasplash.adasplash(q, k, v, alpha=1.5, is_causal=causal)`` (AdaSplash's
  dispatcher: the AdaSplash-2 kernel for causal α = 1.5, the block-mask v1 kernel with n_iter = 10
  otherwise; fixed α = 1.5, scale 1/√d inside);
* ``adasplash_v1`` — ``adasplash.adasplash_v1(q, k, v, alpha=1.5, is_causal=True)``: the block-mask
  v1 kernel for causal attention too, at the same α (the dispatcher's AdaSplash-2 is specialised
  to α = 1.5: no transcendental functions, one Halley step, so it is no peer of a learned α); not
  run where the dispatcher already picks v1 (non-causal);
* ``sdpa`` — ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)``
  restricted to the FlashAttention backend on CUDA (softmax attention: the speed of light).

Timing as ``normalizers.py`` (``learnable_sparsity.timing``; a clock that synchronises the GPU;
forward under ``torch.no_grad``; forward+backward with a fixed random upstream gradient into q, k, v
and α; interleaved rounds in a new seeded order each round, ratios to sdpa of the same round,
median, quartiles, spread, noisy flag). On CUDA each method's row also holds
``kernel_ms_forward_backward``: the GPU's time in kernels during one fwd+bwd (``torch.profiler``,
the kernels' device time summed: launch and host overhead left out), beside the end-to-end figure.

Sparsity of ours on these random inputs (worst case for block skipping: random scores put the
support anywhere): ``zero_fraction`` — entries with probability exactly 0 among those the mask
allows; ``block_sparsity`` — fraction of the 128×128 blocks of P that are all zero (masked blocks
included); ``block_sparsity_unmasked_blocks`` — the same among the blocks that the causal mask
does not empty (equal to ``block_sparsity`` without the mask). A method that fails at a size
(out of memory, an API error) gets its error string in the row and the others go on; the JSON is
rewritten after every configuration.

    python benchmarks/gpu/attention.py [--device cuda|cpu] [--lengths 1024 4096 16384]
        [--shapes 1024:2x8 4096:1x8 16384:1x2] [--rounds 5] [--repeats 3] [--seed 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from common import (
    QUANTITIES,
    device_of,
    error_text,
    free_memory,
    log,
    machine,
    measures,
    optional_module,
    ours_path,
    peak_memory,
    stage,
    write_json,
)
from torch import Tensor

from learnable_sparsity.core import fused_attention, normalizers
from learnable_sparsity.timing import interleaved_rounds

adasplash, ADASPLASH_ERROR = optional_module("adasplash")

HEAD_DIM = 64
BLOCK = 128
ALPHA_RANGE = (1.1, 1.9)
ADASPLASH_ALPHA = 1.5
BASELINE = "sdpa"
DEFAULT_SHAPES = ("1024:2x8", "4096:1x8", "16384:1x2")
Attention = Callable[[Tensor, Tensor, Tensor, Tensor, bool], Tensor]


def _causal_mask(length: int, device: torch.device) -> Tensor:
    """[L, L] boolean, True on and below the diagonal (may attend); built once per size."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril_()


def _ours(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, mask: Tensor | None) -> Tensor:
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    return normalizers.entmax(scores, alpha, mask=mask) @ v


def _fused(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, causal: bool) -> Tensor:
    return fused_attention.entmax_attention(q, k, v, alpha.view(1, -1), causal=causal)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, causal: bool) -> Tensor:
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _adasplash(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, causal: bool) -> Tensor:
    return adasplash.adasplash(q, k, v, alpha=ADASPLASH_ALPHA, is_causal=causal)


def _adasplash_v1(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, causal: bool) -> Tensor:
    return adasplash.adasplash_v1(q, k, v, alpha=ADASPLASH_ALPHA, is_causal=causal)


def kernel_ms(call: Callable[[], None]) -> float:
    """Milliseconds the GPU spends in kernels during one ``call`` (after a warm-up call): the
    device time of the CUDA events ``torch.profiler`` records, without launch or host time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        call()
        torch.cuda.synchronize()
    device_us = sum(
        event.self_device_time_total
        for event in profiler.events()
        if event.device_type == DeviceType.CUDA
    )
    return device_us / 1000


def _skip_adasplash(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "skipped: needs CUDA"
    return None if adasplash is not None else f"skipped: {ADASPLASH_ERROR}"


@torch.no_grad()
def _sparsity(p: Tensor, causal: bool) -> dict[str, float]:
    """Zero fraction among allowed entries and 128×128 block sparsity of probabilities ``p``."""
    batch, heads, length, _ = p.shape
    nonzero = p != 0
    allowed_entries = batch * heads * (length * (length + 1) // 2 if causal else length * length)
    result = {"zero_fraction": 1.0 - nonzero.sum().item() / allowed_entries}
    blocks = length // BLOCK
    if blocks == 0 or length % BLOCK:
        return result
    live = nonzero.view(batch, heads, blocks, BLOCK, blocks, BLOCK).any(dim=5).any(dim=3)
    result["block_sparsity"] = 1.0 - live.double().mean().item()
    if causal:  # blocks on or below the diagonal hold allowed entries
        reachable = torch.ones(blocks, blocks, dtype=torch.bool, device=p.device).tril_()
        dead = (~live & reachable).sum().item()
        result["block_sparsity_unmasked_blocks"] = dead / (batch * heads * reachable.sum().item())
    else:
        result["block_sparsity_unmasked_blocks"] = result["block_sparsity"]
    return result


@torch.no_grad()
def _probabilities(q: Tensor, k: Tensor, alpha: Tensor, mask: Tensor | None) -> Tensor:
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    return normalizers.entmax(scores, alpha, mask=mask)


def _parse_shapes(specs: list[str]) -> dict[int, tuple[int, int]]:
    """ "L:BxH" → {L: (B, H)}."""
    shapes = {}
    for spec in specs:
        length, _, bh = spec.partition(":")
        batch, _, heads = bh.partition("x")
        shapes[int(length)] = (int(batch), int(heads))
    return shapes


def _bytes(batch: int, heads: int, length: int) -> dict[str, int]:
    elements = batch * heads * length * length
    return {"bf16": 2 * elements, "fp32": 4 * elements}


def run_config(
    length: int,
    causal: bool,
    batch: int,
    heads: int,
    args: argparse.Namespace,
    device: torch.device,
) -> list[dict[str, object]]:
    """Rows of the attentions at one (L, causal)."""
    torch.manual_seed(args.seed)
    shape = (batch, heads, length, HEAD_DIM)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(3))
    grad = torch.randn(shape, device=device, dtype=torch.bfloat16)
    low, high = ALPHA_RANGE
    alpha = torch.linspace(low, high, heads, device=device).view(1, heads, 1, 1)
    alpha.requires_grad_(True)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    mask = _causal_mask(length, device) if causal else None

    def ours(q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, causal: bool) -> Tensor:
        return _ours(q, k, v, alpha, mask)

    methods: dict[str, tuple[Attention, str | None, str]] = {
        BASELINE: (_sdpa, None, "flash" if device.type == "cuda" else "cpu"),
        "ours": (ours, None, "unfused; scores materialised"),
        "ours_fused": (
            _fused,
            None if fused_attention.usable(q) else "skipped: the fused kernels do not run here",
            "fused Triton kernels (learnable_sparsity.core.fused_attention), learned per-head α",
        ),
        "adasplash": (
            _adasplash,
            _skip_adasplash(device),
            "v2 (causal, α=1.5)" if causal else "v1 block-mask (non-causal, n_iter=10)",
        ),
        "adasplash_v1": (
            _adasplash_v1,
            _skip_adasplash(device)
            or (None if causal else "skipped: non-causal adasplash is this kernel already"),
            "v1 block-mask (causal, α=1.5, n_iter=10)",
        ),
    }
    base = {
        "L": length,
        "causal": causal,
        "batch": batch,
        "heads": heads,
        "head_dim": HEAD_DIM,
        "dtype": "bfloat16",
    }
    rows: dict[str, dict[str, object]] = {}
    measured: dict[str, dict[str, Callable[[], float]]] = {}
    for name, (attention, skipped, variant) in methods.items():
        row: dict[str, object] = {**base, "method": name, "variant": variant, "error": None}
        row["skipped"] = skipped
        rows[name] = row
        if name == "ours":
            probe = torch.empty(1, 1, 1, length, device=device, dtype=torch.bfloat16)
            row["path"] = ours_path(probe)
            row["scores_bytes"] = _bytes(batch, heads, length)
            row["alpha"] = alpha.detach().flatten().tolist()
        if skipped:
            continue

        def forward(attention: Attention = attention) -> None:
            with torch.no_grad():
                attention(q, k, v, alpha, causal)

        def forward_backward(attention: Attention = attention) -> None:
            for leaf in (*leaves, alpha):
                leaf.grad = None
            attention(*leaves, alpha, causal).backward(grad)

        setup_start = time.perf_counter()
        try:
            row["peak_bytes_forward_backward"] = peak_memory(device, forward_backward)
            measured[name] = measures(forward, forward_backward, device)
            # the first calls and the calibration: compilation and autotuning happen here
            row["setup_seconds"] = time.perf_counter() - setup_start
            if device.type == "cuda":
                row["kernel_ms_forward_backward"] = kernel_ms(forward_backward)
        except Exception as error:
            row["error"] = error_text(error)
            log(f"L={length} causal={causal} {name}: {row['error']}")
            for leaf in (*leaves, alpha):
                leaf.grad = None
            free_memory(device)
    if "ours" in measured:
        try:
            probabilities = _probabilities(q, k, alpha, mask)
            rows["ours"].update(_sparsity(probabilities, causal))
            del probabilities
        except Exception as error:
            rows["ours"]["sparsity_error"] = error_text(error)
        free_memory(device)
    if BASELINE not in measured:
        raise RuntimeError(f"the baseline failed: {rows[BASELINE]['error']}")
    result = interleaved_rounds(
        measured, BASELINE, rounds=args.rounds, repeats=args.repeats, warmup=1, seed=args.seed
    )
    for name in measured:
        row = rows[name]
        for quantity in QUANTITIES:
            row.update(result.summary[name][quantity].seconds_fields(quantity))
        row["noisy"] = any(result.summary[name][quantity].noisy for quantity in QUANTITIES)
        row["rounds"], row["repeats"] = args.rounds, args.repeats
    return list(rows.values())


def _format_row(row: dict[str, object]) -> str:
    shape = f"{row['batch']}x{row['heads']}"
    head = f"| {row['L']:>6} | {row['causal']!s:<6} | {shape:<5} | {row['method']:<10} "
    if "forward_ms" not in row:
        return head + f"| {row['skipped'] or row['error']}"
    block = row.get("block_sparsity")
    block_cell = "" if block is None else f"{block:.3f}"
    return (
        head
        + f"| {row['forward_ms']:9.3f} | {row['forward_backward_ms']:9.3f} "
        + f"| {row['forward_ratio']:7.2f}x | {row['forward_backward_ratio']:7.2f}x "
        + f"| {block_cell:>6} | {'NOISY' if row['noisy'] else ''}"
    )


HEADER = (
    f"| {'L':>6} | {'causal':<6} | {'BxH':<5} | {'method':<10} | {'fwd ms':>9} | {'f+b ms':>9} "
    f"| {'fwd/sdpa':>8} | {'f+b/sdpa':>8} | {'blk0':>6} |"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument(
        "--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="L:BxH per length (batch×heads)"
    )
    parser.add_argument("--causal", nargs="+", choices=("no", "yes"), default=["no", "yes"])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--repeats", type=int, default=3, help="samples per measurement per round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-attention.json"))
    args = parser.parse_args()
    device = device_of(args.device)
    shapes = _parse_shapes(args.shapes)
    missing = [length for length in args.lengths if length not in shapes]
    if missing:
        parser.error(f"no --shapes entry for L = {missing}")
    payload: dict[str, object] = {
        "benchmark": "attention",
        "machine": machine(device),
        "settings": {
            **{k: v for k, v in vars(args).items() if k != "out"},
            "head_dim": HEAD_DIM,
            "alpha_range": ALPHA_RANGE,
            "adasplash_alpha": ADASPLASH_ALPHA,
            "block": BLOCK,
            "ours": "unfused: QKᵀ/√d materialised in bf16, normalised in fp32 by "
            "learnable_sparsity.core.normalizers.entmax (learned per-head α), then P·V",
            "scores_bytes_per_length": {
                length: _bytes(*shapes[length], length) for length in args.lengths
            },
        },
        "results": [],
        "failed_configs": [],
    }
    log(f"machine: {payload['machine']}")
    print(HEADER, flush=True)
    results: list[dict[str, object]] = payload["results"]  # type: ignore[assignment]
    for length in args.lengths:
        batch, heads = shapes[length]
        for causal in (flag == "yes" for flag in args.causal):
            try:
                with stage(f"L={length} causal={causal} B×H={batch}×{heads}"):
                    rows = run_config(length, causal, batch, heads, args, device)
            except Exception as error:
                failure = {"L": length, "causal": causal, "error": error_text(error)}
                payload["failed_configs"].append(failure)  # type: ignore[attr-defined]
                log(f"FAILED L={length} causal={causal}: {failure['error']}")
                free_memory(device)
                write_json(args.out, payload)
                continue
            for row in rows:
                print(_format_row(row), flush=True)
            results.extend(rows)
            write_json(args.out, payload)
            free_memory(device)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
