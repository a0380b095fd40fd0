"""Signalling game: every method trains, game sampling, success of a perfect pair."""

from __future__ import annotations

import pytest
import torch

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.lvm import signal_game
from learnable_sparsity.lvm.methods import METHODS, build_method

F, CONCEPTS, PER_CONCEPT, CANDIDATES, VOCAB = 8, 6, 10, 4, 8


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian features around one axis per concept."""
    generator = torch.Generator().manual_seed(7)
    concepts = torch.arange(CONCEPTS).repeat_interleave(PER_CONCEPT)
    features = (
        torch.randn(len(concepts), F, generator=generator) + 2 * torch.eye(CONCEPTS, F)[concepts]
    )
    return features, concepts


def _model() -> signal_game.SignalGame:
    torch.manual_seed(0)
    return signal_game.SignalGame(F, VOCAB, hidden=32, embedding=16)


def _step_fn(reward: str):
    features, concepts = _data()

    def step(model, method, step, generator):
        games = signal_game.sample_games(features, concepts, 32, CANDIDATES, generator)
        return signal_game.loss(
            model, method, games, step, entropy_coef=0.01, reward=reward, generator=generator
        )

    return step


@pytest.mark.parametrize(
    ("name", "reward"),
    [(name, "nll") for name in METHODS["categorical"]] + [("sfe", "zero_one")],
)
def test_every_method_decreases_the_loss(name, reward, train, decreases) -> None:
    method = build_method(
        name,
        "categorical",
        k=3 if name == "unordered_set" else None,
        nvil_features=F,
        nvil_hidden=32,
    )
    decreases(train(_model(), method, _step_fn(reward), n_steps=80))


def test_zero_one_reward_needs_a_score_function_method() -> None:
    features, concepts = _data()
    games = signal_game.sample_games(features, concepts, 4, CANDIDATES)
    with pytest.raises(LearnableSparsityError, match="'dense'"):
        signal_game.loss(
            _model(), build_method("dense", "categorical"), games, 0, reward="zero_one"
        )


def test_games_show_distinct_concepts_and_the_target() -> None:
    features, concepts = _data()
    games = signal_game.sample_games(
        features, concepts, 200, CANDIDATES, torch.Generator().manual_seed(0)
    )
    # Each feature row identifies its image, hence its concept.
    image = (games.candidates[..., None, :] == features).all(-1).float().argmax(-1)
    shown = concepts[image]
    assert all(len(set(row)) == CANDIDATES for row in shown.tolist())
    assert set(games.target.tolist()) == set(range(CANDIDATES))
    torch.testing.assert_close(
        games.sender_input, games.candidates[torch.arange(200), games.target]
    )
    with pytest.raises(LearnableSparsityError, match="n_candidates=7"):
        signal_game.sample_games(features, concepts, 1, 7)


def test_a_perfect_sender_and_receiver_always_succeed() -> None:
    """Features = one-hot concept; sender sends the concept; receiver matches it."""
    concepts = torch.arange(VOCAB).repeat(3)
    features = torch.eye(VOCAB)[concepts]
    model = signal_game.SignalGame(VOCAB, VOCAB, hidden=VOCAB, embedding=VOCAB)
    with torch.no_grad():
        for layer in (model.sender[0], model.sender[2], model.candidate_projection):
            layer.weight.copy_(torch.eye(VOCAB))
            layer.bias.zero_()
        model.symbol_embedding.weight.copy_(torch.eye(VOCAB))
    games = signal_game.sample_games(features, concepts, 100, 5, torch.Generator().manual_seed(0))
    assert signal_game.success(model, games) == 1.0


def test_receiver_one_hot_shortcut_equals_the_embedding_product() -> None:
    """Constant one-hot z take the column-selection path; z needing a gradient the full
    ⟨W_z z, W_v v + b⟩ product: both must give the receiver's logits."""
    torch.manual_seed(0)
    model = _model()
    candidates = torch.randn(3, CANDIDATES, F)
    example = torch.tensor([0, 2, 2, 1])
    z = torch.nn.functional.one_hot(torch.tensor([5, 0, 7, 5]), VOCAB).float()
    expected = torch.einsum(
        "nve,ne->nv", model.candidate_projection(candidates)[example], model.symbol_embedding(z)
    )
    scores = model.symbol_scores(candidates)
    shortcut = model.receiver_logits(scores, example, z)
    product = model.receiver_logits(scores, example, z.clone().requires_grad_())
    torch.testing.assert_close(shortcut, expected)
    torch.testing.assert_close(product, expected)
