"""Benchmark of the sparse-marginalization core: structured mappings and categorical marginals.

Structured (bit vectors z ∈ {0,1}^D, batch 64 by default, t ~ N(0, 1)): SparseMAP (independent
bits), SparseMAP with a budget B = D/2 and top-k sparsemax (k = 10), each timed forward and
forward+backward of Σ_z p(z) f(z), with active-set iterations and support sizes. The baseline,
measured in the same run, is one forward+backward of the bit-vector VAE's decoder MLP
(D → 128 → 784) on the batch: ratios say how many decoder passes a mapping costs.

Categorical (K = 256, batch 64) with a costly ℓ (an MLP decoder 256 → 1024 → 1024 → 784 and a
Bernoulli NLL): dense marginalization (softmax, all K per example) is the baseline; sparsemax
and 1.5-entmax marginalization at two score scales (support sizes depend on how peaked π is),
and SFE / SFE+ / Gumbel for reference: forward+backward wall time and decoder calls.

    python benchmarks/marginalization.py [--dims 32 128] [--batch 64] [--repeats 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from pathlib import Path

import torch
from helpers import median_ms, write_json
from torch import nn

from learnable_sparsity.core import estimators
from learnable_sparsity.core.marginalize import Estimate, marginalize, topk_sparsemax
from learnable_sparsity.core.sparsemap import budget_map, sparsemap

PIXELS = 784
TOPK = 10
K = 256


def _mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def structured(dims: list[int], batch: int, repeats: int, seed: int) -> list[dict]:
    results = []
    for D in dims:
        torch.manual_seed(seed)
        t = torch.randn(batch, D)
        images = torch.rand(batch, PIXELS).round()
        decoder = _mlp(D, 128, PIXELS)

        def decoder_pass(decoder=decoder, D=D, images=images) -> None:
            z = torch.randint(0, 2, (batch, D)).float()
            nll = nn.functional.binary_cross_entropy_with_logits(decoder(z), images)
            nll.backward()

        baseline = median_ms(decoder_pass, repeats)
        weights = torch.randn(D)
        mappings: dict[str, Callable[[torch.Tensor], object]] = {
            "sparsemap": sparsemap,
            f"sparsemap budget={D // 2}": lambda x, D=D: sparsemap(x, budget_map(D // 2)),
            f"topk sparsemax k={TOPK}": lambda x: topk_sparsemax(x, TOPK),
        }
        for name, mapping in mappings.items():
            x = t.clone().requires_grad_()

            def forward_backward(mapping=mapping, x=x, weights=weights) -> None:
                dist = mapping(x)
                f = torch.tanh(dist.configs @ weights)  # any non-linear f(z)
                (dist.probs * f).sum().backward()

            with torch.no_grad():
                forward = median_ms(lambda mapping=mapping, t=t: mapping(t), repeats)
            both = median_ms(forward_backward, repeats)
            dist = mapping(t)
            support = dist.support_size.double()
            iterations = dist.iterations.double() if dist.iterations is not None else None
            row = {
                "D": D,
                "batch": batch,
                "mapping": name,
                "forward_ms": forward,
                "forward_backward_ms": both,
                "decoder_pass_ms": baseline,
                "ratio_to_decoder_pass": both / baseline,
                "iterations_mean": None if iterations is None else iterations.mean().item(),
                "iterations_max": None if iterations is None else iterations.max().item(),
                "support_mean": support.mean().item(),
                "support_max": support.max().item(),
                "certified_fraction": None
                if dist.certified is None
                else dist.certified.double().mean().item(),
            }
            results.append(row)
            print(
                f"| {D:>4} | {name:<22} | {forward:8.2f} | {both:8.2f} | {both / baseline:7.2f}x "
                f"| {_fmt(row['iterations_mean'])} / {_fmt(row['iterations_max'], 0)} "
                f"| {row['support_mean']:6.1f} / {row['support_max']:4.0f} |",
                flush=True,
            )
    return results


def _fmt(value: float | None, digits: int = 1) -> str:
    return "  -" if value is None else f"{value:5.{digits}f}"


def categorical(batch: int, repeats: int, seed: int) -> list[dict]:
    torch.manual_seed(seed)
    decoder = _mlp(K, 1024, 1024, PIXELS)
    images = torch.rand(batch, PIXELS).round()

    def loss_fn(example: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        logits = decoder(z)
        return nn.functional.binary_cross_entropy_with_logits(
            logits, images[example], reduction="none"
        ).sum(-1)

    schedule = estimators.GumbelTemperature(rate=1e-5)
    methods: dict[str, tuple[float, Callable[[torch.Tensor], Estimate]]] = {
        "dense (softmax)": (1.0, lambda s: marginalize(s, loss_fn, "softmax")),
        "sparsemax, scores N(0,1)": (1.0, lambda s: marginalize(s, loss_fn, "sparsemax")),
        "sparsemax, scores N(0,9)": (3.0, lambda s: marginalize(s, loss_fn, "sparsemax")),
        "entmax15, scores N(0,9)": (3.0, lambda s: marginalize(s, loss_fn, "entmax15")),
        "sfe": (1.0, lambda s: estimators.sfe(s, loss_fn, "categorical")),
        "sfe_plus": (1.0, lambda s: estimators.sfe_plus(s, loss_fn, "categorical")),
        "gumbel": (1.0, lambda s: estimators.gumbel(s, loss_fn, "categorical", schedule(0))),
    }
    results = []
    baseline = None
    for name, (scale, method) in methods.items():
        scores = torch.randn(batch, K, generator=torch.Generator().manual_seed(seed)) * scale
        x = scores.requires_grad_()

        def forward_backward(method=method, x=x) -> None:
            decoder.zero_grad()
            method(x).surrogate.mean().backward()

        both = median_ms(forward_backward, repeats)
        baseline = baseline or both
        calls = method(x).decoder_calls.double()
        row = {
            "K": K,
            "batch": batch,
            "method": name,
            "forward_backward_ms": both,
            "ratio_to_dense": both / baseline,
            "decoder_calls_mean": calls.mean().item(),
            "decoder_calls_max": calls.max().item(),
        }
        results.append(row)
        print(
            f"| {name:<26} | {both:9.2f} | {both / baseline:6.3f}x "
            f"| {row['decoder_calls_mean']:7.1f} | {row['decoder_calls_max']:5.0f} |",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/marginalization.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"| {'D':>4} | {f'mapping (batch {args.batch})':<22} | {'fwd ms':>8} | {'f+b ms':>8} "
        f"| {'/decoder':>8} | {'iterations':>13} | {'support mean/max':>13} |"
    )
    print("|" + "|".join("-" * w for w in (6, 24, 10, 10, 10, 15, 15)) + "|")
    rows = structured(args.dims, args.batch, args.repeats, args.seed)
    print()
    print(
        f"| {f'method (K={K}, batch {args.batch})':<26} | {'f+b ms':>9} | {'/dense':>7} "
        "| calls μ | max |"
    )
    print("|" + "|".join("-" * w for w in (28, 11, 9, 9, 7)) + "|")
    rows += categorical(args.batch, args.repeats, args.seed)
    write_json(args.out, rows)


if __name__ == "__main__":
    main()
