"""Tests for ``learnable_sparsity.nmt.training`` (loss, schedule, train step, averaging) and
``learnable_sparsity.nmt.batching`` (collate, token batches)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
import torch.nn.functional as F

from learnable_sparsity.core.attention import NORMALIZERS
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.batching import Batch, collate, token_batches
from learnable_sparsity.nmt.training import (
    average_checkpoints,
    build_optimizer,
    label_smoothed_nll,
    noam_peak_lr,
    schedule_multiplier,
    train_step,
    update_average,
    with_average,
)
from learnable_sparsity.schedules import inverse_sqrt_schedule, linear_schedule

PAD, BOS, EOS = 0, 2, 3


# --------------------------------------------------------------------------- collate and loss


def test_collate_pads_and_shifts_targets() -> None:
    batch = collate([[5, 6, 7], [8]], [[9], [10, 11]], pad_id=PAD, bos_id=BOS, eos_id=EOS)
    assert batch.src.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.tgt_in.tolist() == [[2, 9, 0], [2, 10, 11]]
    assert batch.tgt_out.tolist() == [[9, 3, 0], [10, 11, 3]]


def test_label_smoothed_nll_by_hand() -> None:
    """V = 4, p = (0.1, 0.2, 0.3, 0.4), target 3, ε = 0.1; the second target is pad."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = torch.stack([p.log() + 7.0, torch.randn(4)])[None]  # softmax is shift-invariant
    target = torch.tensor([[3, PAD]])
    loss, nll, n_tokens = label_smoothed_nll(logits, target, 0.1, PAD)
    expected_nll = -math.log(0.4)
    expected = 0.9 * expected_nll + 0.1 / 3 * -(math.log(0.1) + math.log(0.2) + math.log(0.3))
    assert n_tokens == 1
    assert nll.item() == pytest.approx(expected_nll, abs=1e-6)
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_label_smoothed_nll_without_smoothing_is_cross_entropy() -> None:
    logits, target = torch.randn(3, 5, 7), torch.randint(0, 7, (3, 5))
    target[0, 3:] = PAD
    loss, nll, n_tokens = label_smoothed_nll(logits, target, 0.0, PAD)
    ref = F.cross_entropy(logits.view(-1, 7), target.view(-1), ignore_index=PAD, reduction="sum")
    assert n_tokens == int((target != PAD).sum())
    assert torch.allclose(loss, ref, atol=1e-5) and torch.allclose(nll, ref, atol=1e-5)


# --------------------------------------------------------------------------- schedule


def test_inverse_sqrt_schedule_closed_form() -> None:
    warmup = 4
    assert [inverse_sqrt_schedule(step, warmup) for step in (0, 1, 3)] == [0.25, 0.5, 1.0]
    assert inverse_sqrt_schedule(15, warmup) == pytest.approx(0.5)  # √(4 / 16)
    assert inverse_sqrt_schedule(99, warmup) == pytest.approx(0.2)  # √(4 / 100)
    # Vaswani et al.: lr(s) = d^-1/2 min(s^-1/2, s w^-3/2) = noam_peak_lr · multiplier.
    d, w = 512, 4000
    for s in (1, 100, 4000, 10_000):
        vaswani = d**-0.5 * min(s**-0.5, s * w**-1.5)
        assert noam_peak_lr(d, w) * inverse_sqrt_schedule(s - 1, w) == pytest.approx(vaswani)


def test_linear_schedule_warms_up_then_decays_to_a_last_positive_step() -> None:
    rates = [linear_schedule(step, warmup=4, steps=10) for step in range(10)]
    assert rates[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a > b for a, b in itertools.pairwise(rates[3:]))
    assert rates[-1] == pytest.approx(1 / 7)


def test_schedule_multiplier_picks_the_schedule_and_checks_its_arguments() -> None:
    inverse_sqrt = schedule_multiplier("inverse_sqrt", 4)
    linear = schedule_multiplier("linear", 4, max_steps=10)
    assert [inverse_sqrt(s) for s in range(20)] == [inverse_sqrt_schedule(s, 4) for s in range(20)]
    assert [linear(s) for s in range(10)] == [linear_schedule(s, 4, 10) for s in range(10)]
    with pytest.raises(LearnableSparsityError, match="max_steps"):
        schedule_multiplier("linear", 4)
    with pytest.raises(LearnableSparsityError, match="max_steps"):
        schedule_multiplier("linear", 11, max_steps=10)
    with pytest.raises(LearnableSparsityError, match="'cosine'"):
        schedule_multiplier("cosine", 4)  # type: ignore[arg-type]


def test_build_optimizer_with_the_linear_schedule(make_model) -> None:
    optimizer, scheduler = build_optimizer(
        make_model(), 1e-3, warmup=2, schedule="linear", max_steps=5
    )
    lrs = []
    for _ in range(5):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([5e-4, 1e-3, 0.75e-3, 0.5e-3, 0.25e-3])


def test_build_optimizer_follows_the_schedule_and_skips_decay_on_alpha(make_model) -> None:
    model = make_model("entmax_alpha")
    optimizer, scheduler = build_optimizer(model, 1e-3, warmup=4, weight_decay=0.01)
    assert optimizer.defaults["betas"] == (0.9, 0.98)
    alpha_group = optimizer.param_groups[-1]
    assert alpha_group["weight_decay"] == 0.0
    alpha_logits = {id(b.alpha_logit) for b in model.attention_blocks().values()}
    assert {id(p) for p in alpha_group["params"]} == alpha_logits
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [1e-3 * inverse_sqrt_schedule(s, 4) for s in range(6)]
    assert lrs == pytest.approx(expected)


# --------------------------------------------------------------------------- batching


def test_token_batches_respect_max_tokens_and_cover_every_index_once() -> None:
    rng = random.Random(0)
    src = [rng.randint(1, 30) for _ in range(200)] + [80]
    tgt = [max(1, n + rng.randint(-5, 5)) for n in src[:-1]] + [3]
    batches = token_batches(src, tgt, max_tokens=64, shuffle_seed=1)
    assert sorted(i for batch in batches for i in batch) == list(range(201))
    for batch in batches:
        padded = len(batch) * max(max(src[i], tgt[i]) for i in batch)
        assert padded <= 64 or len(batch) == 1
    assert [200] in batches  # the over-long sentence is alone
    assert batches == token_batches(src, tgt, max_tokens=64, shuffle_seed=1)
    assert batches != token_batches(src, tgt, max_tokens=64, shuffle_seed=2)
    unshuffled = token_batches(src, tgt, max_tokens=64)
    longest = [max(max(src[i], tgt[i]) for i in batch) for batch in unshuffled]
    assert longest == sorted(longest)


def test_token_batches_rejects_mismatched_lengths() -> None:
    with pytest.raises(LearnableSparsityError, match="lengths_tgt"):
        token_batches([1, 2], [1], max_tokens=10)


# --------------------------------------------------------------------------- train step


def _copy_batch(seed: int, n: int = 32) -> Batch:
    """Copy task: random sentences of 2-6 ids from 4..19, target = source."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 7, (n,), generator=g).tolist()
    sentences = [torch.randint(4, 20, (k,), generator=g).tolist() for k in lengths]
    return collate(sentences, sentences, pad_id=PAD, bos_id=BOS, eos_id=EOS)


def test_non_finite_loss_names_the_step(make_model) -> None:
    model = make_model()
    optimizer, scheduler = build_optimizer(model, 1e-3, warmup=4)
    with torch.no_grad():
        model.output_proj.weight[5, 0] = math.nan
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(LearnableSparsityError, match=r"step 17 of variant 'v1'"):
        train_step(model, _copy_batch(0), optimizer, scheduler, 1.0, 0.1, step=17, variant="v1")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) or k == "output_proj.weight" for k in before)


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_tiny_model_learns_to_copy(make_model, normalizer) -> None:
    """150 updates of a 1+1-layer model: per-token nll from ≈ ln 20 to < 0.6 (sparsemax is the
    slowest learner; softmax ends near 0.1)."""
    model = make_model(
        normalizer, seed=1, enc_layers=1, dec_layers=1, dropout=0.0, attention_dropout=0.0
    )
    optimizer, scheduler = build_optimizer(model, 1e-2, warmup=30)
    metrics = [
        train_step(model, _copy_batch(s), optimizer, scheduler, 1.0, 0.0, step=s, variant="v")
        for s in range(150)
    ]
    assert metrics[0]["nll"] > 2.0
    assert sum(m["nll"] for m in metrics[-10:]) / 10 < 0.6, metrics[-1]


def test_alpha_lr_scale_scales_only_the_alpha_logits(make_model) -> None:
    model = make_model("entmax_alpha")
    optimizer, scheduler = build_optimizer(model, 1e-3, warmup=4, alpha_lr_scale=10.0)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    *rest, alpha_group = optimizer.param_groups
    assert all(group["lr"] == pytest.approx(1e-3 * inverse_sqrt_schedule(3, 4)) for group in rest)
    assert alpha_group["lr"] == pytest.approx(1e-2 * inverse_sqrt_schedule(3, 4))
    # no α, no α group
    assert len(build_optimizer(make_model("softmax"), 1e-3, warmup=4)[0].param_groups) == 2


def test_alphas_move_with_training(make_model) -> None:
    model = make_model("entmax_alpha")
    before = model.alphas()
    optimizer, scheduler = build_optimizer(model, 1e-2, warmup=1)
    for step in range(3):
        train_step(model, _copy_batch(step), optimizer, scheduler, 1.0, 0.1, step=step, variant="v")
    after = model.alphas()
    assert after.keys() == before.keys()
    for key in before:
        assert after[key].shape == (2,)
        assert not torch.allclose(after[key], before[key]), key
        assert ((after[key] >= 1.01) & (after[key] <= 2.0)).all()


# --------------------------------------------------------------------------- checkpoint averaging


def test_average_checkpoints(make_model) -> None:
    a, b = make_model(seed=1).state_dict(), make_model(seed=2).state_dict()
    same = average_checkpoints([a, a, a])
    assert same.keys() == a.keys() and all(torch.equal(same[k], a[k]) for k in a)
    mean = average_checkpoints([a, b])
    assert all(torch.allclose(mean[k], (a[k] + b[k]) / 2) for k in a)


def test_average_checkpoints_rejects_mismatches() -> None:
    a = {"w": torch.ones(2), "n": torch.tensor(3)}
    with pytest.raises(LearnableSparsityError, match="'n'"):
        average_checkpoints([a, {"w": torch.ones(2), "n": torch.tensor(4)}])
    with pytest.raises(LearnableSparsityError, match="different keys"):
        average_checkpoints([a, {"w": torch.ones(2)}])
    assert average_checkpoints([a, a])["n"].item() == 3


@pytest.mark.parametrize("normalizer", ["softmax", "entmax_alpha"])
def test_accumulated_batches_make_the_update_of_their_union(make_model, normalizer) -> None:
    """Two batches accumulated (normalised by their tokens together) give the loss and gradient
    of one batch holding both: OpenNMT's accum_count. (Gradients, not Adam's updates: a gradient
    that is zero in exact arithmetic, e.g. a key bias under softmax, is rounding noise that Adam
    scales to a full step.)"""
    first, second = _copy_batch(0, 16), _copy_batch(1, 16)
    union = collate(
        [row[row != PAD][:-1].tolist() for b in (first, second) for row in b.tgt_out],
        [row[row != PAD][:-1].tolist() for b in (first, second) for row in b.tgt_out],
        pad_id=PAD,
        bos_id=BOS,
        eos_id=EOS,
    )
    updated = []
    for batch in ([first, second], union):
        model = make_model(normalizer, seed=2, dropout=0.0, attention_dropout=0.0)
        optimizer, scheduler = build_optimizer(model, 1e-3, warmup=4)
        metrics = train_step(model, batch, optimizer, scheduler, 0.0, 0.1, step=1, variant="v")
        updated.append((metrics, {name: p.grad for name, p in model.named_parameters()}))
    (accumulated, gradients), (single, gradients_union) = updated
    assert accumulated["tokens"] == single["tokens"]
    assert accumulated["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert accumulated["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
    for name, value in gradients.items():
        torch.testing.assert_close(value, gradients_union[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_moving_average_follows_opennmt(make_model) -> None:
    """First update: a copy; then (1 − w) avg + w θ with w = max(d, 1 − (s+1)/(s+10))."""
    model = make_model("softmax")
    average = update_average(None, model, 1, 1e-4)
    first = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert all(torch.equal(average[name], first[name]) for name in first)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    average = update_average(average, model, 2, 1e-4)  # w = 1 − 3/12 = 0.75
    for name, p in model.named_parameters():
        torch.testing.assert_close(average[name], 0.25 * first[name] + 0.75 * p.detach())
    late = update_average(average, model, 200_000, 0.5)  # w = max(0.5, 4.5e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(late[name], 0.5 * average[name] + 0.5 * p.detach())
    state = with_average(model.state_dict(), late)
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[name], late[name]) for name in late)
