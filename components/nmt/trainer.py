r"""The NMT training loop: token batches, inverse-sqrt Adam, validation, checkpoints with resume.

One readable loop (nanoGPT-style). Each epoch's batches come from ``token_batches`` with a seed
derived from (seed, epoch), so the data order is a pure function of the settings. A checkpoint
holds the model, optimizer, scheduler, the torch RNG state (dropout), the position in the epoch
and the history logged so far: training interrupted at any point and restarted with the same
settings continues exactly as if it had never stopped (from the last checkpoint).

What is recorded, every ``log_every`` steps: train loss / nll per target token, learning rate,
tokens per second and — for α-entmax — every head's α (the α trajectory); every
``validate_every`` steps and at the end: the validation nll per token. ``on_log`` receives the
same numbers as they are produced (the pipelines forward them to MLflow).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from components.errors import LearnableSparsityError
from components.nmt.model import Transformer
from components.nmt.training import (
    Batch,
    average_checkpoints,
    build_optimizer,
    collate,
    label_smoothed_nll,
    token_batches,
    train_step,
)

log = logging.getLogger(__name__)

# A parallel example: (source ids, target ids), without bos/eos.
Example = tuple[list[int], list[int]]
LAST = "last.pt"


@dataclass(frozen=True)
class TrainingSettings:
    """Optimisation settings (paper profile: 8192-token batches, 20K warm-up steps)."""

    max_steps: int
    max_tokens: int
    warmup: int
    peak_lr: float
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    weight_decay: float = 0.0
    log_every: int = 10
    validate_every: int = 200
    checkpoint_every: int = 200
    keep_checkpoints: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("max_steps", "max_tokens", "warmup", "log_every", "validate_every"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LearnableSparsityError(f"{key} must be a positive integer, got {value!r}")
        if self.checkpoint_every < 1 or self.keep_checkpoints < 1:
            raise LearnableSparsityError(
                f"checkpoint_every and keep_checkpoints must be >= 1, got "
                f"{self.checkpoint_every} and {self.keep_checkpoints}"
            )
        if not self.peak_lr > 0:
            raise LearnableSparsityError(f"peak_lr must be > 0, got {self.peak_lr!r}")


@dataclass
class TrainingHistory:
    """Everything logged during training, kept in the checkpoint so that resume loses nothing."""

    train: list[dict[str, float]]
    valid: list[dict[str, float]]
    alphas: list[dict[str, object]]


def batches_of(examples: Sequence[Example], max_tokens: int, seed: int | None) -> list[list[int]]:
    """Token batches (lists of indices) of ``examples``; +1 for the bos/eos the collate adds."""
    return token_batches(
        [len(s) for s, _ in examples], [len(t) + 1 for _, t in examples], max_tokens, seed
    )


def collate_examples(
    examples: Sequence[Example], indices: Sequence[int], model: Transformer
) -> Batch:
    """The padded ``Batch`` of the examples at ``indices``."""
    config = model.config
    return collate(
        [examples[i][0] for i in indices],
        [examples[i][1] for i in indices],
        pad_id=config.pad_id,
        bos_id=config.bos_id,
        eos_id=config.eos_id,
    )


@torch.no_grad()
def validation_nll(model: Transformer, examples: Sequence[Example], max_tokens: int) -> float:
    """Per-token negative log-likelihood (no label smoothing) of ``examples``, in eval mode."""
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    device = next(model.parameters()).device
    for indices in batches_of(examples, max_tokens, None):
        batch = Batch(*(x.to(device) for x in collate_examples(examples, indices, model)))
        _, nll, n = label_smoothed_nll(
            model(batch.src, batch.tgt_in), batch.tgt_out, 0.0, model.config.pad_id
        )
        total, tokens = total + nll.item(), tokens + n
    model.train(was_training)
    return total / max(tokens, 1)


def _alphas(model: Transformer) -> dict[str, list[float]]:
    return {block: alpha.tolist() for block, alpha in model.alphas().items()}


def _save(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(
    model: Transformer,
    train_set: Sequence[Example],
    valid_set: Sequence[Example],
    settings: TrainingSettings,
    *,
    checkpoint_dir: Path,
    variant: str,
    on_log: Callable[[int, dict[str, float]], None] | None = None,
) -> TrainingHistory:
    """Train ``model`` for ``settings.max_steps`` updates, resuming from ``checkpoint_dir``.

    Checkpoints: ``last.pt`` every ``checkpoint_every`` steps and at the end (written
    atomically), plus ``step<N>.pt`` model weights of the last ``keep_checkpoints`` saves for
    checkpoint averaging. A checkpoint written with different settings is refused (the error
    names the differing keys). A NaN/Inf loss raises ``LearnableSparsityError`` naming the step
    and ``variant``.
    """
    if not train_set or not valid_set:
        raise LearnableSparsityError(
            f"training needs examples: got {len(train_set)} train and {len(valid_set)} valid"
        )
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    optimizer, scheduler = build_optimizer(
        model, settings.peak_lr, settings.warmup, weight_decay=settings.weight_decay
    )
    torch.manual_seed(settings.seed)
    step, epoch, position = 0, 0, 0
    history = TrainingHistory([], [], [])
    last = checkpoint_dir / LAST
    if last.exists():
        state = torch.load(last, map_location=device, weights_only=False)
        changed = sorted(k for k, v in asdict(settings).items() if state["settings"].get(k) != v)
        if set(changed) - {"max_steps", "log_every", "validate_every", "checkpoint_every"}:
            raise LearnableSparsityError(
                f"checkpoint {last} was written with different settings ({', '.join(changed)}); "
                f"remove {checkpoint_dir} to retrain"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        step, epoch, position = state["step"], state["epoch"], state["position"]
        history = TrainingHistory(**state["history"])
        log.info("%s: resuming from %s at step %d", variant, last, step)

    def checkpoint() -> None:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": torch.get_rng_state(),
            "step": step,
            "epoch": epoch,
            "position": position,
            "history": asdict(history),
            "settings": asdict(settings),
        }
        _save(last, state)
        _save(checkpoint_dir / f"step{step}.pt", {"model": model.state_dict(), "step": step})
        saved = sorted(checkpoint_dir.glob("step*.pt"), key=lambda p: int(p.stem[4:]))
        for old in saved[: -settings.keep_checkpoints]:
            old.unlink()

    def record_validation() -> None:
        nll = validation_nll(model, valid_set, settings.max_tokens)
        history.valid.append({"step": step, "valid_nll": nll})
        if on_log is not None:
            on_log(step, {"valid_nll": nll, "valid_ppl": math.exp(min(nll, 50.0))})

    if step == 0 and _alphas(model):
        # The initial α (random in AST) anchors the trajectories: "first towards softmax, then
        # sparser" is measured from here.
        history.alphas.append({"step": 0, "alphas": _alphas(model)})
    model.train()
    window: list[dict[str, float]] = []
    window_start = time.perf_counter()
    run_start, start_step = time.perf_counter(), step
    while step < settings.max_steps:
        order = batches_of(train_set, settings.max_tokens, settings.seed * 100_003 + epoch)
        while position < len(order) and step < settings.max_steps:
            batch = collate_examples(train_set, order[position], model)
            batch = Batch(*(x.to(device) for x in batch))
            position += 1
            step += 1
            window.append(
                train_step(
                    model,
                    batch,
                    optimizer,
                    scheduler,
                    settings.clip_norm,
                    settings.label_smoothing,
                    step=step,
                    variant=variant,
                )
            )
            if step % settings.log_every == 0 or step == settings.max_steps:
                elapsed = time.perf_counter() - window_start
                tokens = sum(m["tokens"] for m in window)
                metrics = {
                    "loss": sum(m["loss"] * m["tokens"] for m in window) / tokens,
                    "nll": sum(m["nll"] * m["tokens"] for m in window) / tokens,
                    "lr": window[-1]["lr"],
                    "grad_norm": window[-1]["grad_norm"],
                    "tokens_per_second": tokens / max(elapsed, 1e-9),
                }
                history.train.append({"step": step, **metrics})
                alphas = _alphas(model)
                if alphas:
                    history.alphas.append({"step": step, "alphas": alphas})
                    for block, values in alphas.items():
                        for head, value in enumerate(values):
                            metrics[f"alpha/{block}/head{head}"] = value
                if on_log is not None:
                    on_log(step, metrics)
                done = step - start_step
                eta = (time.perf_counter() - run_start) / done * (settings.max_steps - step)
                log.info(
                    "%s: step %d/%d loss %.3f %.0f tok/s ETA %.0fs",
                    variant,
                    step,
                    settings.max_steps,
                    metrics["loss"],
                    metrics["tokens_per_second"],
                    eta,
                )
                window, window_start = [], time.perf_counter()
            if step % settings.validate_every == 0 and step < settings.max_steps:
                record_validation()
            if step % settings.checkpoint_every == 0 and step < settings.max_steps:
                checkpoint()
        if position >= len(order):
            epoch, position = epoch + 1, 0
    if not history.valid or history.valid[-1]["step"] != step:
        record_validation()
    checkpoint()
    return history


def load_weights(checkpoint_dir: Path, average_last: int = 1) -> dict[str, torch.Tensor]:
    """Model weights from ``checkpoint_dir``: the final ones, or the mean of the last saves."""
    if average_last <= 1:
        return torch.load(checkpoint_dir / LAST, map_location="cpu", weights_only=False)["model"]
    saved = sorted(checkpoint_dir.glob("step*.pt"), key=lambda p: int(p.stem[4:]))
    if not saved:
        raise LearnableSparsityError(f"no step*.pt checkpoints in {checkpoint_dir}")
    chosen = saved[-average_last:]
    return average_checkpoints([torch.load(p, map_location="cpu")["model"] for p in chosen])
