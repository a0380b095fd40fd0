r"""Training of a seq2seq model: loss, schedule, optimizer, one update, the resumable loop.

Any :class:`~learnable_sparsity.nmt.seq2seq.Seq2Seq` model trains here: the NMT Transformer and the
APE model.

Loss (label-smoothed cross-entropy, fairseq's form): with log p = log_softmax(logits) over V
classes and a non-pad target y,
    nll = −log p_y,    loss = (1 − ε) nll + ε/(V − 1) Σ_{v≠y} (−log p_v),
the cross-entropy against q = (1 − ε) on y and ε/(V − 1) on every other class.

Learning rate, ``schedule`` "inverse_sqrt" (the default; Vaswani et al.'s "Noam" schedule and
fairseq's ``inverse_sqrt`` are the same curve): at update s = 1, 2, …
    lr(s) = peak · min(s / warmup, √(warmup / s)),
and the Noam form d^{-1/2} · min(s^{-1/2}, s · warmup^{-3/2}) is peak = (d · warmup)^{-1/2}.
``schedule`` "linear" (BERT's, and the APE paper's): linear warm-up, then linear decay until the
last update s = max_steps,
    lr(s) = peak · min(s / warmup, (max_steps + 1 − s) / (max_steps + 1 − warmup)).

Update size and weight averaging (OpenNMT-py's options, which the APE paper's released config
sets): with ``accumulate`` = n > 1 one update sums the gradients of n consecutive batches,
normalised by their target tokens together (``accum_count``; an epoch's last update may take
fewer). With ``average_decay`` = d > 0 an exponential moving average of the parameters follows
training (``average_decay``; the thesis' checkpoint smoothing): the first update copies θ, and
after update s
    avg ← (1 − w) avg + w θ,    w = max(d, 1 − (s + 1)/(s + 10)),
so that w starts near 1 and falls towards d. Validation and the ``step<N>.pt`` weights (hence
decoding and checkpoint averaging) are the average's; the resume checkpoint keeps both.

The loop (:func:`train`, nanoGPT-style): each epoch's token batches come from a seed derived
from (seed, epoch), so the data order is a pure function of the settings. A checkpoint
(``learnable_sparsity.checkpoints``) holds the model, optimizer, scheduler, the torch RNG state
(dropout), the position in the epoch and the history logged so far: training interrupted at any
point and restarted with the same settings continues exactly as if it had never stopped (from
the last checkpoint). Recorded every ``log_every`` steps: train loss / nll per target token,
learning rate, tokens per second and — for α-entmax — every head's α (the α trajectory); every
``validate_every`` steps and at the end: the validation nll per token. ``on_log`` receives the
same numbers as they are produced (the pipelines forward them to MLflow).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from learnable_sparsity.checkpoints import LAST, Checkpoint, restore_rng, rng_state
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.files import load_file, save_atomic
from learnable_sparsity.nmt.batching import Batch, Example, batches_of, collate_examples
from learnable_sparsity.nmt.seq2seq import Seq2Seq
from learnable_sparsity.precision import Precision, autocast, check_precision, matmul_precision
from learnable_sparsity.schedules import inverse_sqrt_schedule, linear_schedule
from learnable_sparsity.settings import Settings, SettingsError, setting

log = logging.getLogger(__name__)

# Settings a checkpoint may be resumed under although they differ (they do not change the
# numbers of the steps already taken). Under the "linear" schedule max_steps sets the slope of
# the decay, hence every learning rate after warm-up: there it is not resumable.
RESUMABLE = ("max_steps", "log_every", "validate_every", "checkpoint_every", "keep_checkpoints")

# The learning-rate schedules (see the module docstring).
Schedule = Literal["inverse_sqrt", "linear"]


@dataclass(frozen=True, kw_only=True)
class TrainingSettings(Settings):
    """Optimisation settings, params ``nmt.train`` (paper: 8192-token batches, 20K warm-up).

    ``seed`` (data order, dropout) is the grid cell's seed, not a params key.
    """

    max_steps: int = setting(at_least=1)
    max_tokens: int = setting(at_least=1)
    warmup: int = setting(at_least=1)
    peak_lr: float = setting(above=0)
    label_smoothing: float = setting(0.1, at_least=0, below=1)
    clip_norm: float = setting(1.0, at_least=0)  # 0: no clipping
    weight_decay: float = setting(0.0, at_least=0)
    alpha_lr_scale: float = setting(1.0, above=0)  # α logits' lr / the others' (AST: 1)
    accumulate: int = setting(1, at_least=1)  # batches per update (OpenNMT's accum_count)
    average_decay: float = setting(0.0, at_least=0, below=1)  # 0: no weight averaging
    log_every: int = setting(10, at_least=1)
    validate_every: int = setting(200, at_least=1)
    checkpoint_every: int = setting(200, at_least=1)
    keep_checkpoints: int = setting(5, at_least=1)
    schedule: Schedule = "inverse_sqrt"
    precision: Precision = "float32"  # of the updates (learnable_sparsity.precision)
    seed: int = setting(0, at_least=0, derived=True)

    def validate(self) -> None:
        if self.schedule == "linear" and self.warmup > self.max_steps:
            raise SettingsError(
                "warmup",
                f"must not exceed max_steps {self.max_steps} under the linear schedule, "
                f"got {self.warmup}",
            )

    def resumable(self) -> tuple[str, ...]:
        """The settings a checkpoint of this run may be resumed under although they differ."""
        if self.schedule == "linear":
            return tuple(key for key in RESUMABLE if key != "max_steps")
        return RESUMABLE


@dataclass
class TrainingHistory:
    """Everything logged during training, kept in the checkpoint so that resume loses nothing:
    ``train`` every ``log_every`` steps (step, the window's mean loss and NLL per target token,
    lr, grad_norm, and ``target_tokens``, the non-pad target tokens trained so far), ``valid``
    (step, valid_nll), ``alphas`` (step, every block's learned α)."""

    train: list[dict[str, float]]
    valid: list[dict[str, float]]
    alphas: list[dict[str, object]]


def label_smoothed_nll(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(Σ smoothed loss, Σ nll, number of non-pad targets), summed over the non-pad targets;
    all three 0-d tensors on ``logits``' device (reading one is a host sync there).

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
    if reads_are_free(logits.device):
        # The host keeps the selection of the non-pad targets, whose sums are those of every
        # CPU run recorded so far.
        return loss[keep].sum(), nll[keep].sum(), keep.sum()
    # Selecting sizes a tensor by the data, which waits for the device: the pads' terms are
    # zeroed instead (the same gradient; the sums differ in the order of float32 additions).
    return loss.where(keep, 0.0).sum(), nll.where(keep, 0.0).sum(), keep.sum()


def reads_are_free(device: torch.device) -> bool:
    """Whether reading ``device``'s data on the host costs no wait (the host's own memory):
    elsewhere code whose shapes or control flow would depend on the data takes a path that
    does not (a CPU run takes the device's path when a test patches this)."""
    return device.type == "cpu"


def schedule_multiplier(
    schedule: Schedule, warmup: int, max_steps: int | None = None
) -> Callable[[int], float]:
    """The LambdaLR multiplier of ``schedule``: :func:`inverse_sqrt_schedule`, or
    :func:`linear_schedule` over ``max_steps`` updates (which "linear" requires, ≥ warmup)."""
    if schedule == "inverse_sqrt":
        return functools.partial(inverse_sqrt_schedule, warmup=warmup)
    if schedule != "linear":
        raise LearnableSparsityError(
            f"schedule must be 'inverse_sqrt' or 'linear', got {schedule!r}"
        )
    if max_steps is None or not 1 <= warmup <= max_steps:
        raise LearnableSparsityError(
            f"the linear schedule needs 1 <= warmup <= max_steps, got warmup {warmup} and "
            f"max_steps {max_steps}"
        )
    return functools.partial(linear_schedule, warmup=warmup, steps=max_steps)


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
    alpha_lr_scale: float = 1.0,
    schedule: Schedule = "inverse_sqrt",
    max_steps: int | None = None,
) -> tuple[Optimizer, LRScheduler]:
    """Adam(β = (0.9, 0.98), ε = 1e-9) with ``schedule`` peaking at peak_lr after ``warmup``
    updates (:func:`schedule_multiplier`; "linear" decays until ``max_steps``).

    ``weight_decay`` is decoupled (AdamW, as fairseq's Adam) and applies only to matrices
    (weights, embeddings): biases, LayerNorm gains and the per-head α logits are not decayed,
    so weight decay does not pull α towards 1.5. The α logits follow the same schedule scaled by
    ``alpha_lr_scale``: Adam moves a parameter by about lr per update, so at a short schedule's
    learning rates α can hardly leave its initial value unless its own rate is larger.
    """
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    alpha = [p for name, p in named if name.endswith("alpha_logit")]
    rest = [p for name, p in named if not name.endswith("alpha_logit")]
    groups = [
        {"params": [p for p in rest if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in rest if p.ndim < 2], "weight_decay": 0.0},
    ]
    if alpha:
        groups.append({"params": alpha, "weight_decay": 0.0, "lr": peak_lr * alpha_lr_scale})
    device = named[0][1].device if named else torch.device("cpu")
    optimizer = torch.optim.AdamW(
        groups, lr=peak_lr, betas=betas, eps=eps, **adam_implementation(device)
    )
    scheduler = LambdaLR(optimizer, schedule_multiplier(schedule, warmup, max_steps))
    return optimizer, scheduler


def adam_implementation(device: torch.device) -> dict[str, bool]:
    """torch's Adam implementation for parameters on ``device``: the fused kernels on CUDA (one
    launch per parameter group and update, the step counts kept on the device), the multi-tensor
    ("foreach") one elsewhere; never the per-tensor loop, which launches about ten kernels per
    parameter tensor. All three compute Adam's update by the same formulas: the foreach one
    with the per-tensor loop's float32 operations, bit for bit (tests/nmt/test_step_cost.py);
    the fused kernels round differently in the last place (on the CPU, one update of the tiny
    Transformer: at most 7.5e-9 apart, in the decayed weights), which Adam, as any rounding,
    can grow into a full step where a gradient is zero in exact arithmetic (a key bias)."""
    if device.type == "cuda":
        return {"fused": True, "foreach": False}
    return {"fused": False, "foreach": True}


def load_optimizer_state(optimizer: Optimizer, state: Mapping[str, object]) -> None:
    """``optimizer.load_state_dict(state)``, keeping ``optimizer``'s own implementation
    (:func:`adam_implementation`): a checkpoint saved on another device, or before the choice
    was made, names the implementation it ran with, which torch would otherwise restore. The
    moments and step counts load exactly; torch moves the step counts to the parameters'
    device for the fused kernels."""
    groups = [
        {**saved, "fused": group.get("fused"), "foreach": group.get("foreach")}
        for saved, group in zip(state["param_groups"], optimizer.param_groups, strict=True)
    ]
    optimizer.load_state_dict({**state, "param_groups": groups})


@dataclass(frozen=True)
class Update:
    """One update's metrics as it leaves them, on the device: reading them back waits for the
    device, so the training loop reads a whole log window at once (:func:`read_updates`).
    ``losses`` and ``nlls`` [batches]: each accumulated batch's smoothed loss over the update's
    target tokens and its nll sum; ``grad_norm``: the global gradient norm before clipping;
    ``tokens``: the update's non-pad target tokens; ``lr``: the learning rate it used."""

    losses: Tensor
    nlls: Tensor
    grad_norm: Tensor
    tokens: Tensor
    lr: float


def _backward(
    model: Seq2Seq,
    batches: Sequence[Batch],
    optimizer: Optimizer,
    clip_norm: float,
    label_smoothing: float,
    precision: Precision,
) -> Update:
    """Gradients of the per-token label-smoothed loss of ``batches`` (one backward per batch,
    normalised by all their target tokens), clipped to global norm ``clip_norm`` (0: no
    clipping); the optimizer's step is not taken. Batches on the host move to the model's
    device here; nothing is read back from the device."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    pad_id = model.config.pad_id
    device = next(model.parameters()).device
    batches = [part.to(device) for part in batches]
    n_tokens = sum((part.tgt_out != pad_id).sum() for part in batches)
    losses, nlls = [], []
    with matmul_precision(precision, device):
        for part in batches:  # one backward per batch: only one batch's activations at a time
            with autocast(precision, device):  # the loss is float32 (label_smoothed_nll)
                loss_sum, nll_sum, _ = label_smoothed_nll(
                    model(part.src, part.tgt_in), part.tgt_out, label_smoothing, pad_id
                )
            loss = loss_sum / n_tokens.clamp(min=1)
            loss.backward()
            losses.append(loss.detach())
            nlls.append(nll_sum.detach())
    max_norm = clip_norm if clip_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    lr = optimizer.param_groups[0]["lr"]
    return Update(torch.stack(losses), torch.stack(nlls), grad_norm.detach(), n_tokens, lr)


def update(
    model: Seq2Seq,
    batch: Batch | Sequence[Batch],
    optimizer: Optimizer,
    scheduler: LRScheduler,
    clip_norm: float,
    label_smoothing: float,
    *,
    precision: Precision = "float32",
) -> Update:
    """The training loop's update: :func:`train_step`'s, without reading anything back from
    the device (no host sync: the device runs ahead of the host). Its metrics, and the check
    that they are finite, wait for :func:`read_updates` at the next log, validation or
    checkpoint: a non-finite update is applied, and raises there before anything keeps it."""
    batches = [batch] if isinstance(batch, Batch) else list(batch)
    result = _backward(model, batches, optimizer, clip_norm, label_smoothing, precision)
    optimizer.step()
    scheduler.step()
    return result


def read_updates(
    updates: Sequence[Update], first_step: int, variant: str
) -> list[dict[str, float]]:
    """The metrics of consecutive ``updates`` (the first one update ``first_step``), read back
    from the device at once: loss and nll per target token, tokens, grad_norm (before
    clipping) and the learning rate used. A non-finite loss or gradient norm raises
    ``LearnableSparsityError`` naming its step and ``variant``."""
    if not updates:
        return []
    parts = (t for u in updates for t in (u.losses, u.nlls, u.grad_norm, u.tokens))
    # float64 holds the float32 values and the counts exactly: one read for the window
    values = torch.cat([t.double().reshape(-1) for t in parts]).tolist()
    metrics, start = [], 0
    for step, u in enumerate(updates, start=first_step):
        parts = len(u.losses)
        losses, nlls = values[start : start + parts], values[start + parts : start + 2 * parts]
        grad_norm, tokens = values[start + 2 * parts : start + 2 * parts + 2]
        start += 2 * parts + 2
        loss_total, nll_total = 0.0, 0.0
        for loss, nll in zip(losses, nlls, strict=True):
            if not math.isfinite(loss):
                raise LearnableSparsityError(
                    f"non-finite loss {loss} at step {step} of variant {variant!r}"
                )
            loss_total, nll_total = loss_total + loss, nll_total + nll
        if not math.isfinite(grad_norm):
            raise LearnableSparsityError(
                f"non-finite gradient norm {grad_norm} at step {step} of variant {variant!r}"
            )
        metrics.append(
            {
                "loss": loss_total,
                "nll": nll_total / max(tokens, 1),
                "tokens": tokens,
                "grad_norm": grad_norm,
                "lr": u.lr,
            }
        )
    return metrics


def train_step(
    model: Seq2Seq,
    batch: Batch | Sequence[Batch],
    optimizer: Optimizer,
    scheduler: LRScheduler,
    clip_norm: float,
    label_smoothing: float,
    *,
    step: int,
    variant: str,
    precision: Precision = "float32",
) -> dict[str, float]:
    """One update on the per-token label-smoothed loss of ``batch``, or of several batches
    accumulated (normalised by all their target tokens); returns its metrics
    (:func:`read_updates`), read back before the optimizer's step.

    ``precision`` (:mod:`learnable_sparsity.precision`): TF32 matmuls for the update, or bf16
    autocast of the forward pass and loss; the loss, gradients and optimizer stay float32.

    Gradients are clipped to global norm ``clip_norm`` (0 disables clipping). A non-finite
    loss or gradient norm raises ``LearnableSparsityError`` naming ``step`` and ``variant``
    before the parameters are touched. The training loop takes the same update without the
    host syncs of this check (:func:`update`).
    """
    batches = [batch] if isinstance(batch, Batch) else list(batch)
    result = _backward(model, batches, optimizer, clip_norm, label_smoothing, precision)
    (metrics,) = read_updates([result], step, variant)
    optimizer.step()
    scheduler.step()
    return metrics


@torch.no_grad()
def validation_nll(model: Seq2Seq, examples: Sequence[Example], max_tokens: int) -> float:
    """Per-token negative log-likelihood (no label smoothing) of ``examples``, in eval mode, in
    float32 whatever the training's precision."""
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    device = next(model.parameters()).device
    for indices in batches_of(examples, max_tokens, None):
        batch = collate_examples(examples, indices, model).to(device)
        _, nll, n = label_smoothed_nll(
            model(batch.src, batch.tgt_in), batch.tgt_out, 0.0, model.config.pad_id
        )
        total, tokens = total + nll.item(), tokens + int(n)
    model.train(was_training)
    return total / max(tokens, 1)


def update_average(
    average: dict[str, Tensor] | None, model: nn.Module, step: int, decay: float
) -> dict[str, Tensor]:
    """The moving average of ``model``'s parameters after update ``step`` (see the module
    docstring): a copy at the first call, then (1 − w) avg + w θ with
    w = max(decay, 1 − (step + 1)/(step + 10))."""
    params = {name: p.detach().float() for name, p in model.named_parameters()}
    if average is None:
        return {name: value.clone() for name, value in params.items()}
    weight = max(decay, 1 - (step + 1) / (step + 10))
    return {name: (1 - weight) * average[name] + weight * params[name] for name in average}


def with_average(
    state: Mapping[str, Tensor], average: Mapping[str, Tensor] | None
) -> dict[str, Tensor]:
    """The state dict ``state`` with its parameters replaced by their ``average`` (if any)."""
    if average is None:
        return dict(state)
    return {
        name: average[name].to(value.dtype) if name in average else value
        for name, value in state.items()
    }


def _alphas(model: Seq2Seq) -> dict[str, list[float]]:
    return {block: alpha.tolist() for block, alpha in model.alphas().items()}


def train(
    model: Seq2Seq,
    train_set: Sequence[Example],
    valid_set: Sequence[Example],
    settings: TrainingSettings,
    *,
    checkpoint_dir: Path,
    variant: str,
    on_log: Callable[[int, dict[str, float]], None] | None = None,
    before_checkpoint: Callable[[int], None] | None = None,
    should_stop: Callable[[int], bool] | None = None,
) -> TrainingHistory:
    """Train ``model`` for ``settings.max_steps`` updates, resuming from ``checkpoint_dir``.

    Checkpoints (:class:`~learnable_sparsity.checkpoints.Checkpoint`): ``last.pt`` every
    ``checkpoint_every`` steps and at the end, plus ``step<N>.pt`` model weights of the last
    ``keep_checkpoints`` saves for checkpoint averaging. A checkpoint written with other
    settings (except :data:`RESUMABLE`) is refused, naming the differing keys. A NaN/Inf loss
    or gradient norm raises ``LearnableSparsityError`` naming the step and ``variant``, at the
    next log, validation or checkpoint (the updates between them read nothing back from the
    device, :func:`update`), before the history or a checkpoint keeps it. ``on_log(step, metrics)``
    gets every logged record (with tokens per second, which the history leaves out so that
    identical settings give identical files); ``before_checkpoint(step)`` precedes every save
    (flush the logged metrics there: what was logged before a checkpoint is then never lost).
    ``should_stop(step)``, asked after every update, ends training early when it returns True
    (a time budget running out): the run then validates, logs and checkpoints as at
    ``max_steps``, and the same settings resume it from there.
    """
    if not train_set or not valid_set:
        raise LearnableSparsityError(
            f"training needs examples: got {len(train_set)} train and {len(valid_set)} valid"
        )
    device = next(model.parameters()).device
    check_precision(settings.precision, device)
    optimizer, scheduler = build_optimizer(
        model,
        settings.peak_lr,
        settings.warmup,
        weight_decay=settings.weight_decay,
        alpha_lr_scale=settings.alpha_lr_scale,
        schedule=settings.schedule,
        max_steps=settings.max_steps,
    )
    torch.manual_seed(settings.seed)
    step, epoch, position = 0, 0, 0
    history = TrainingHistory([], [], [])
    # The updates since the last logged step (their average is the next record): kept in the
    # checkpoint, so that a resumed run logs the same averages as one never interrupted. The
    # latest are still on the device (``pending``) until a log, validation or checkpoint reads
    # them (``read_pending``): an update between those never waits for the device.
    window: list[dict[str, float]] = []
    pending: list[Update] = []
    average: dict[str, Tensor] | None = None  # the parameters' moving average (average_decay)
    resume = Checkpoint(checkpoint_dir, asdict(settings), resumable=settings.resumable())
    state = resume.load(map_location=device)
    if state is not None:
        model.load_state_dict(state["model"])
        load_optimizer_state(optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        restore_rng(state["rng"])
        step, epoch, position = state["step"], state["epoch"], state["position"]
        history, window = TrainingHistory(**state["history"]), state["window"]
        average = state.get("average")
        log.info("%s: resuming from %s at step %d", variant, resume.loaded_from, step)

    def read_pending() -> None:
        window.extend(read_updates(pending, step - len(pending) + 1, variant))
        pending.clear()

    def checkpoint(final: bool = False) -> None:
        read_pending()
        if before_checkpoint is not None:
            before_checkpoint(step)
        # This step's weights before last.pt, the resume point: a run killed between the two
        # resumes from the save before and writes these weights again (identically), so no
        # save goes missing from the checkpoint average, as it would in the other order.
        weights = with_average(model.state_dict(), average)
        save_atomic({"model": weights, "step": step}, checkpoint_dir / f"step{step}.pt")
        state = {
            "model": model.state_dict(),
            "average": average,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "step": step,
            "epoch": epoch,
            "position": position,
            "history": asdict(history),
            "window": window,
        }
        resume.save(state, final=final)
        saved = sorted(checkpoint_dir.glob("step*.pt"), key=lambda p: int(p.stem[4:]))
        for old in saved[: -settings.keep_checkpoints]:
            old.unlink()

    def record_validation() -> None:
        read_pending()
        if average is None:
            nll = validation_nll(model, valid_set, settings.max_tokens)
        else:  # the averaged weights are the ones kept: validate those (as OpenNMT does)
            trained = {name: value.clone() for name, value in model.state_dict().items()}
            model.load_state_dict(with_average(model.state_dict(), average))
            nll = validation_nll(model, valid_set, settings.max_tokens)
            model.load_state_dict(trained)
        history.valid.append({"step": step, "valid_nll": nll})
        if on_log is not None:
            on_log(step, {"valid_nll": nll, "valid_ppl": math.exp(min(nll, 50.0))})

    if step == 0 and _alphas(model):
        # The initial α (random in AST) anchors the trajectories: "first towards softmax, then
        # sparser" is measured from here.
        history.alphas.append({"step": 0, "alphas": _alphas(model)})
    model.train()
    window_start = time.perf_counter()
    run_start, start_step = time.perf_counter(), step
    stopping = False
    while step < settings.max_steps:
        order = batches_of(train_set, settings.max_tokens, settings.seed * 100_003 + epoch)
        while position < len(order) and step < settings.max_steps:
            group = order[position : position + settings.accumulate]
            batches = [collate_examples(train_set, indices, model) for indices in group]
            position += len(group)
            step += 1
            pending.append(
                update(
                    model,
                    batches,
                    optimizer,
                    scheduler,
                    settings.clip_norm,
                    settings.label_smoothing,
                    precision=settings.precision,
                )
            )
            if settings.average_decay > 0:
                average = update_average(average, model, step, settings.average_decay)
            stopping = should_stop is not None and step < settings.max_steps and should_stop(step)
            if step % settings.log_every == 0 or step == settings.max_steps or stopping:
                read_pending()
                elapsed = time.perf_counter() - window_start
                tokens = sum(m["tokens"] for m in window)
                trained = history.train[-1]["target_tokens"] if history.train else 0.0
                record = {
                    "loss": sum(m["loss"] * m["tokens"] for m in window) / tokens,
                    "nll": sum(m["nll"] * m["tokens"] for m in window) / tokens,
                    "lr": window[-1]["lr"],
                    "grad_norm": window[-1]["grad_norm"],
                    # the length of a run in the unit papers compare (AST: 1K steps of 8,192
                    # tokens), whatever this profile's batch
                    "target_tokens": trained + tokens,
                }
                history.train.append({"step": step, **record})
                metrics = {**record, "tokens_per_second": tokens / max(elapsed, 1e-9)}
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
                window.clear()
                window_start = time.perf_counter()
            if step % settings.validate_every == 0 and step < settings.max_steps:
                record_validation()
            if stopping:
                break
            if step % settings.checkpoint_every == 0 and step < settings.max_steps:
                checkpoint()
        if position >= len(order):
            epoch, position = epoch + 1, 0
        if stopping:
            log.info("%s: stopped at step %d of %d", variant, step, settings.max_steps)
            break
    if not history.valid or history.valid[-1]["step"] != step:
        record_validation()
    checkpoint(final=True)
    return history


def weight_files(checkpoint_dir: Path, average_last: int = 1) -> list[Path]:
    """The checkpoint files :func:`load_weights` reads: ``last.pt``, or the last
    ``average_last`` ``step<N>.pt`` saves."""
    if average_last <= 1:
        return [checkpoint_dir / LAST]
    saved = sorted(checkpoint_dir.glob("step*.pt"), key=lambda p: int(p.stem[4:]))
    if not saved:
        raise LearnableSparsityError(f"no step*.pt checkpoints in {checkpoint_dir}")
    return saved[-average_last:]


def load_weights(checkpoint_dir: Path, average_last: int = 1) -> dict[str, Tensor]:
    """Model weights from ``checkpoint_dir``: the final ones (their moving average where training
    kept one), or the mean of the last saves (which hold the moving average already)."""
    states = [load_file(path) for path in weight_files(checkpoint_dir, average_last)]
    if len(states) == 1:
        return with_average(states[0]["model"], states[0].get("average"))
    return average_checkpoints([state["model"] for state in states])


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
