"""DVC stage ``speed``: training and inference tokens/s of the attention variants (EST Table 4).

All variants share one model size (``speed.model``, else ``nmt.model``), the same initial weights
and the evaluation's decoding (``nmt.decode``); they run in this process with ``speed.threads``
torch threads, in ``speed.rounds`` interleaved rounds
(``learnable_sparsity.nmt.speed.interleaved_variants``): each round times every variant's training
step by step side by side (the order shuffled at every step, so a change of the machine's speed
falls on all variants alike) and then every variant's decoding, in an order shuffled afresh each
round (``speed.seed``), and gives every variant's ratio to the softmax of the same round. The median
of the per-round ratios is reported with its spread (quartiles, range, IQR ÷ median); a phase whose
spread exceeds ``learnable_sparsity.timing.NOISY_RELATIVE_SPREAD`` is flagged ``noisy`` and logged
as a warning (the stage still writes its outputs).

Precisions (``speed.precisions``, float32 first): every round times each precision the device runs,
in a shuffled order (``learnable_sparsity.nmt.speed.precision_round``); the rows of float32 are the
table's, each other precision's rows add every variant's ratio of tokens/s to its float32 tokens/s
of the same round, the median over rounds with its spread (``<phase>_ratio_to_float32``). A
precision the device does not run (TF32 on a CPU) is reported as not applicable, with the reason.

Outputs: ``results/speed/metrics.json`` (DVC metrics: per variant the median ratio to softmax,
its relative spread and the median round's tokens/s, train and inference, in float32; and the
tokens/s of each other precision measured) and ``results/speed/rounds.json`` (every round's
measurement, the spread and noisy flags, the device and threads; ``precisions``: per precision its
rows or why it is not applicable), both also logged to MLflow; the table itself is rendered by the
``tables`` stage from ``rounds.json``. ``rounds.json`` is a plain output that DVC does not cache,
so DVC never claims a measurement can be restored from its run cache.
"""

from __future__ import annotations

import logging

import torch

from learnable_sparsity.core import fused
from learnable_sparsity.data.bpe import BpeModel
from learnable_sparsity.data.local import read_corpus
from learnable_sparsity.nmt.batching import encode_pairs
from learnable_sparsity.nmt.model import TransformerConfig
from learnable_sparsity.nmt.search import DecodeSettings
from learnable_sparsity.nmt.speed import (
    PHASES,
    SpeedSettings,
    measure_precisions,
)
from learnable_sparsity.timing import MIN_ROUNDS_FOR_SPREAD, NOISY_RELATIVE_SPREAD
from pipelines.scaffold import layout
from pipelines.scaffold.stage import Stage, run_stage

STAGE = "speed"
log = logging.getLogger(__name__)


def main(stage: Stage) -> None:
    settings = stage.settings("speed", SpeedSettings)
    config = settings.model or stage.settings("nmt.model", TransformerConfig)
    decode = stage.settings("nmt.decode", DecodeSettings)
    stage.require_entries("speed.corpus", [settings.corpus], "corpora")
    torch.set_num_threads(settings.threads)
    bpe = BpeModel(layout.bpe_model(settings.corpus))
    splits = read_corpus(layout.corpus_dir(settings.corpus), ("train", "test"))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log.info(
        "timing %s in %d rounds on %s in %s",
        ", ".join(settings.variants),
        settings.rounds,
        device,
        ", ".join(settings.precisions),
    )
    precisions = measure_precisions(
        config.for_vocabulary(bpe.vocab_size, "softmax"),
        encode_pairs(bpe, splits["train"]),
        encode_pairs(bpe, splits["test"][: settings.infer_sentences]),
        settings,
        decode,
        on_round=lambda index: log.info("round %d/%d done", index + 1, settings.rounds),
        device=device,
    )
    rows = precisions["float32"]["rows"]
    metrics = {
        row["variant"]: {
            f"{phase}_{name}": value
            for phase in PHASES
            for name, value in (
                ("ratio_to_softmax", row[f"{phase}_ratio_to_softmax"]),
                ("relative_spread", row[f"{phase}_relative_spread"]),
                ("tokens_per_second", row[phase]["tokens_per_second"]),
            )
        }
        for row in rows
    }
    for precision, measured in precisions.items():
        if "not_applicable" in measured:
            log.info("not measured: %s", measured["not_applicable"])
        elif precision != "float32":
            for row in measured["rows"]:
                for phase in PHASES:
                    speed = row[phase]["tokens_per_second"]
                    metrics[row["variant"]][f"{phase}_tokens_per_second_{precision}"] = speed
    result = {
        "device": device.type,
        "threads": torch.get_num_threads(),
        # the CPU kernels or the PyTorch solvers: the table says why its ratios differ from EST's
        "fused_kernels": device.type == "cpu" and fused.available(),
        "corpus": settings.corpus,
        "rounds": settings.rounds,
        "seed": settings.seed,
        "rows": rows,
        "precisions": precisions,
    }
    stage.write_json(layout.SPEED_ROUNDS, result, artifact="")
    stage.write_metrics(metrics, logged=True)
    for row in rows:
        log.info(
            "%s: %s", row["variant"], {p: round(row[f"{p}_ratio_to_softmax"], 3) for p in PHASES}
        )
    noisy = [f"{row['variant']} {p}" for row in rows for p in PHASES if row[f"{p}_noisy"]]
    if noisy:
        log.warning(
            "noisy speed ratios (IQR over the rounds > %.0f%% of the median, or fewer than %d "
            "rounds): %s — more rounds or a quieter machine",
            100 * NOISY_RELATIVE_SPREAD,
            MIN_ROUNDS_FOR_SPREAD,
            ", ".join(noisy),
        )


if __name__ == "__main__":
    run_stage(STAGE, main)
