"""The latent-variable grid cell: resume after an interruption continues identically."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from components.errors import LearnableSparsityError
from pipelines import images, tracking, train_lvm
from pipelines.params import Params

SETTINGS = {
    "data": "digits",
    "bits": [8],
    "methods": ["sfe"],
    "seeds": [0],
    "topk": 10,
    "hidden": 16,
    "rank": None,
    "steps": 8,
    "batch_size": 8,
    "lr": {"default": 0.01},
    "gumbel_rate": 0.0001,
    "importance_samples": 8,
    "test_examples": 6,
    "log_every": 2,
    "checkpoint_every": 4,
}


class NoRun:
    """Stands in for the MLflow run of a cell."""

    def __init__(self, *_: object) -> None:
        pass

    def __enter__(self) -> NoRun:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def log_metrics(self, *_: object, **__: object) -> None:
        pass


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tracking, "RunLogger", NoRun)
    spec = Params({"source": "digits", "seed": 0}, "params.yaml", "images.digits.")
    saved = images.build("digits", spec)
    images.OUT.mkdir(parents=True)
    torch.save(saved, images.OUT / "digits.pt")
    return tmp_path


def task(settings: dict) -> dict:
    cell = train_lvm.LvmCell("bitvector_vae", "sfe", 0, 8)
    return {
        "cell": cell.__dict__,
        "settings": settings,
        "fingerprint": "same-settings",
        "mlflow_uri": "",
        "run_id": "",
    }


def test_an_interrupted_cell_resumes_from_its_checkpoint_identically(workdir: Path) -> None:
    straight = train_lvm.train_cell(task(SETTINGS))
    checkpoint = train_lvm.MODELS / "bitvector_vae" / "D8/sfe/seed0" / train_lvm.LAST
    straight_state = torch.load(checkpoint, weights_only=False)["model"]
    checkpoint.unlink()

    # "Interrupted" after the first checkpoint: the same cell, stopped at step 4.
    train_lvm.train_cell(task({**SETTINGS, "steps": 4}))
    assert torch.load(checkpoint, weights_only=False)["step"] == 4
    resumed = train_lvm.train_cell(task(SETTINGS))
    resumed_state = torch.load(checkpoint, weights_only=False)["model"]

    for key, value in straight_state.items():
        torch.testing.assert_close(resumed_state[key], value, rtol=0, atol=0, msg=key)
    assert resumed["curves"]["loss"] == straight["curves"]["loss"]
    assert resumed["metrics"]["nll_bits_per_dim"] == straight["metrics"]["nll_bits_per_dim"]


def test_a_checkpoint_of_other_settings_is_ignored(workdir: Path) -> None:
    train_lvm.train_cell(task({**SETTINGS, "steps": 4}))
    other = copy.deepcopy(task(SETTINGS))
    other["fingerprint"] = "other-settings"
    result = train_lvm.train_cell(other)
    assert result["curves"]["loss"][0][0] == 1  # trained from step 0 (first log after 2 steps)


def test_grid_names_the_bad_method(workdir: Path) -> None:
    params = Params(
        {"lvm": {"signal_game": {"methods": ["dense", "sparsemap"], "seeds": [0]}}},
        "params.yaml",
    )
    with pytest.raises(LearnableSparsityError, match=r"lvm.signal_game.methods has 'sparsemap'"):
        train_lvm.grid(params, "signal_game")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": 0}, r"lvm.bitvector_vae.steps must be >= 1"),
        ({"lr": {"sfe": 0.1}}, r"lvm.bitvector_vae.lr.default is missing"),
        ({"lr": {"default": "fast"}}, r"lvm.bitvector_vae.lr.default is 'fast'"),
    ],
)
def test_settings_errors_name_the_key(change: dict, message: str) -> None:
    params = Params({"lvm": {"bitvector_vae": {**SETTINGS, **change}}}, "params.yaml")
    with pytest.raises(LearnableSparsityError, match=message):
        train_lvm.check_settings(params, "bitvector_vae")
