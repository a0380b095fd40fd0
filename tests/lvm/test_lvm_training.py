"""The shared training loop (non-finite guards, windowed metric logs) and one resumable run
(train, checkpoint, resume identically, evaluate)."""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from learnable_sparsity.checkpoints import LAST, PREVIOUS
from learnable_sparsity.data.images import ImageSplits
from learnable_sparsity.data.signal_game import GameSplits
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.lvm import bitvector_vae, signal_game, ssvae
from learnable_sparsity.lvm.methods import build_method
from learnable_sparsity.lvm.settings import LvmCell, LvmSettings
from learnable_sparsity.lvm.training import Result, Setup, WarmStart, fit, train_and_evaluate
from tests.conftest import DEVICES


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


SETUPS = {
    "ssvae": ssvae.setup,
    "signal_game": signal_game.setup,
    "bitvector_vae": bitvector_vae.setup,
}


class KilledError(Exception):
    """Stands in for a run killed mid-training."""


@pytest.fixture
def run(
    lvm_settings: Callable[..., LvmSettings], image_splits: ImageSplits, game_splits: GameSplits
) -> Callable[..., Result]:
    """``run(directory, cell, experiment="bitvector_vae", on_log=None, provenance=None,
    device="cpu", **changed settings)`` -> the :class:`Result` of :func:`train_and_evaluate`."""

    def go(
        directory: Path,
        cell: LvmCell,
        experiment: str = "bitvector_vae",
        on_log: Callable[[int, dict[str, float]], None] | None = None,
        provenance: dict[str, Any] | None = None,
        device: str = "cpu",
        **change: Any,
    ) -> Result:
        data = game_splits if experiment == "signal_game" else image_splits
        settings = lvm_settings(experiment, **change)
        return train_and_evaluate(
            SETUPS[experiment],
            settings,
            data,
            cell,
            directory,
            on_log=on_log,
            provenance=provenance,
            device=device,
        )

    return go


def _saved(directory: Path, name: str = LAST) -> dict[str, Any]:
    return torch.load(directory / name, weights_only=False)


def _assert_same_run(a: Result, b: Result, dir_a: Path, dir_b: Path) -> None:
    """Same final weights, curves and metrics (but the timings)."""
    weights_a, weights_b = _saved(dir_a)["model"], _saved(dir_b)["model"]
    assert weights_a.keys() == weights_b.keys()
    for key, value in weights_a.items():
        torch.testing.assert_close(weights_b[key], value, rtol=0, atol=0, msg=key)
    assert a.curves == b.curves
    assert a.metrics == b.metrics


@pytest.mark.parametrize("method", ["sfe", "nvil"])  # with a moving average / a baseline net
def test_an_interrupted_run_resumes_from_its_checkpoint_identically(
    run: Callable[..., Result], tmp_path: Path, method: str
) -> None:
    cell = LvmCell(method, 0, 8)
    straight = run(tmp_path / "straight", cell)

    # "KilledError" after the first checkpoint: the same cell, stopped at step 4.
    run(tmp_path / "resumed", cell, steps=4)
    assert _saved(tmp_path / "resumed")["step"] == 4
    resumed = run(tmp_path / "resumed", cell)

    _assert_same_run(straight, resumed, tmp_path / "straight", tmp_path / "resumed")
    assert resumed.curves["loss"][0] == [1, 3, 5, 7]


def test_a_corrupt_last_checkpoint_falls_back_to_the_previous_one(
    run: Callable[..., Result], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cell, every_step = LvmCell("gumbel", 1, 4), {"checkpoint_every": 2, "log_every": 1}
    straight = run(tmp_path / "straight", cell, **every_step)

    def stop_at_step_4(step: int, _: dict[str, float]) -> None:
        if step == 4:
            raise KilledError

    broken = tmp_path / "broken"
    with pytest.raises(KilledError):
        run(broken, cell, on_log=stop_at_step_4, **every_step)
    assert (_saved(broken, PREVIOUS)["step"], _saved(broken)["step"]) == (2, 4)
    (broken / LAST).write_bytes(b"half a checkpoint")

    with caplog.at_level(logging.INFO):
        resumed = run(broken, cell, **every_step)
    assert "cannot be read" in caplog.text
    # the log names the file it resumed from (issue 38: it said last.pt, which was unreadable)
    assert f"resuming from {broken / PREVIOUS} at step 2" in caplog.text
    _assert_same_run(straight, resumed, tmp_path / "straight", broken)
    assert not (broken / PREVIOUS).exists()  # a finished run keeps one checkpoint


def test_a_checkpoint_of_other_settings_is_refused_naming_the_key(
    run: Callable[..., Result], tmp_path: Path
) -> None:
    cell = LvmCell("sfe", 0, 8)
    run(tmp_path, cell, steps=4)
    with pytest.raises(LearnableSparsityError, match=r"other settings \(batch_size\)"):
        run(tmp_path, cell, batch_size=4)
    with pytest.raises(LearnableSparsityError, match=r"other settings \(provenance\)"):
        run(tmp_path, cell, provenance={"data": "another digest"})
    # Another method's learning rate is not this run's setting: it resumes.
    resumed = run(tmp_path, cell, lr={"default": 0.01, "sfe": 0.005, "gumbel": 1.0})
    assert resumed.curves["loss"][0] == [1, 3, 5, 7]


def test_a_checkpoint_past_the_steps_is_refused(run: Callable[..., Result], tmp_path: Path) -> None:
    run(tmp_path, LvmCell("sfe", 0, 8))
    with pytest.raises(LearnableSparsityError, match=r"at step 8, past steps=4"):
        run(tmp_path, LvmCell("sfe", 0, 8), steps=4)


@pytest.mark.parametrize(
    ("experiment", "cell", "headline"),
    [
        ("ssvae", LvmCell("sparsemax", 0), ("accuracy", "test_nelbo")),
        ("signal_game", LvmCell("sparsemax", 0), ("communication_success",)),
        (
            "bitvector_vae",
            LvmCell("topk_sparsemax", 0, 4),
            ("nll_bits_per_dim", "nll_estimate_drift", "kl_nats", "latent_dim"),
        ),
    ],
)
def test_each_experiment_trains_evaluates_and_reports(
    run: Callable[..., Result],
    tmp_path: Path,
    experiment: str,
    cell: LvmCell,
    headline: tuple[str, ...],
) -> None:
    logged: list[int] = []
    result = run(tmp_path, cell, experiment, on_log=lambda step, _: logged.append(step))
    assert list(result.metrics) == [*headline, "decoder_calls", "support"]
    assert logged == result.curves["loss"][0] == [1, 3, 5, 7]
    assert result.curves["support"][1] == result.curves["decoder_calls"][1]
    assert result.metrics["support"] == statistics.fmean(result.curves["support"][1])
    # Run again: the finished checkpoint is evaluated as it is, training time included.
    again = run(tmp_path, cell, experiment, on_log=lambda step, _: logged.append(step))
    assert again == result and len(logged) == 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("experiment", "cell"),
    [
        ("ssvae", LvmCell("nvil", 1)),
        ("signal_game", LvmCell("sfe_zero_one", 1)),
        ("bitvector_vae", LvmCell("sparsemap", 1, 4)),
    ],
)
def test_each_experiment_runs_and_resumes_on_each_device(
    run: Callable[..., Result], tmp_path: Path, experiment: str, cell: LvmCell, device: str
) -> None:
    """Data, batches, model, method and every random draw on ``device``: a run stopped after
    its first checkpoint and resumed there ends as the straight one."""
    grid = {"device": device, "methods": [cell.method]}
    straight = run(tmp_path / "straight", cell, experiment, **grid)
    run(tmp_path / "resumed", cell, experiment, steps=4, **grid)
    resumed = run(tmp_path / "resumed", cell, experiment, **grid)
    assert resumed == straight
    assert all(math.isfinite(value) for value in straight.metrics.values())


def test_weight_decay_reaches_the_optimizer(run: Callable[..., Result], tmp_path: Path) -> None:
    """The released SSVAE code's Adam L2 term: the same run with it ends with other weights,
    and it is a setting of the run (a checkpoint of the other value is refused)."""
    cell = LvmCell("sfe", 0, 8)
    run(tmp_path / "plain", cell)
    run(tmp_path / "decayed", cell, weight_decay=0.1)
    plain, decayed = _saved(tmp_path / "plain")["model"], _saved(tmp_path / "decayed")["model"]
    assert any(not torch.equal(plain[key], decayed[key]) for key in plain)
    with pytest.raises(LearnableSparsityError, match="weight_decay"):
        run(tmp_path / "plain", cell, weight_decay=0.1, steps=16)


def test_a_warm_start_hands_its_best_weights_to_a_fresh_optimizer(
    lvm_settings: Callable[..., LvmSettings], tmp_path: Path
) -> None:
    """The released SSVAE code's warm start: scored every ``every`` steps and at its end, the
    run goes on from the best-scoring weights; a fresh Adam's first step moves every weight by
    its rate (``lr``), so the step sizes show which optimizer took each step."""
    warm_lr, main_lr, scores = 0.1, 0.01, [3.0, 1.0, 2.0]  # the best at the 2nd score (step 4)
    weights_at: dict[int, torch.Tensor] = {}

    def toy(settings: LvmSettings, data: None, cell: LvmCell, generator: torch.Generator) -> Setup:
        model = torch.nn.Linear(2, 1, bias=False)

        def step_fn(step: int) -> tuple[torch.Tensor, dict[str, float]]:
            weights_at[step] = model.weight.detach().clone()
            # a constant gradient: every Adam step moves each weight by the rate exactly
            return -model.weight.sum(), {"loss": 0.0, "decoder_calls": 0.0}

        def score() -> float:
            return scores.pop(0)

        warm = WarmStart(steps=5, lr=warm_lr, every=2, score=score)
        return Setup(model, build_method("dense", "categorical"), step_fn, dict, warm)

    settings = lvm_settings("ssvae", steps=8, lr={"default": main_lr}, checkpoint_every=4)
    train_and_evaluate(toy, settings, None, LvmCell("dense", 0), tmp_path)
    assert scores == []  # scored at steps 2, 4 and 5 (its end)

    def step_size(at: int) -> torch.Tensor:
        return (weights_at[at + 1] - weights_at[at]).abs()

    assert all(torch.allclose(step_size(at), torch.tensor(warm_lr)) for at in range(4))
    # step 4's update is dropped: step 5 starts from the weights scored best (at step 4) ...
    torch.testing.assert_close(weights_at[5], weights_at[4], rtol=0, atol=0)
    # ... and a fresh Adam takes it on at the method's rate
    assert torch.allclose(step_size(5), torch.tensor(main_lr))
    final = _saved(tmp_path)["model"]["weight"]
    torch.testing.assert_close(final, weights_at[4] + 3 * main_lr)
    assert _saved(tmp_path)["best"] is None  # kept only while the warm start runs


def test_an_interrupted_warm_start_resumes_identically(
    run: Callable[..., Result], tmp_path: Path
) -> None:
    warm = {
        "warm_start": {"lr": 0.02, "validate_every": 2},
        "pretrain_steps": 5,
        "steps": 8,
        "checkpoint_every": 2,
        "log_every": 1,
    }
    cell = LvmCell("gumbel", 0)
    straight = run(tmp_path / "straight", cell, "ssvae", **warm)

    def stop_in_the_last_warm_step(step: int, _: dict[str, float]) -> None:
        if step == 4:
            raise KilledError

    broken = tmp_path / "broken"
    with pytest.raises(KilledError):
        run(broken, cell, "ssvae", on_log=stop_in_the_last_warm_step, **warm)
    saved = _saved(broken)
    assert saved["step"] == 4 and saved["best"]["at"][1] in (2, 4)  # scored at 2 and 4
    resumed = run(broken, cell, "ssvae", **warm)
    _assert_same_run(straight, resumed, tmp_path / "straight", broken)
    plain = run(tmp_path / "plain", cell, "ssvae", **(warm | {"warm_start": None}))
    assert plain.metrics != straight.metrics
