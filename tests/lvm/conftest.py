"""Fixtures for the latent-variable tests: training a tiny model and judging its loss curve;
small valid settings of each experiment and tiny synthetic data to run them on.

Every training run is seeded (model initialisation and the sampling generator), so the curves are
deterministic; "decreases" compares the mean loss of the first and last ``WINDOW`` steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from learnable_sparsity.data.images import ImageSet, ImageSplits
from learnable_sparsity.data.signal_game import GameData, GameSplits
from learnable_sparsity.lvm.bitvector_vae import BitVectorVaeSettings
from learnable_sparsity.lvm.methods import Method
from learnable_sparsity.lvm.settings import LvmSettings
from learnable_sparsity.lvm.signal_game import SignalGameSettings
from learnable_sparsity.lvm.ssvae import SsvaeSettings
from learnable_sparsity.lvm.training import fit
from learnable_sparsity.settings import build

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


SETTINGS_CLASSES: dict[str, type[LvmSettings]] = {
    "ssvae": SsvaeSettings,
    "signal_game": SignalGameSettings,
    "bitvector_vae": BitVectorVaeSettings,
}
_SHARED = {
    "data": "synthetic",
    "methods": ["sfe", "gumbel"],
    "seeds": [0, 1],
    "steps": 8,
    "batch_size": 8,
    "lr": {"default": 0.01, "sfe": 0.005},
    "gumbel_rate": 1e-4,
    "log_every": 2,
    "checkpoint_every": 4,
}
# Small valid params sections, as YAML gives them (lists, not tuples).
SMALL_SETTINGS: dict[str, dict[str, Any]] = {
    "ssvae": _SHARED
    | {
        "labelled_fraction": 0.25,
        "latent_dim": 4,
        "classifier_hidden": [16],
        "hidden": [16],
        "classifier_weight": 1.0,
        "pretrain_steps": 2,
    },
    "signal_game": _SHARED
    | {
        "methods": ["sfe_nll", "sfe_zero_one", "gumbel"],
        "candidates": 4,
        "vocab_size": 8,
        "hidden": 16,
        "embedding": 8,
        "entropy_coef": {"default": 0.1, "sfe_zero_one": 0.01},
        "test_games": 16,
    },
    "bitvector_vae": _SHARED
    | {
        "bits": [8, 4],
        "topk": 10,
        "hidden": 16,
        "rank": None,
        "importance_samples": 8,
        "test_examples": 6,
    },
}


def _lvm_settings(experiment: str, **change: Any) -> LvmSettings:
    return build(
        SETTINGS_CLASSES[experiment], SMALL_SETTINGS[experiment] | change, f"lvm.{experiment}"
    )


@pytest.fixture
def lvm_settings() -> Callable[..., LvmSettings]:
    """``lvm_settings(experiment, **change)``: the small settings of ``experiment`` with the
    keys in ``change`` replaced, built as from ``params.yaml`` section ``lvm.<experiment>``."""
    return _lvm_settings


@pytest.fixture(scope="session")
def image_splits() -> ImageSplits:
    """Random 4×4 images with 4 grey levels and 3 classes: 40 train, 10 valid, 12 test."""
    generator = torch.Generator().manual_seed(0)
    levels, side = 4, 4

    def part(n: int) -> ImageSet:
        images = torch.randint(levels, (n, side * side), generator=generator) / (levels - 1)
        return ImageSet(images, torch.arange(n) % 3)

    return ImageSplits(part(40), part(10), part(12), levels=levels, side=side)


@pytest.fixture(scope="session")
def game_splits() -> GameSplits:
    """Gaussian 8-d features of 6 concepts: 36 train, 12 valid, 24 test images."""
    generator = torch.Generator().manual_seed(0)
    names = tuple(f"concept{c}" for c in range(6))

    def part(n: int) -> GameData:
        return GameData(torch.randn(n, 8, generator=generator), torch.arange(n) % 6, names)

    return GameSplits(part(36), part(12), part(24))
