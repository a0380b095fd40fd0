r"""Training utilities for the NMT Transformer: loss, schedule, optimizer, batching, averaging.

Loss (label-smoothed cross-entropy, fairseq's form): with log p = log_softmax(logits) over V
classes and a non-pad target y,
    nll = −log p_y,    loss = (1 − ε) nll + ε/(V − 1) Σ_{v≠y} (−log p_v),
the cross-entropy against q = (1 − ε) on y and ε/(V − 1) on every other class.

Learning rate (inverse square root with linear warm-up; Vaswani et al.'s "Noam" schedule and
fairseq's ``inverse_sqrt`` are the same curve): at update s = 1, 2, …
    lr(s) = peak · min(s / warmup, √(warmup / s)),
and the Noam form d^{-1/2} · min(s^{-1/2}, s · warmup^{-3/2}) is peak = (d · warmup)^{-1/2}.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from components.errors import LearnableSparsityError
from components.nmt.model import Transformer


class Batch(NamedTuple):
    """Right-padded ids: ``src`` [batch, S]; ``tgt_in`` = [bos] + y and ``tgt_out`` = y + [eos],
    both [batch, T]."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor


def collate(
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]],
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> Batch:
    """Right-pad source ids (as given) and targets, shifted: tgt_in = [bos]+y, tgt_out = y+[eos]."""
    if len(src) != len(tgt) or not src:
        raise LearnableSparsityError(
            f"collate needs as many targets as sources (at least one), got {len(src)} and "
            f"{len(tgt)}"
        )

    def pad(rows: list[list[int]]) -> Tensor:
        out = torch.full((len(rows), max(map(len, rows))), pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return out

    return Batch(
        pad([list(s) for s in src]),
        pad([[bos_id, *y] for y in tgt]),
        pad([[*y, eos_id] for y in tgt]),
    )


def label_smoothed_nll(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor, int]:
    """(Σ smoothed loss, Σ nll, number of non-pad targets), summed over the non-pad targets.

    ``logits`` [..., V] and ``target`` [...] (long); see the module docstring for the loss.
    """
    if not 0 <= epsilon < 1:
        raise LearnableSparsityError(f"label smoothing epsilon must lie in [0, 1), got {epsilon}")
    if logits.shape[:-1] != target.shape:
        raise LearnableSparsityError(
            f"logits {tuple(logits.shape)} do not match target {tuple(target.shape)}"
        )
    vocab = logits.shape[-1]
    log_p = torch.log_softmax(logits.float(), dim=-1)
    keep = target != pad_id
    nll = -log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    others = -log_p.sum(-1) - nll
    loss = (1 - epsilon) * nll + epsilon / (vocab - 1) * others
    return loss[keep].sum(), nll[keep].sum(), int(keep.sum())


def inverse_sqrt_schedule(step: int, warmup: int) -> float:
    """Multiplier of the peak learning rate after ``step`` updates (LambdaLR's 0-based count).

    With s = step + 1 (the update about to be made): min(s / warmup, √(warmup / s)), which rises
    linearly to 1 at s = warmup and then decays as s^{-1/2}. Use with
    ``LambdaLR(optimizer, functools.partial(inverse_sqrt_schedule, warmup=warmup))``.
    """
    if warmup < 1:
        raise LearnableSparsityError(f"warmup must be a positive integer, got {warmup}")
    s = step + 1
    return min(s / warmup, math.sqrt(warmup / s))


def noam_peak_lr(d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Peak learning rate of Vaswani et al.'s schedule: scale · (d_model · warmup)^{-1/2}."""
    return scale * (d_model * warmup) ** -0.5


def build_optimizer(
    model: nn.Module,
    peak_lr: float,
    warmup: int,
    *,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    weight_decay: float = 0.0,
) -> tuple[Optimizer, LRScheduler]:
    """Adam(β = (0.9, 0.98), ε = 1e-9) with the inverse square root schedule peaking at peak_lr.

    ``weight_decay`` is decoupled (AdamW, as fairseq's Adam) and applies only to matrices
    (weights, embeddings): biases, LayerNorm gains and the per-head α logits are not decayed,
    so weight decay does not pull α towards 1.5.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=peak_lr, betas=betas, eps=eps)
    scheduler = LambdaLR(optimizer, functools.partial(inverse_sqrt_schedule, warmup=warmup))
    return optimizer, scheduler


def token_batches(
    lengths_src: Sequence[int],
    lengths_tgt: Sequence[int],
    max_tokens: int,
    shuffle_seed: int | None = None,
) -> list[list[int]]:
    """Group sentence indices into batches of similar length with at most ``max_tokens`` padded.

    A batch's padded size is len(batch) · max_i max(src_i, tgt_i) (pass the collated lengths,
    e.g. target length + 1). Indices are sorted by (max length, src, tgt) — ties broken at
    random when ``shuffle_seed`` is given — and cut greedily; a sentence longer than
    ``max_tokens`` alone gets its own batch. With a seed the batch order is shuffled too.
    """
    if len(lengths_src) != len(lengths_tgt):
        raise LearnableSparsityError(
            f"lengths_src has {len(lengths_src)} entries but lengths_tgt {len(lengths_tgt)}"
        )
    if max_tokens < 1:
        raise LearnableSparsityError(f"max_tokens must be positive, got {max_tokens}")
    rng = random.Random(shuffle_seed)
    order = list(range(len(lengths_src)))
    if shuffle_seed is not None:
        rng.shuffle(order)
    order.sort(key=lambda i: (max(lengths_src[i], lengths_tgt[i]), lengths_src[i], lengths_tgt[i]))

    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order:
        length = max(lengths_src[i], lengths_tgt[i])
        if batch and (len(batch) + 1) * max(longest, length) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, length)
    if batch:
        batches.append(batch)
    if shuffle_seed is not None:
        rng.shuffle(batches)
    return batches


def train_step(
    model: Transformer,
    batch: Batch,
    optimizer: Optimizer,
    scheduler: LRScheduler,
    clip_norm: float,
    label_smoothing: float,
    *,
    step: int,
    variant: str,
) -> dict[str, float]:
    """One update on the per-token label-smoothed loss; returns its metrics.

    Gradients are clipped to global norm ``clip_norm`` (0 disables clipping). A non-finite
    loss or gradient norm raises ``LearnableSparsityError`` naming ``step`` and ``variant``
    before the parameters are touched. Metrics: loss and nll per target token, tokens,
    grad_norm (before clipping) and the learning rate used.
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    logits = model(batch.src, batch.tgt_in)
    loss_sum, nll_sum, n_tokens = label_smoothed_nll(
        logits, batch.tgt_out, label_smoothing, model.config.pad_id
    )
    loss = loss_sum / max(n_tokens, 1)
    if not torch.isfinite(loss):
        raise LearnableSparsityError(
            f"non-finite loss {loss.item()} at step {step} of variant {variant!r}"
        )
    loss.backward()
    max_norm = clip_norm if clip_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if not torch.isfinite(grad_norm):
        raise LearnableSparsityError(
            f"non-finite gradient norm {grad_norm.item()} at step {step} of variant {variant!r}"
        )
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    return {
        "loss": loss.item(),
        "nll": nll_sum.item() / max(n_tokens, 1),
        "tokens": float(n_tokens),
        "grad_norm": grad_norm.item(),
        "lr": lr,
    }


def average_checkpoints(state_dicts: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """Element-wise mean of floating-point entries (computed in float64, cast back).

    All state dicts must have the same keys and shapes; non-floating entries (integer
    buffers) must be equal and are copied.
    """
    if not state_dicts:
        raise LearnableSparsityError("average_checkpoints needs at least one state dict")
    first = state_dicts[0]
    for n, sd in enumerate(state_dicts[1:], start=1):
        if sd.keys() != first.keys():
            diff = sorted(set(sd.keys()) ^ set(first.keys()))
            raise LearnableSparsityError(f"state dict {n} has different keys: {diff[:5]}")
    averaged = {}
    for key, value in first.items():
        values = [sd[key] for sd in state_dicts]
        if any(v.shape != value.shape for v in values):
            raise LearnableSparsityError(f"entry {key!r} has different shapes across checkpoints")
        if value.is_floating_point():
            mean = torch.stack([v.double() for v in values]).mean(0)
            averaged[key] = mean.to(value.dtype)
        elif all(torch.equal(v, value) for v in values):
            averaged[key] = value.clone()
        else:
            raise LearnableSparsityError(f"non-floating entry {key!r} differs across checkpoints")
    return averaged
