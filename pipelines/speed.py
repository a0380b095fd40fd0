"""DVC stage ``speed``: training and inference tokens/s of the attention variants (EST Table 4).

All variants share ``nmt.model`` (one model size) and the same initial weights (same seed). They
run one after the other in this process, ``speed.rounds`` times in turn; each variant's median
round is reported, which damps the noise of a shared machine. Training: token batches of the
train split of ``speed.corpus``; inference: batched beam search over its first
``speed.infer_sentences`` test sources. Untrained weights are fine: throughput depends on the
shapes, and beam search is capped by ``max_len_a``/``max_len_b`` (the generated tokens are what
is counted, so stopping early does not flatter a variant).

Outputs: ``results/speed/speed.json`` (DVC metrics: per variant tokens/s and the ratio to the
softmax of the same run) and ``results/speed/speed.md`` (the table); both go to MLflow.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch
from tqdm import tqdm

from components.data.atomic import atomic_write_text
from components.data.bpe import BpeModel
from components.errors import LearnableSparsityError
from components.nmt.speed import (
    PHASES,
    VARIANT_LABELS,
    Throughput,
    compare_variants,
    speed_table,
)
from components.nmt.trainer import batches_of, collate_examples
from pipelines import nmt_grid, tracking
from pipelines.bpe import OUT as BPE
from pipelines.corpora import OUT as CORPORA
from pipelines.io import read_corpus, write_json
from pipelines.params import load_params

STAGE = "speed"
RESULTS = Path("results/speed")
log = logging.getLogger(__name__)


def _median(throughputs: Iterable[Throughput]) -> Throughput:
    """The measurement with the median tokens/s (the upper one of an even count)."""
    ordered = sorted(throughputs, key=lambda t: t.tokens_per_second)
    return ordered[len(ordered) // 2]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params()
    settings = params.get("speed", dict)
    variants = params.get("speed.variants", list)
    unknown = [v for v in variants if v not in VARIANT_LABELS]
    if unknown or "softmax" not in variants:
        raise LearnableSparsityError(
            f"{params.source}: speed.variants must include softmax and only name "
            f"{list(VARIANT_LABELS)}, got {variants!r}"
        )
    counts = (
        "rounds",
        "threads",
        "train_steps",
        "max_tokens",
        "infer_sentences",
        "batch_sentences",
    )
    for key in counts:
        if params.get(f"speed.{key}", int) < 1:
            raise LearnableSparsityError(f"{params.source}: speed.{key} must be >= 1")
    corpus = params.get("speed.corpus", str)
    if not (CORPORA / corpus).is_dir():
        raise LearnableSparsityError(
            f"{params.source}: speed.corpus is {corpus!r}, but {CORPORA / corpus} does not exist "
            f"(corpora prepared: {sorted(p.name for p in CORPORA.iterdir())})"
        )
    model_params = params.get("nmt.model", dict)
    torch.set_num_threads(params.get("speed.threads", int))

    bpe = BpeModel(BPE / corpus / "bpe.model")
    splits = read_corpus(CORPORA / corpus)
    train = nmt_grid.encode(bpe, splits["train"])
    test = nmt_grid.encode(bpe, splits["test"][: params.get("speed.infer_sentences", int)])
    models = {}
    for variant in variants:
        torch.manual_seed(0)  # same initial weights for every variant
        models[variant] = nmt_grid.build_model(model_params, variant, bpe.vocab_size)
    needed = settings["train_steps"] + settings["warmup_steps"]
    indices = batches_of(train, settings["max_tokens"], seed=0)[:needed]
    batches = [collate_examples(train, batch, models["softmax"]) for batch in indices]
    log.info(
        "timing %s: %d training updates, beam search over %d sentences",
        ", ".join(variants),
        settings["train_steps"],
        len(test),
    )
    rounds = [
        compare_variants(
            models,
            batches,
            [source for source, _ in test],
            train_steps=settings["train_steps"],
            warmup_steps=settings["warmup_steps"],
            batch_size=settings["batch_sentences"],
            beam_size=settings["beam_size"],
        )
        for _ in tqdm(range(settings["rounds"]), desc="speed rounds")
    ]
    rows = {
        variant: {phase: _median(r[variant][phase] for r in rounds) for phase in PHASES}
        for variant in variants
    }
    baseline = {phase: rows["softmax"][phase].tokens_per_second for phase in PHASES}
    result = {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "threads": torch.get_num_threads(),
        "corpus": corpus,
        "rounds": settings["rounds"],
        "rows": [
            {
                "variant": variant,
                "label": VARIANT_LABELS[variant],
                **{phase: rows[variant][phase].to_dict() for phase in PHASES},
                **{
                    f"{phase}_ratio_to_softmax": rows[variant][phase].tokens_per_second
                    / baseline[phase]
                    for phase in PHASES
                },
                "tokens_per_second_each_round": {
                    phase: [r[variant][phase].tokens_per_second for r in rounds] for phase in PHASES
                },
            }
            for variant in variants
        ],
    }
    table = speed_table(rows, topk_k=model_params.get("topk_k"))
    write_json(RESULTS / "speed.json", result)
    atomic_write_text(RESULTS / "speed.md", table)
    log.info("\n%s", table)

    uri = tracking.tracking_uri(Path.cwd())
    experiment = params.get("mlflow.experiment", str)
    with tracking.stage_run(
        uri, experiment, STAGE, {"speed": settings, "nmt": {"model": model_params}}
    ) as stage:
        stage.log_metrics(
            {
                tracking.metric_name(row["variant"], f"{phase}_tokens_per_second"): row[phase][
                    "tokens_per_second"
                ]
                for row in result["rows"]
                for phase in PHASES
            },
            step=0,
        )
        stage.log_artifact(RESULTS / "speed.json")
        stage.log_artifact(RESULTS / "speed.md")


if __name__ == "__main__":
    main()
