"""The training loop: resume after an interruption continues identically; checkpoints; history."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt import training
from learnable_sparsity.nmt.batching import batches_of
from learnable_sparsity.nmt.model import Transformer
from learnable_sparsity.nmt.training import TrainingSettings, load_weights, train, validation_nll
from tests.tiny_transformer import tiny_model


def copy_task(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        source = [rng.randrange(4, 20) for _ in range(rng.randrange(2, 8))]
        examples.append((source, source[::-1]))
    return examples


TRAIN, VALID = copy_task(120, 0), copy_task(20, 1)


def settings(**overrides) -> TrainingSettings:
    values = {
        "max_steps": 12,
        "max_tokens": 120,
        "warmup": 4,
        "peak_lr": 3e-3,
        "log_every": 2,
        "validate_every": 5,
        "checkpoint_every": 4,
        "keep_checkpoints": 2,
        "seed": 3,
    }
    values.update(overrides)
    return TrainingSettings(**values)


def fresh_model(normalizer: str = "entmax_alpha") -> Transformer:
    """The shared tiny model, one layer a side, as training starts it: random α, training mode."""
    return tiny_model(normalizer, enc_layers=1, dec_layers=1, alpha_init=None, training=True)


class SimulatedInterruptError(Exception):
    pass


@pytest.mark.parametrize("normalizer", ["softmax", "entmax_alpha"])
def test_resume_after_interruption_continues_identically(normalizer: str, tmp_path: Path) -> None:
    straight = fresh_model(normalizer)
    history = train(straight, TRAIN, VALID, settings(), checkpoint_dir=tmp_path / "a", variant="v")

    def interrupt(step: int, metrics: dict) -> None:
        if step == 10:
            raise SimulatedInterruptError

    interrupted = fresh_model(normalizer)
    with pytest.raises(SimulatedInterruptError):
        train(
            interrupted,
            TRAIN,
            VALID,
            settings(),
            checkpoint_dir=tmp_path / "b",
            variant="v",
            on_log=interrupt,
        )
    resumed = fresh_model(normalizer)  # a new process: fresh weights, state from the checkpoint
    history_b = train(resumed, TRAIN, VALID, settings(), checkpoint_dir=tmp_path / "b", variant="v")

    for (name, a), b in zip(
        straight.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)

    # Steps 2..8 come from the checkpoint at step 8, steps 10 and 12 from the resumed run.
    assert [row["step"] for row in history_b.train] == [2, 4, 6, 8, 10, 12]
    assert history_b.train == history.train
    assert history_b.valid == history.valid
    if normalizer == "entmax_alpha":
        assert history_b.alphas == history.alphas
        assert [row["step"] for row in history.alphas] == [0, 2, 4, 6, 8, 10, 12]
        initial = {k: v.tolist() for k, v in fresh_model(normalizer).alphas().items()}
        first, last = history.alphas[0]["alphas"], history.alphas[-1]["alphas"]
        assert first == initial and first.keys() == last.keys() and first != last


def test_a_stopped_run_ends_like_a_finished_one_and_resumes_to_the_same_weights(
    tmp_path: Path,
) -> None:
    """``should_stop`` (a deadline) ends training at step 7 of 12: the run logs, validates and
    checkpoints there as at its end; the same settings resume it to the straight run's weights."""
    straight = fresh_model()
    train(straight, TRAIN, VALID, settings(), checkpoint_dir=tmp_path / "a", variant="v")
    stopped = fresh_model()
    history = train(
        stopped,
        TRAIN,
        VALID,
        settings(),
        checkpoint_dir=tmp_path / "b",
        variant="v",
        should_stop=lambda step: step >= 7,
    )
    assert [row["step"] for row in history.train] == [2, 4, 6, 7]
    assert [row["step"] for row in history.valid] == [5, 7]
    assert history.alphas[-1]["step"] == 7
    assert torch.load(tmp_path / "b" / "last.pt", weights_only=True)["step"] == 7
    resumed = fresh_model()
    train(resumed, TRAIN, VALID, settings(), checkpoint_dir=tmp_path / "b", variant="v")
    for (name, a), b in zip(
        straight.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_a_kill_between_a_checkpoint_s_two_files_loses_no_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint writes step<N>.pt and last.pt: killed between the two, the resumed run must
    end with the same saves (and so the same checkpoint average) as one never interrupted."""
    train(
        fresh_model("softmax"), TRAIN, VALID, settings(), checkpoint_dir=tmp_path / "a", variant="v"
    )
    real_save = training.save_atomic
    killed = []

    def die_at_step8(obj: object, path: Path) -> None:
        if not killed and path.name == "step8.pt":  # once, as the step-8 weights are written
            killed.append(path)
            raise SimulatedInterruptError
        real_save(obj, path)

    monkeypatch.setattr(training, "save_atomic", die_at_step8)
    run = {"checkpoint_dir": tmp_path / "b", "variant": "v"}
    with pytest.raises(SimulatedInterruptError):
        train(fresh_model("softmax"), TRAIN, VALID, settings(), **run)
    train(fresh_model("softmax"), TRAIN, VALID, settings(), **run)
    assert killed
    kept = sorted(p.name for p in (tmp_path / "a").glob("step*.pt"))
    assert (
        sorted(p.name for p in (tmp_path / "b").glob("step*.pt"))
        == kept
        == ["step12.pt", "step8.pt"]
    )
    for a, b in zip(
        load_weights(tmp_path / "a", 2).values(),
        load_weights(tmp_path / "b", 2).values(),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_history_checkpoints_and_averaging(tmp_path: Path) -> None:
    model = fresh_model("softmax")
    logged: list[tuple[int, dict]] = []
    history = train(
        model,
        TRAIN,
        VALID,
        settings(),
        checkpoint_dir=tmp_path,
        variant="v",
        on_log=lambda step, metrics: logged.append((step, metrics)),
    )
    assert [row["step"] for row in history.valid] == [5, 10, 12]
    assert history.valid[-1]["valid_nll"] == pytest.approx(validation_nll(model, VALID, 120))
    assert all(row["lr"] > 0 and "tokens_per_second" not in row for row in history.train)
    assert all(m["tokens_per_second"] > 0 for _, m in logged if "loss" in m)
    assert history.alphas == []
    assert {step for step, _ in logged} >= {2, 4, 12}
    assert sorted(p.name for p in tmp_path.glob("step*.pt")) == ["step12.pt", "step8.pt"]
    final = load_weights(tmp_path)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(final[name], value)
    averaged = load_weights(tmp_path, average_last=2)
    step8 = torch.load(tmp_path / "step8.pt")["model"]
    for name in final:
        if final[name].is_floating_point():
            torch.testing.assert_close(averaged[name], (final[name] + step8[name]) / 2)


def test_the_history_counts_the_target_tokens_trained(tmp_path: Path) -> None:
    """``target_tokens`` is the running count of non-pad target tokens (each target and its
    end-of-sentence token) of the batches trained so far, epochs in the loop's batch order."""
    history = train(
        fresh_model("softmax"), TRAIN, VALID, settings(), checkpoint_dir=tmp_path, variant="v"
    )
    per_batch = [
        sum(len(TRAIN[i][1]) + 1 for i in batch)
        for epoch in range(3)
        for batch in batches_of(TRAIN, 120, 3 * 100_003 + epoch)
    ]
    expected = {step: sum(per_batch[:step]) for step in (2, 4, 6, 8, 10, 12)}
    assert {row["step"]: row["target_tokens"] for row in history.train} == expected


def test_loss_decreases_on_the_copy_task(tmp_path: Path) -> None:
    history = train(
        fresh_model("sparsemax"),
        TRAIN,
        VALID,
        settings(max_steps=40, log_every=10),
        checkpoint_dir=tmp_path,
        variant="v",
    )
    assert history.train[-1]["loss"] < history.train[0]["loss"] - 0.3


def test_changed_settings_are_refused_on_resume(tmp_path: Path) -> None:
    train(
        fresh_model("softmax"),
        TRAIN,
        VALID,
        settings(max_steps=4),
        checkpoint_dir=tmp_path,
        variant="v",
    )
    with pytest.raises(LearnableSparsityError, match="peak_lr"):
        train(
            fresh_model("softmax"),
            TRAIN,
            VALID,
            settings(peak_lr=1e-2),
            checkpoint_dir=tmp_path,
            variant="v",
        )
    # max_steps may grow: training continues from step 4.
    history = train(
        fresh_model("softmax"),
        TRAIN,
        VALID,
        settings(max_steps=6),
        checkpoint_dir=tmp_path,
        variant="v",
    )
    assert history.train[-1]["step"] == 6


def test_the_linear_schedule_decays_to_max_steps_and_pins_it_on_resume(tmp_path: Path) -> None:
    linear = settings(max_steps=8, warmup=2, log_every=1, schedule="linear")
    history = train(
        fresh_model("softmax"), TRAIN, VALID, linear, checkpoint_dir=tmp_path, variant="v"
    )
    lrs = [row["lr"] for row in history.train]
    expected = [3e-3 * training.linear_schedule(step, 2, 8) for step in range(8)]
    assert lrs == pytest.approx(expected)
    # max_steps sets the decay of every step after warm-up: a longer run is another run.
    with pytest.raises(LearnableSparsityError, match="max_steps"):
        train(
            fresh_model("softmax"),
            TRAIN,
            VALID,
            settings(max_steps=10, warmup=2, log_every=1, schedule="linear"),
            checkpoint_dir=tmp_path,
            variant="v",
        )


def test_schedule_settings_name_the_key() -> None:
    assert settings().schedule == "inverse_sqrt"
    with pytest.raises(LearnableSparsityError, match=r"^schedule must be one of 'inverse_sqrt'"):
        settings(schedule="cosine")
    with pytest.raises(LearnableSparsityError, match=r"^warmup must not exceed max_steps 12"):
        settings(schedule="linear", warmup=13)
    assert settings(warmup=13).warmup == 13  # inverse_sqrt has no end to warm up before


def test_nan_loss_names_step_and_variant(tmp_path: Path) -> None:
    model = fresh_model("softmax")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    with pytest.raises(LearnableSparsityError, match=r"step 1 of variant 'smoke/softmax'"):
        train(model, TRAIN, VALID, settings(), checkpoint_dir=tmp_path, variant="smoke/softmax")


def test_bad_settings_name_the_key() -> None:
    with pytest.raises(LearnableSparsityError, match="max_tokens"):
        settings(max_tokens=0)
    with pytest.raises(LearnableSparsityError, match="peak_lr"):
        settings(peak_lr=0.0)
    with pytest.raises(LearnableSparsityError, match="needs examples"):
        train(fresh_model(), [], VALID, settings(), checkpoint_dir=Path("unused"), variant="v")


def test_identical_runs_write_identical_files(tmp_path: Path) -> None:
    """No wall-clock number in a checkpoint: DVC sees the same hashes for the same settings."""
    for run in ("a", "b"):
        train(
            fresh_model("entmax_alpha"),
            TRAIN,
            VALID,
            settings(),
            checkpoint_dir=tmp_path / run,
            variant="v",
        )
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


class KilledError(Exception):
    pass


def kill_at(step: int):
    """A hook that kills the run just before its checkpoint at ``step`` is written."""

    def before_checkpoint(at: int) -> None:
        if at == step:
            raise KilledError

    return before_checkpoint


def test_a_corrupt_last_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    straight = fresh_model("softmax")
    train(straight, TRAIN, VALID, settings(), checkpoint_dir=tmp_path / "a", variant="v")
    directory = tmp_path / "b"
    with pytest.raises(KilledError):  # killed after the checkpoint at step 8, before step 12's
        train(
            fresh_model("softmax"),
            TRAIN,
            VALID,
            settings(),
            checkpoint_dir=directory,
            variant="v",
            before_checkpoint=kill_at(12),
        )
    last = directory / "last.pt"
    last.write_bytes(last.read_bytes()[:100])  # a truncated file (full disk, copy cut short)
    resumed = fresh_model("softmax")
    history = train(resumed, TRAIN, VALID, settings(), checkpoint_dir=directory, variant="v")
    assert [row["step"] for row in history.train] == [2, 4, 6, 8, 10, 12]  # from step 4 again
    for (name, a), b in zip(
        straight.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert not (directory / "previous.pt").exists()  # a finished run keeps one full checkpoint


def test_unreadable_checkpoints_are_named(tmp_path: Path) -> None:
    with pytest.raises(KilledError):
        train(
            fresh_model("softmax"),
            TRAIN,
            VALID,
            settings(),
            checkpoint_dir=tmp_path,
            variant="v",
            before_checkpoint=kill_at(12),
        )
    for name in ("last.pt", "previous.pt"):
        (tmp_path / name).write_bytes(b"not a checkpoint")
    with pytest.raises(
        LearnableSparsityError,
        match=r"no readable checkpoint in .*last\.pt cannot be read.*previous\.pt cannot be read",
    ):
        train(
            fresh_model("softmax"), TRAIN, VALID, settings(), checkpoint_dir=tmp_path, variant="v"
        )
    with pytest.raises(LearnableSparsityError, match=r"checkpoint .*step8\.pt cannot be read"):
        (tmp_path / "step8.pt").write_bytes(b"garbage")
        load_weights(tmp_path, average_last=2)


def test_a_resumed_run_logs_the_same_averages_when_checkpoints_cut_a_log_window(
    tmp_path: Path,
) -> None:
    # Logged every 3 updates, checkpointed every 4: the checkpoint at step 8 falls inside the
    # window of steps 7-9, whose average the resumed run must still log whole.
    cut = settings(log_every=3, checkpoint_every=4)
    straight = train(
        fresh_model("softmax"), TRAIN, VALID, cut, checkpoint_dir=tmp_path / "a", variant="v"
    )
    with pytest.raises(KilledError):
        train(
            fresh_model("softmax"),
            TRAIN,
            VALID,
            cut,
            checkpoint_dir=tmp_path / "b",
            variant="v",
            before_checkpoint=kill_at(12),
        )
    resumed = train(
        fresh_model("softmax"), TRAIN, VALID, cut, checkpoint_dir=tmp_path / "b", variant="v"
    )
    assert [row["step"] for row in straight.train] == [3, 6, 9, 12]
    assert resumed.train == straight.train
    assert (tmp_path / "a" / "last.pt").read_bytes() == (tmp_path / "b" / "last.pt").read_bytes()


def test_accumulation_and_the_moving_average_resume_identically(tmp_path: Path) -> None:
    """With two batches per update and weight averaging, an interrupted run resumes as if it had
    never stopped; the saved step weights (what decoding reads) are the average, not the last
    parameters, and validation scores the average."""
    smoothing = settings(accumulate=2, average_decay=0.05)
    straight = fresh_model("softmax")
    history = train(straight, TRAIN, VALID, smoothing, checkpoint_dir=tmp_path / "a", variant="v")
    plain = train(
        fresh_model("softmax"), TRAIN, VALID, settings(), checkpoint_dir=tmp_path / "p", variant="v"
    )
    assert history.train != plain.train  # two batches per update: another run
    interrupted = fresh_model("softmax")
    with pytest.raises(KilledError):
        train(
            interrupted,
            TRAIN,
            VALID,
            smoothing,
            checkpoint_dir=tmp_path / "b",
            variant="v",
            before_checkpoint=kill_at(8),
        )
    resumed = fresh_model("softmax")
    history_b = train(resumed, TRAIN, VALID, smoothing, checkpoint_dir=tmp_path / "b", variant="v")
    assert history_b == history
    for (name, a), b in zip(
        straight.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    saved = load_weights(tmp_path / "a")
    kept = load_weights(tmp_path / "b")
    assert all(torch.equal(saved[name], kept[name]) for name in saved)
    step12 = torch.load(tmp_path / "a" / "step12.pt")["model"]
    assert all(torch.equal(saved[name], step12[name]) for name in saved)  # the final save
    assert any(not torch.equal(saved[name], value) for name, value in straight.state_dict().items())
    averaged = fresh_model("softmax")
    averaged.load_state_dict(saved)
    assert history.valid[-1]["valid_nll"] == pytest.approx(validation_nll(averaged, VALID, 120))
    assert history.valid[-1]["valid_nll"] != pytest.approx(validation_nll(straight, VALID, 120))


def test_a_non_finite_update_between_logs_names_its_step(tmp_path: Path, monkeypatch) -> None:
    """The loop reads its updates only at logs, validations and checkpoints: a NaN at step 3
    (weights made NaN before it) raises there, naming step 3, before the checkpoint of step 4
    keeps it."""
    real_update = training.update
    calls: list[int] = []

    def update(model, *args, **kwargs):
        calls.append(len(calls) + 1)
        if len(calls) == 3:
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.fill_(float("nan"))
        return real_update(model, *args, **kwargs)

    monkeypatch.setattr(training, "update", update)
    with pytest.raises(LearnableSparsityError, match=r"non-finite loss nan at step 3 of variant"):
        train(
            fresh_model("softmax"),
            TRAIN,
            VALID,
            settings(log_every=10, validate_every=10, checkpoint_every=4),
            checkpoint_dir=tmp_path,
            variant="v",
        )
    assert calls == [1, 2, 3, 4] and not list(tmp_path.glob("*.pt"))
