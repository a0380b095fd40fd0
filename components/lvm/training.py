r"""The training loop shared by the three latent-variable experiments.

At each step t = start, …, start + n − 1: (loss, metrics) = step_fn(t); stop with
:class:`~components.errors.LearnableSparsityError` if the loss or the gradient norm is not
finite; optionally clip the gradient norm; take an optimizer step. Metrics are averaged over the
steps since the last log and recorded every ``log_every`` steps (and at the last step), so a
pipeline can plot any of them over training — e.g. ``support`` (mean support size of π per
example), which the experiments report for the sparse methods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.optim import Optimizer

from components.errors import LearnableSparsityError

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
) -> History:
    """Run ``n_steps`` optimizer steps of ``step_fn``; returns the :class:`History` of the logs.

    ``method`` names the run in error messages. The gradient norm is over the optimizer's
    parameters; ``max_grad_norm`` clips it (None: no clipping). ``on_log(step, averages)`` is
    called at each logged step.
    """
    if n_steps < 1 or log_every < 1:
        raise LearnableSparsityError(
            f"need n_steps >= 1 and log_every >= 1, got n_steps={n_steps}, log_every={log_every}"
        )
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    history = History()
    window: dict[str, list[float]] = {}
    last = start_step + n_steps - 1
    for step in range(start_step, last + 1):
        optimizer.zero_grad(set_to_none=True)
        loss, metrics = step_fn(step)
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
