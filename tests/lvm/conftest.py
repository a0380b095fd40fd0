"""Fixtures for the latent-variable tests: training a tiny model and judging its loss curve.

Every training run is seeded (model initialisation and the sampling generator), so the curves are
deterministic; "decreases" compares the mean loss of the first and last ``WINDOW`` steps.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from components.lvm.methods import Method
from components.lvm.training import fit

WINDOW = 8
# step_loss(model, method, step, generator) -> (loss, metrics)
StepLoss = Callable[[nn.Module, Method, int, torch.Generator], tuple[Tensor, dict[str, float]]]


def _train(
    model: nn.Module, method: Method, step_loss: StepLoss, n_steps: int = 40, lr: float = 1e-2
) -> list[float]:
    """Per-step ``loss`` metric of ``n_steps`` Adam steps on model and method parameters."""
    optimizer = torch.optim.Adam([*model.parameters(), *method.parameters()], lr=lr)
    generator = torch.Generator().manual_seed(1)
    history = fit(
        lambda step: step_loss(model, method, step, generator),
        optimizer,
        n_steps,
        method=method.name,
        log_every=1,
    )
    return history.series("loss")[1]


@pytest.fixture
def train() -> Callable[..., list[float]]:
    """``train(model, method, step_loss, n_steps=40, lr=1e-2)`` -> per-step losses."""
    return _train


def assert_decreases(losses: list[float], margin: float = 0.05) -> None:
    """The mean of the last WINDOW losses is below (1 − margin) × the mean of the first."""
    first = sum(losses[:WINDOW]) / WINDOW
    last = sum(losses[-WINDOW:]) / WINDOW
    assert last < (1 - margin) * first, f"loss did not decrease: {first:.4f} -> {last:.4f}"


@pytest.fixture
def decreases() -> Callable[[list[float]], None]:
    """The :func:`assert_decreases` check."""
    return assert_decreases
