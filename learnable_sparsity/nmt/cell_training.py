"""A grid cell's model: initialised from its seed, trained with a summary, loaded trained; no
paths or tracking. The stages ``train_nmt``, ``synthetic_ape`` and ``train_ape`` train in Ray tasks
(``pipelines.cells.nmt.train_in_cell``) and log what :func:`train_model` returns to MLflow; the
prepared GPU run of the AST grid (``pipelines/commands/ast_grid.py``) in plain processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from learnable_sparsity.nmt.batching import Example
from learnable_sparsity.nmt.cells import NmtCell
from learnable_sparsity.nmt.model import Transformer, TransformerConfig
from learnable_sparsity.nmt.seq2seq import Seq2Seq
from learnable_sparsity.nmt.training import TrainingHistory, TrainingSettings, load_weights, train

OnLog = Callable[[int, dict[str, float]], None]


def train_model(
    model: Seq2Seq,
    train_set: Sequence[Example],
    valid_set: Sequence[Example],
    settings: TrainingSettings,
    *,
    checkpoint_dir: Path,
    variant: str,
    on_log: OnLog | None = None,
    before_checkpoint: Callable[[int], None] | None = None,
    should_stop: Callable[[int], bool] | None = None,
) -> tuple[TrainingHistory, dict[str, object]]:
    """:func:`~learnable_sparsity.nmt.training.train` (checkpoints and resume in
    ``checkpoint_dir``; ``should_stop`` may end it early); the history and a summary: steps
    trained, final train loss and validation NLL, parameters, for α-entmax the final α per block,
    and ``stopped_early`` (the planned ``max_steps``) where training ended before it."""
    history = train(
        model,
        train_set,
        valid_set,
        settings,
        checkpoint_dir=checkpoint_dir,
        variant=variant,
        on_log=on_log,
        before_checkpoint=before_checkpoint,
        should_stop=should_stop,
    )
    steps = int(history.train[-1]["step"])
    result: dict[str, object] = {
        "steps": steps,
        "final_train_loss": history.train[-1]["loss"],
        "final_valid_nll": history.valid[-1]["valid_nll"],
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if history.alphas:
        result["final_alphas"] = history.alphas[-1]["alphas"]
    if steps < settings.max_steps:
        result["stopped_early"] = {"planned_steps": settings.max_steps}
    return history, result


def initial_model(
    cell: NmtCell, config: TransformerConfig, device: torch.device | str
) -> Transformer:
    """The model of ``cell`` before training: ``config``'s Transformer initialised from the
    cell's seed, on ``device``."""
    torch.manual_seed(cell.seed)
    return Transformer(config).to(device)


def load_trained(config: TransformerConfig, checkpoint_dir: Path, average_last: int) -> Transformer:
    """The model trained in ``checkpoint_dir`` (the mean of its last ``average_last`` saves:
    :func:`~learnable_sparsity.nmt.training.load_weights`), in eval mode."""
    model = Transformer(config)
    model.load_state_dict(load_weights(checkpoint_dir, average_last))
    return model.eval()
