r"""Training of the latent-variable experiments: the loop and resumable runs.

:func:`fit` is the loop. At each step t = start, …, start + n − 1: (loss, metrics) =
step_fn(t); stop with :class:`~learnable_sparsity.errors.LearnableSparsityError` if the loss or the
gradient norm is not finite; optionally clip the gradient norm; take an optimizer step. Metrics
are averaged over the steps since the last log and recorded every ``log_every`` steps (and at the
last step), so a pipeline can plot any of them over training — e.g. ``support`` (mean support
size of π per example), which the experiments report for the sparse methods.

A run's settings and cell: :mod:`learnable_sparsity.lvm.settings`. An experiment's
``setup(settings, data, cell, generator)`` builds a :class:`Setup` — model, :class:`Method`,
step function, final evaluation — and :func:`train_and_evaluate` runs one cell: Adam over the
model and method parameters, ``checkpoint_every`` steps at a time with a checkpoint after each
chunk, then the evaluation. A run stopped anywhere and restarted continues exactly as if it had
never stopped (from its last checkpoint), also with more ``steps``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from learnable_sparsity.checkpoints import Checkpoint, restore_rng, rng_state
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.lvm.methods import Method
from learnable_sparsity.lvm.settings import LvmCell, LvmSettings
from learnable_sparsity.precision import Precision, autocast, check_precision, matmul_precision

log = logging.getLogger(__name__)

# step -> (loss to backpropagate, metrics of this step)
StepFn = Callable[[int], tuple[Tensor, Mapping[str, float]]]
# (step, metrics averaged since the previous log) -> None
LogFn = Callable[[int, dict[str, float]], None]


@dataclass
class History:
    """Logged steps and, for each, the metrics averaged over the steps since the previous log."""

    steps: list[int] = field(default_factory=list)
    records: list[dict[str, float]] = field(default_factory=list)

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of metric ``name`` at the logged steps that have it."""
        pairs = [(s, r[name]) for s, r in zip(self.steps, self.records, strict=True) if name in r]
        return [s for s, _ in pairs], [v for _, v in pairs]


def fit(
    step_fn: StepFn,
    optimizer: Optimizer,
    n_steps: int,
    *,
    method: str,
    log_every: int = 100,
    on_log: LogFn | None = None,
    start_step: int = 0,
    max_grad_norm: float | None = None,
    precision: Precision = "float32",
) -> History:
    """Run ``n_steps`` optimizer steps of ``step_fn``; returns the :class:`History` of the logs.

    ``method`` names the run in error messages. The gradient norm is over the optimizer's
    parameters; ``max_grad_norm`` clips it (None: no clipping). ``on_log(step, averages)`` is
    called at each logged step. ``precision`` (:mod:`learnable_sparsity.precision`): TF32
    matmuls for the step, or ``step_fn`` under bf16 autocast; its loss is taken in float32 and
    the gradients and optimizer stay float32.
    """
    if n_steps < 1 or log_every < 1:
        raise LearnableSparsityError(
            f"need n_steps >= 1 and log_every >= 1, got n_steps={n_steps}, log_every={log_every}"
        )
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    device = parameters[0].device
    history = History()
    window: dict[str, list[float]] = {}
    last = start_step + n_steps - 1
    for step in range(start_step, last + 1):
        optimizer.zero_grad(set_to_none=True)
        with matmul_precision(precision, device):
            with autocast(precision, device):
                loss, metrics = step_fn(step)
            loss = loss.float()
            if not bool(torch.isfinite(loss)):
                raise LearnableSparsityError(
                    f"non-finite loss {float(loss.detach())} at step {step} (method {method!r})"
                )
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(
            parameters, math.inf if max_grad_norm is None else max_grad_norm
        )
        if not bool(torch.isfinite(norm)):
            raise LearnableSparsityError(
                f"non-finite gradient norm {float(norm)} at step {step} (method {method!r})"
            )
        optimizer.step()
        for name, value in metrics.items():
            window.setdefault(name, []).append(float(value))
        if (step - start_step + 1) % log_every == 0 or step == last:
            averages = {name: sum(values) / len(values) for name, values in window.items()}
            history.steps.append(step)
            history.records.append(averages)
            window = {}
            if on_log is not None:
                on_log(step, averages)
    return history


# ----------------------------------------------------------------------------- one run

# Settings a run may change and still resume from its checkpoint: training longer, logging or
# checkpointing at another rate. Any other change makes the resumed run a different one.
RESUMABLE = ("steps", "log_every", "checkpoint_every")
# The same test draws (binarisation, test games, importance samples) for every method and seed,
# so that differences between cells are the trained models', not the evaluation's noise.
EVALUATION_SEED = 1234
# The series of the training history a run returns as curves.
CURVES = ("loss", "decoder_calls", "support")

S = TypeVar("S", bound=LvmSettings)
D = TypeVar("D")


@dataclass(frozen=True)
class WarmStart:
    """A first phase of a run, as the released SSVAE code's separate warm-start run: its ``steps``
    steps train at rate ``lr``; every ``every`` steps and at its end ``score()`` (lower is
    better, e.g. a validation loss, drawn from :func:`evaluation_generator`) is taken, and the
    run goes on from the model weights of the best score with a fresh optimizer at the method's
    rate, as a run loaded from the warm start's best checkpoint would."""

    steps: int
    lr: float
    every: int
    score: Callable[[], float]


class Setup(NamedTuple):
    """What an experiment's ``setup`` builds for a cell: the ``model``, the ``method`` (its
    estimator and state), ``step_fn`` (step -> (loss, metrics), drawing from the run's
    generator, with the data on that generator's device), ``evaluate`` (the final test metrics,
    drawn from :func:`evaluation_generator`) and an optional ``warm_start`` phase."""

    model: nn.Module
    method: Method
    step_fn: StepFn
    evaluate: Callable[[], dict[str, float]]
    warm_start: WarmStart | None = None


# setup(settings, data, cell, generator) -> Setup
SetupFn = Callable[[S, D, LvmCell, torch.Generator], Setup]


@dataclass(frozen=True)
class Result:
    """A trained and evaluated cell. ``metrics``: the experiment's test metrics, plus
    ``decoder_calls`` (mean per example over training) and, for the sparse methods,
    ``support`` (mean support size over training). ``curves``: (steps, values) of each of
    :data:`CURVES` at the logged steps (empty where not recorded)."""

    metrics: dict[str, float]
    curves: dict[str, tuple[list[int], list[float]]]


def _score_warm_start(
    warm: WarmStart, model: nn.Module, step: int, best: dict[str, Any] | None
) -> dict[str, Any]:
    """The warm start's best (``at``: score and step, ``model``: a copy of its weights) after
    scoring ``model`` at ``step`` (the first of equal scores stays)."""
    model.eval()
    with torch.no_grad():
        score = float(warm.score())
    model.train()
    if best is not None and best["at"][0] <= score:
        return best
    weights = {key: value.detach().clone() for key, value in model.state_dict().items()}
    return {"at": (score, step), "model": weights}


def sample_batch(n: int, size: int, generator: torch.Generator) -> Tensor:
    """``size`` indices drawn uniformly with replacement from 0..n−1 (a training batch), on the
    generator's device."""
    return torch.randint(n, (size,), generator=generator, device=generator.device)


def evaluation_generator(device: torch.device | str = "cpu") -> torch.Generator:
    """A fresh generator on ``device`` seeded with :data:`EVALUATION_SEED`, for a final
    evaluation."""
    return torch.Generator(device=device).manual_seed(EVALUATION_SEED)


def train_and_evaluate(
    setup: SetupFn[S, D],
    settings: S,
    data: D,
    cell: LvmCell,
    directory: Path,
    *,
    name: str | None = None,
    on_log: LogFn | None = None,
    before_checkpoint: Callable[[int], None] | None = None,
    provenance: Mapping[str, Any] | None = None,
    device: torch.device | str = "cpu",
) -> Result:
    r"""Train ``cell`` for ``settings.steps`` steps, resuming from ``directory``, and evaluate.

    ``settings`` are narrowed to the cell first (:meth:`LvmSettings.for_cell`). Seeds the global
    torch RNG (model initialisation) and the run's generator on ``device`` (batches,
    binarisation, sampling estimators) with ``cell.seed``, then builds the experiment with
    ``setup(settings, data, cell, generator)`` (which puts its data on the generator's device),
    moves the model and the method to ``device`` and trains them with Adam at the method's ``lr``
    over the model and method parameters, ``checkpoint_every`` steps at a time. After each chunk
    ``directory/last.pt`` holds everything needed to continue identically (model, optimizer,
    method state, both RNG states, step, history); a run finds it, checks it was
    written under the same :meth:`LvmSettings.run_settings` (and ``provenance``, e.g. digests of
    the data and code), except for the :data:`RESUMABLE` keys, and continues from it.

    ``name`` (default: the cell's key) names the run in logs and errors; ``on_log(step,
    metrics)`` receives each logged average (e.g. to forward to a tracking server) and
    ``before_checkpoint(step)`` precedes each checkpoint (flush those there: what was logged
    before a checkpoint is then never lost). Nothing
    measured in wall-clock time is kept in the checkpoint or the result: identical settings give
    identical files and numbers.
    """
    name = cell.key if name is None else name
    settings = settings.for_cell(cell)  # the cell's own lr, overrides, … in place
    check_precision(settings.precision, device)
    torch.manual_seed(cell.seed)
    generator = torch.Generator(device=device).manual_seed(cell.seed)
    model, method, step_fn, evaluate, warm = setup(settings, data, cell, generator)
    model.to(device)  # initialised on the CPU: the same weights on every device
    method.to(device)
    lr = settings.per_method("lr", cell.method)

    def adam(rate: float) -> Optimizer:
        parameters = [*model.parameters(), *method.parameters()]
        return torch.optim.Adam(parameters, lr=rate, weight_decay=settings.weight_decay)

    def warming(at: int) -> bool:
        return warm is not None and at < warm.steps

    optimizer = adam(warm.lr if warming(0) else lr)
    run_settings = settings.run_settings(cell) | {"provenance": dict(provenance or {})}
    checkpoint = Checkpoint(directory, run_settings, resumable=RESUMABLE)
    step, history = 0, History()
    best: dict[str, Any] | None = None  # the warm start's best so far: score, step, model
    state = checkpoint.load(map_location=device)
    if state is not None:
        if state["step"] > settings.steps:
            raise LearnableSparsityError(
                f"{name}: the checkpoint in {directory} is at step {state['step']}, past "
                f"steps={settings.steps}; remove it to train from scratch"
            )
        model.load_state_dict(state["model"])
        if not warming(state["step"]):
            optimizer = adam(lr)
        optimizer.load_state_dict(state["optimizer"])
        method.load_state_dict(state["method"])
        restore_rng(state["rng"], generator)
        step, history, best = state["step"], History(**state["history"]), state.get("best")
        log.info("%s: resuming from %s at step %d", name, checkpoint.loaded_from, step)

    start, first = time.perf_counter(), step

    def progress(at: int, metrics: dict[str, float]) -> None:
        if on_log is not None:
            on_log(at, metrics)
        eta = (time.perf_counter() - start) / (at + 1 - first) * (settings.steps - at - 1)
        log.info(
            "%s: step %d/%d loss %.4f ETA %.0fs", name, at + 1, settings.steps, metrics["loss"], eta
        )

    def next_stop(at: int) -> int:
        """Where the chunk from ``at`` ends: a checkpoint, the end, or a warm-start score."""
        every = settings.checkpoint_every
        stop = min(settings.steps, (at // every + 1) * every)
        if warm is not None and warming(at):
            stop = min(stop, warm.steps, (at // warm.every + 1) * warm.every)
        return stop

    while step < settings.steps:
        stop = next_stop(step)
        part = fit(
            step_fn,
            optimizer,
            stop - step,
            method=name,
            log_every=settings.log_every,
            on_log=progress,
            start_step=step,
            precision=settings.precision,
        )
        history.steps += part.steps
        history.records += part.records
        step = stop
        if (
            warm is not None
            and step <= warm.steps
            and (step % warm.every == 0 or step == warm.steps)
        ):
            best = _score_warm_start(warm, model, step, best)
            if step == warm.steps:
                log.info("%s: warm start's best score %.4f at step %d", name, *best["at"])
                model.load_state_dict(best["model"])
                optimizer, best = adam(lr), None
        if step % settings.checkpoint_every and step < settings.steps:
            continue
        if before_checkpoint is not None:
            before_checkpoint(step)
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "method": method.state_dict(),
            "rng": rng_state(generator),
            "step": step,
            "history": dataclasses.asdict(history),
            "best": best,
        }
        checkpoint.save(state, final=step == settings.steps)
    model.eval()
    metrics = evaluate()
    metrics["decoder_calls"] = statistics.fmean(history.series("decoder_calls")[1])
    support = history.series("support")[1]
    if support:
        metrics["support"] = statistics.fmean(support)
    return Result(metrics, {series: history.series(series) for series in CURVES})
