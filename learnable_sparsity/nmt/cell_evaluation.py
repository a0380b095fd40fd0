"""Translation and scoring of one NMT grid cell's test set, without paths or tracking: the stage
``evaluate_nmt`` runs it in Ray tasks, the prepared GPU run of the AST grid
(``pipelines/commands/ast_grid.py``) in plain processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from learnable_sparsity.data.bpe import BpeModel
from learnable_sparsity.metrics.translation import empty_hypotheses, translation_metrics
from learnable_sparsity.nmt.batching import encode_pairs
from learnable_sparsity.nmt.model import Transformer
from learnable_sparsity.nmt.search import DecodeSettings, translate


def evaluate_model(
    model: Transformer,
    bpe: BpeModel,
    test: Sequence[tuple[str, str]],
    decode: DecodeSettings,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[list[str], dict[str, dict], int]:
    """Beam-search translations of the sources of ``test`` (detokenized), their scores against
    its targets (:func:`~learnable_sparsity.metrics.translation.translation_metrics`) and how
    many are empty."""
    tokens = translate(
        model, [source for source, _ in encode_pairs(bpe, test)], decode, on_batch=on_batch
    )
    hypotheses = [bpe.decode(sentence) for sentence in tokens]
    metrics = translation_metrics(hypotheses, [target for _, target in test])
    return hypotheses, metrics, empty_hypotheses(hypotheses)


def metric_scores(metrics: dict[str, dict]) -> dict[str, float]:
    """Metric name → its score, of :func:`evaluate_model`'s metrics."""
    return {name: float(value["score"]) for name, value in metrics.items()}


def cell_scores(metrics: dict[str, dict], empty: int) -> dict[str, float]:
    """A cell's row of the test scores the claims read (``bleu.json``'s cells): every metric's
    score and the number of empty hypotheses."""
    return {**metric_scores(metrics), "empty_hypotheses": empty}
