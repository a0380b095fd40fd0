"""Checkpoints load as plain data only: a tampered file that would run code is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learnable_sparsity.checkpoints import Checkpoint, load_file, rng_state, save_atomic
from learnable_sparsity.errors import LearnableSparsityError


def _touch(path: Path) -> None:
    path.touch()


class _TouchOnLoad:
    """Unpickled, it creates a file: what a tampered checkpoint could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (_touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    tampered = tmp_path / "last.pt"
    torch.save({"model": {"w": torch.ones(2)}, "step": 3, "x": _TouchOnLoad(marker)}, tampered)
    refused = r"last\.pt refused: it holds (tests\.)?test_checkpoints\._touch, not plain data"
    with pytest.raises(LearnableSparsityError, match=refused):
        load_file(tampered)
    assert not marker.exists()
    # the same file, loaded the unsafe way, does run it: the test's premise
    torch.load(tampered, weights_only=False)
    assert marker.exists()


def test_a_training_state_loads_whole(tmp_path: Path) -> None:
    """What the training loops save (weights, optimizer, random states, history) loads back."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    generator = torch.Generator().manual_seed(1)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": rng_state(generator),
        "history": {"train": [{"step": 1, "loss": 0.5}], "alphas": []},
        "step": 1,
        "average": None,
    }
    checkpoint = Checkpoint(tmp_path, {"lr": 0.1})
    checkpoint.save(state, final=True)
    loaded = checkpoint.load()
    assert loaded is not None and loaded["step"] == 1 and loaded["history"] == state["history"]
    torch.testing.assert_close(loaded["model"]["weight"], model.weight.detach())
    assert loaded["optimizer"]["state"][0]["exp_avg"].shape == (2, 3)
    save_atomic({"model": model.state_dict(), "step": 1}, tmp_path / "step1.pt")
    assert load_file(tmp_path / "step1.pt")["step"] == 1
