"""A training state saved as a checkpoint loads back whole (its file I/O: tests/test_files.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from learnable_sparsity.checkpoints import Checkpoint, rng_state
from learnable_sparsity.files import load_file, save_atomic


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
