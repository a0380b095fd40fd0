"""GPU benchmark of the NMT Transformer-base per attention variant: EST Table 4's layout.

Zhao et al. (2019, Table 4) give training and inference tokens/s of the Transformer with
softmax, sparsemax, 1.5-entmax, α-entmax and top-k attention. Here every variant is
``learnable_sparsity.nmt.model.Transformer`` at the base size (6 + 6 layers, d_model 512, 8 heads,
FFN 2048; dropout 0.1, attention dropout 0.1, pre-norm, shared embeddings over a joint vocabulary of
``--vocab`` ids) with the variant's normalizer in every attention block: softmax, sparsemax,
entmax15, entmax_alpha (the model's own learned per-head α, AST's random initialisation) and
topk (k = 8) — the same initial weights (seed 0), on the device's default code path (for the
sparse ones on CUDA: ``learnable_sparsity.core.fused_triton`` where it takes the input;
``ours_path`` in the JSON).

Data: synthetic token ids (there is no corpus on the GPU machine): ``--sentences`` pairs with
source lengths uniform in [``--min-length``, ``--max-length``] and target lengths within ±10% of
them, ids uniform over the non-special vocabulary. Untrained weights and random ids suffice:
throughput depends on the shapes, and the fixed-length search generates the same tokens with
every variant.

Measurement: what ``learnable_sparsity.nmt.speed.measure_precisions`` does — the models and
batches of ``learnable_sparsity.nmt.speed.speed_inputs`` (the pairs as both training and test
set), then ``learnable_sparsity.nmt.speed.interleaved_variants``: training — the training
loop's update (forward, label-smoothed loss, backward, Adam step) on token batches of at most
``--max-tokens`` padded tokens, ``--train-steps`` timed after ``--warmup-steps`` untimed, the
variants interleaved step by step; inference — fixed-length beam search (beam 4, length penalty
0.6, max length 1.2·src + 10: the project's ``nmt.decode``) of ``--infer-sentences`` sources in
batches of ``--batch-sentences`` (Zhao et al.: 128), after one untimed batch;
``torch.cuda.synchronize`` at both ends of every timed region. ``--rounds`` rounds, one
``interleaved_variants`` call per precision each (order seed = ``--seed`` + round), the JSON
rewritten after each precision of each round (``rounds_done``: the rounds every precision
finished; ``precision_rounds_done``: per precision); then
``learnable_sparsity.nmt.speed.summarize_rounds``: per variant and phase the median over
rounds of tokens/s ÷ softmax's tokens/s *of the same round*, quartiles, range, relative spread
and the noisy flag. Tokens: non-pad target tokens (training) and generated target tokens
(inference); see ``learnable_sparsity.nmt.speed``.

Precisions (``--precisions``, default float32, tf32, bf16; ``learnable_sparsity.precision``): every
round runs each precision the device runs (``learnable_sparsity.nmt.speed.precision_round``, the
precisions in a shuffled order), so ``<phase>_ratio_to_float32`` is the median over rounds of a
variant's tokens/s over its float32 tokens/s *of the same round*
(``learnable_sparsity.nmt.speed.summarize_precisions``); ``precisions`` in the JSON holds each
one's rows, or why the device does not run it (TF32 on a CPU: not applicable). ``rows`` are
float32's.

    python benchmarks/gpu/transformer.py [--device cuda|cpu] [--quick] [--rounds 3]
        [--precisions float32,tf32,bf16] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from pathlib import Path

import torch
from common import device_of, log, machine, ours_path, write_json

from learnable_sparsity.core.registry import NORMALIZERS
from learnable_sparsity.nmt.batching import Example
from learnable_sparsity.nmt.model import TransformerConfig
from learnable_sparsity.nmt.search import DecodeSettings
from learnable_sparsity.nmt.speed import (
    PHASES,
    SpeedSettings,
    applicable_precisions,
    precision_round,
    speed_inputs,
    summarize_precisions,
)
from learnable_sparsity.precision import PRECISIONS

VARIANTS = tuple(NORMALIZERS)  # every registered normalizer
# The project's evaluation decoding (params.yaml nmt.decode).
DECODE = DecodeSettings(beam_size=4, length_penalty=0.6, max_len_a=1.2, max_len_b=10)
BASE = TransformerConfig(alpha_init=None, share_embeddings=True, topk_k=8)
TINY = dataclasses.replace(
    BASE, d_model=64, n_heads=4, d_ff=128, enc_layers=2, dec_layers=2, max_positions=256
)


def synthetic_pairs(
    count: int, vocab: int, min_length: int, max_length: int, first_id: int, seed: int
) -> list[Example]:
    """``count`` (source, target) id lists without bos/eos: source length uniform in
    [min_length, max_length], target length within ±10% of it, ids uniform in [first_id, vocab)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        source_length = rng.randint(min_length, max_length)
        target_length = max(1, round(source_length * rng.uniform(0.9, 1.1)))
        pairs.append(
            (
                [rng.randrange(first_id, vocab) for _ in range(source_length)],
                [rng.randrange(first_id, vocab) for _ in range(target_length)],
            )
        )
    return pairs


def print_table(precision: str, rows: list[dict]) -> None:
    """The rows of one precision as a Markdown table (ratios to softmax, and to float32)."""
    print(
        f"| {precision:<8} | {'variant':<13} | {'train tok/s':>12} | {'train/sm':>8} "
        f"| {'train/f32':>9} | {'infer tok/s':>12} | {'infer/sm':>8} | {'infer/f32':>9} | noisy |",
        flush=True,
    )
    for row in rows:
        noisy = ",".join(p for p in PHASES if row[f"{p}_noisy"])
        to_float32 = [row.get(f"{p}_ratio_to_float32", 1.0) for p in PHASES]
        print(
            f"| {precision:<8} | {row['variant']:<13} | {row['train']['tokens_per_second']:12.0f} "
            f"| {row['train_ratio_to_softmax']:8.3f} | {to_float32[0]:9.3f} "
            f"| {row['inference']['tokens_per_second']:12.0f} "
            f"| {row['inference_ratio_to_softmax']:8.3f} | {to_float32[1]:9.3f} | {noisy} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="a tiny model and batches (rehearsal)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=None, help="default 10 (quick 2)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="default 3 (quick 1)")
    parser.add_argument("--max-tokens", type=int, default=None, help="default 4096 (quick 256)")
    parser.add_argument("--infer-sentences", type=int, default=None, help="default 128 (quick 8)")
    parser.add_argument("--batch-sentences", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=None, help="default 32000 (quick 200)")
    parser.add_argument("--sentences", type=int, default=None, help="default 3000 (quick 200)")
    parser.add_argument("--min-length", type=int, default=10)
    parser.add_argument("--max-length", type=int, default=None, help="default 50 (quick 20)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--precisions",
        type=lambda text: tuple(text.split(",")),
        default=PRECISIONS,
        help="comma-separated, float32 first (default float32,tf32,bf16)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-transformer.json"))
    args = parser.parse_args()
    quick = args.quick

    def pick(value: int | None, full: int, small: int) -> int:
        return value if value is not None else (small if quick else full)

    device = device_of(args.device)
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    vocab = pick(args.vocab, 32000, 200)
    settings = SpeedSettings(
        corpus="synthetic",
        variants=VARIANTS,
        rounds=args.rounds,
        seed=args.seed,
        threads=threads,
        train_steps=pick(args.train_steps, 10, 2),
        warmup_steps=pick(args.warmup_steps, 3, 1),
        max_tokens=pick(args.max_tokens, 4096, 256),
        infer_sentences=pick(args.infer_sentences, 128, 8),
        batch_sentences=args.batch_sentences,
        precisions=args.precisions,
    )
    config = (TINY if quick else BASE).for_vocabulary(vocab, "softmax")
    first_id = max(config.pad_id, config.bos_id, config.eos_id) + 1
    pairs = synthetic_pairs(
        pick(args.sentences, 3000, 200),
        vocab,
        args.min_length,
        pick(args.max_length, 50, 20),
        first_id,
        args.seed,
    )
    payload: dict[str, object] = {
        "benchmark": "transformer",
        "machine": machine(device),
        "ours_path_fp32": ours_path(torch.empty(1, 1, 1, 64, device=device)),
        "model": dataclasses.asdict(config),
        "decode": dataclasses.asdict(DECODE),
        "speed": dataclasses.asdict(settings),
        "data": {
            "kind": "synthetic uniform ids",
            "sentences": len(pairs),
            "vocab": vocab,
            "min_length": args.min_length,
            "max_length": pick(args.max_length, 50, 20),
        },
        "rows": None,
        "precisions": {},
        "error": None,
    }
    log(f"machine: {payload['machine']}")
    size = "tiny (quick)" if quick else "base"
    log(f"{size} model, variants {', '.join(VARIANTS)}, {args.rounds} rounds")
    start = time.perf_counter()
    models, batches, sources = speed_inputs(config, pairs, pairs, settings, device)
    log(f"models and batches built in {time.perf_counter() - start:.1f} s")
    applicable = applicable_precisions(settings.precisions, device)
    for precision, reason in applicable.items():
        if reason is not None:
            log(f"{precision}: not applicable ({reason})")
    rounds: dict[str, list] = {p: [] for p, reason in applicable.items() if reason is None}
    for index in range(args.rounds):

        def measured(precision: str, variants: dict, index: int = index) -> None:
            # The JSON rewritten after every precision of every round: a run cut short by its
            # timeout keeps each one it finished.
            rounds[precision].append(variants)
            payload["precisions"] = summarize_precisions(rounds, applicable)
            payload["rows"] = payload["precisions"].get("float32", {}).get("rows")
            payload["rounds_done"] = min(len(done) for done in rounds.values())
            payload["precision_rounds_done"] = {name: len(done) for name, done in rounds.items()}
            payload["seconds"] = time.perf_counter() - start
            write_json(args.out, payload)
            log(f"round {index + 1}/{args.rounds}: {precision} done")

        precision_round(
            models, batches, sources, DECODE, settings, list(rounds), index, on_precision=measured
        )
    for precision, result in payload["precisions"].items():
        if "rows" in result:
            print_table(precision, result["rows"])
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
