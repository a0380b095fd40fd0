"""The shared training loop: non-finite guards, windowed metric logs."""

from __future__ import annotations

import pytest
import torch

from components.errors import LearnableSparsityError
from components.lvm.training import fit


def _setup() -> tuple[torch.nn.Parameter, torch.optim.Optimizer]:
    weight = torch.nn.Parameter(torch.ones(2))
    return weight, torch.optim.SGD([weight], lr=0.1)


def test_non_finite_loss_names_step_and_method() -> None:
    weight, optimizer = _setup()

    def step_fn(step: int):
        scale = float("nan") if step == 3 else 1.0
        return (weight * scale).sum(), {}

    with pytest.raises(LearnableSparsityError, match=r"step 3 \(method 'sparsemap'\)"):
        fit(step_fn, optimizer, 10, method="sparsemap")


def test_non_finite_gradient_names_step_and_method() -> None:
    weight, optimizer = _setup()

    def step_fn(step: int):
        # sqrt at 0: the value is finite, its gradient is not.
        return (weight * (step - 2)).abs().sqrt().sum(), {}

    with pytest.raises(LearnableSparsityError, match=r"gradient .* step 2 \(method 'sfe'\)"):
        fit(step_fn, optimizer, 10, method="sfe")


def test_metrics_are_averaged_over_each_log_window() -> None:
    weight, optimizer = _setup()
    logged: list[tuple[int, dict[str, float]]] = []

    def step_fn(step: int):
        metrics = {"loss": float(step)} | ({"support": 2.0 * step} if step % 2 else {})
        return weight.sum(), metrics

    history = fit(
        step_fn,
        optimizer,
        7,
        method="topk_sparsemax",
        log_every=3,
        start_step=10,
        on_log=lambda step, averages: logged.append((step, averages)),
    )
    assert history.steps == [12, 15, 16]
    assert history.series("loss") == ([12, 15, 16], [11.0, 14.0, 16.0])
    assert history.series("support") == ([12, 15], [22.0, 28.0])
    assert logged == list(zip(history.steps, history.records, strict=True))
    assert torch.allclose(weight, torch.full((2,), 1 - 0.7))
