r"""Signalling game (Lazaridou et al. 2017; sender sees only the target, as Havrylov & Titov).

A game is a set V of |V| candidate feature vectors, one of them the target y. The sender sees
v_y and emits a symbol z ∈ {1..|Z|} from π(z|v_y) = mapping(s), s = MLP(v_y) (features →
hidden → |Z|). The receiver embeds z (e = W_z z, so relaxed z work too), projects each candidate
(u_j = W_v v_j + b) and scores it by the dot product ⟨e, u_j⟩:

    p(y | V, z) = softmax_j ⟨e, u_j⟩,      ℓ(V, y, z) = −log p(y | V, z).

The training loss is E_π[ℓ] − λ H(π) (entropy bonus of weight λ). With ``reward="zero_one"``
(SFE-family methods only) the sender's learning signal is the 0/1 loss
[argmax_j p(j | V, z) ≠ y] while the receiver is still trained on −log p(y | V, z): ℓ is
replaced by ℓ_nll + sg[ℓ_01 − ℓ_nll], whose value is ℓ_01 and whose gradient is ℓ_nll's.

The experiment (:func:`setup`, settings :class:`SignalGameSettings`): each step plays a batch of
games drawn from the training images; the test metric is the communication success on a fixed
set of games drawn from the test images. The method names ``sfe_nll`` and ``sfe_zero_one`` run
SFE with either reward (the thesis reports both); every other method uses the nll reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from learnable_sparsity.data.signal_game import GameData, GameSplits
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.lvm import mlp
from learnable_sparsity.lvm.methods import (
    METHODS,
    Method,
    build_method,
    expectation_metrics,
    expected_loss,
)
from learnable_sparsity.lvm.settings import LvmCell, LvmSettings
from learnable_sparsity.lvm.training import Setup, evaluation_generator
from learnable_sparsity.settings import setting

REWARDS = ("nll", "zero_one")
# Method names of the game that fix the SFE reward: name -> (method, reward).
REWARD_METHODS = {"sfe_nll": ("sfe", "nll"), "sfe_zero_one": ("sfe", "zero_one")}


class Games(NamedTuple):
    """A batch of games: ``candidates`` [B, |V|, F] feature vectors, ``target`` [B] the index of
    the target among them."""

    candidates: Tensor
    target: Tensor

    @property
    def sender_input(self) -> Tensor:
        """The target's features v_y [B, F], all the sender sees."""
        return self.candidates[
            torch.arange(self.target.shape[0], device=self.target.device), self.target
        ]


def sample_games(
    features: Tensor,
    concepts: Tensor,
    n_games: int,
    n_candidates: int,
    generator: torch.Generator | None = None,
) -> Games:
    """``n_games`` games from ``features`` [N, F] with concept labels ``concepts`` [N].

    Each game: a uniformly drawn target image; |V| − 1 distinct concepts other than the target's,
    drawn uniformly, with one uniformly drawn image of each as distractors (so all |V|
    candidates show different concepts); the target at a uniform position among the |V| slots.
    """
    if features.dim() != 2 or concepts.shape != features.shape[:1]:
        raise LearnableSparsityError(
            f"need features [N, F] and concepts [N], got {tuple(features.shape)} and "
            f"{tuple(concepts.shape)}"
        )
    if n_games < 1 or n_candidates < 2:
        raise LearnableSparsityError(
            f"need n_games >= 1 and n_candidates >= 2, got {n_games} and {n_candidates}"
        )
    present, counts = concepts.unique(return_counts=True)
    if present.numel() < n_candidates:
        raise LearnableSparsityError(
            f"n_candidates={n_candidates} needs as many concepts, the images have {present.numel()}"
        )
    by_concept = concepts.argsort(stable=True)  # image ids grouped by concept, in `present` order
    first = counts.cumsum(0) - counts
    device = features.device  # the generator's too
    target_image = torch.randint(concepts.shape[0], (n_games,), generator=generator, device=device)
    target_concept = torch.searchsorted(present, concepts[target_image])
    # The top |V| − 1 of uniform keys is a uniform subset; the target's concept is keyed out.
    keys = torch.rand(n_games, present.numel(), generator=generator, device=device)
    keys = keys.scatter(1, target_concept[:, None], -1.0)
    other = keys.topk(n_candidates - 1, dim=1).indices
    within = torch.rand(other.shape, generator=generator, device=device) * counts[other]
    within = within.long().minimum(counts[other] - 1)
    images = torch.cat([target_image[:, None], by_concept[first[other] + within]], 1)
    # Move the target (column 0) to a uniform position by swapping it with that column.
    target = torch.randint(n_candidates, (n_games,), generator=generator, device=device)
    rows = torch.arange(n_games, device=device)
    front, at_target = images[rows, 0], images[rows, target]
    images[rows, 0], images[rows, target] = at_target, front
    return Games(features[images], target)


class SignalGame(nn.Module):
    """Sender MLP (features → ``hidden`` → ``vocab_size`` scores) and dot-product receiver
    (symbol and candidates embedded in R^``embedding``)."""

    def __init__(
        self, n_features: int, vocab_size: int = 256, hidden: int = 512, embedding: int = 256
    ) -> None:
        super().__init__()
        self.sender = mlp([n_features, hidden, vocab_size])
        self.symbol_embedding = nn.Linear(vocab_size, embedding, bias=False)
        self.candidate_projection = nn.Linear(n_features, embedding)

    def scores(self, games: Games) -> Tensor:
        """Sender scores s [B, |Z|] of π(z | v_y)."""
        return self.sender(games.sender_input)

    def symbol_scores(self, candidates: Tensor) -> Tensor:
        """R = U W_z: every candidate's receiver score for every symbol, [B, |V|, |Z|].

        The receiver's logit of candidate j for symbol z is ⟨W_z z, u_j⟩ with u_j = W_v v_j + b
        the projected candidate; the symbol embedding has no bias, so it equals (R z)_j. R is
        computed once per game, and a decoder call is then a cheap [|V|, |Z|]·z product (also for
        relaxed z).
        """
        return self.candidate_projection(candidates) @ self.symbol_embedding.weight

    def receiver_logits(self, symbol_scores: Tensor, example: Tensor, z: Tensor) -> Tensor:
        """Receiver logits [N, |V|] for N (game, symbol) pairs: ``symbol_scores`` [B, |V|, |Z|]
        from :meth:`symbol_scores`, ``example`` [N] indexes the game, z [N, |Z|].

        A one-hot z that needs no gradient (marginalization, score-function estimators) just
        selects a column, so a decoder call costs O(|V|) instead of O(|V| |Z|).
        """
        one_hot = not z.requires_grad and bool(
            ((z == 0) | (z == 1)).all() and (z.sum(-1) == 1).all()
        )
        if one_hot:
            return symbol_scores[example, :, z.argmax(-1)]
        return (symbol_scores[example] * z.unsqueeze(1)).sum(-1)


def loss(
    model: SignalGame,
    method: Method,
    games: Games,
    step: int,
    *,
    entropy_coef: float = 0.1,
    reward: str = "nll",
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, float]]:
    r"""Training loss mean_b (E_π[ℓ] − λ H(π)) for a batch of games, λ = ``entropy_coef``.

    ``reward``: "nll" (ℓ = −log p(y|V, z)) or "zero_one" (SFE-family methods; see module
    docstring). Metrics (batch means): ``loss`` (estimate of E_π[ℓ]; with zero_one the error
    rate of the sampled symbols), ``decoder_calls``, ``entropy`` (and ``support`` for sparsemax).
    """
    if reward not in REWARDS:
        raise LearnableSparsityError(f"unknown reward {reward!r}; choose one of {REWARDS}")
    if reward == "zero_one" and not method.score_function:
        raise LearnableSparsityError(
            f"reward 'zero_one' needs a score-function method (sfe, sfe_plus, nvil), got "
            f"{method.name!r}"
        )

    symbol_scores = model.symbol_scores(games.candidates)

    def receiver_loss(example: Tensor, z: Tensor) -> Tensor:
        logits = model.receiver_logits(symbol_scores, example, z)
        target = games.target[example]
        nll = nn.functional.cross_entropy(logits, target, reduction="none")
        if reward == "nll":
            return nll
        wrong = (logits.argmax(-1) != target).to(nll.dtype)
        return nll + (wrong - nll).detach()

    sender_input = games.sender_input
    expectation = expected_loss(
        method,
        model.sender(sender_input),
        receiver_loss,
        step,
        features=sender_input,
        generator=generator,
    )
    total = (expectation.estimate.surrogate - entropy_coef * expectation.entropy).mean()
    metrics = {"loss": float(expectation.estimate.loss.detach().mean())}
    return total, metrics | expectation_metrics(method, expectation)


@torch.no_grad()
def success(model: SignalGame, games: Games) -> float:
    """Communication success: the fraction of games where the receiver's argmax, given the
    sender's most probable symbol argmax_z π(z|v_y) (softmax or sparsemax alike), is y."""
    symbol = model.scores(games).argmax(-1)
    z = nn.functional.one_hot(symbol, model.symbol_embedding.in_features)
    games_index = torch.arange(games.target.shape[0], device=games.target.device)
    logits = model.receiver_logits(
        model.symbol_scores(games.candidates), games_index, z.to(games.candidates.dtype)
    )
    return float((logits.argmax(-1) == games.target).float().mean())


def method_and_reward(name: str) -> tuple[str, str]:
    """(method, reward) of a game method name: ``sfe_nll`` / ``sfe_zero_one`` are SFE with the
    nll / zero-one reward; any other name is that method with the nll reward."""
    return REWARD_METHODS.get(name, (name, "nll"))


@dataclass(frozen=True, kw_only=True)
class SignalGameSettings(LvmSettings):
    """Params ``lvm.signal_game``: the shared keys (:class:`LvmSettings`) and the game.

    ``candidates`` |V| per game; sender ``hidden`` width, ``vocab_size`` |Z|, receiver
    ``embedding`` width of :class:`SignalGame`; ``entropy_coef`` λ per method (``default`` for
    the others); ``test_games`` played for the communication success.
    """

    KNOWN_METHODS: ClassVar[tuple[str, ...]] = (*METHODS["categorical"], *REWARD_METHODS)
    HEADLINE: ClassVar[tuple[str, str]] = ("communication_success", "communication success")
    PER_METHOD: ClassVar[tuple[str, ...]] = ("lr", "entropy_coef")

    candidates: int = setting(at_least=2)
    vocab_size: int = setting(at_least=2)
    hidden: int = setting(at_least=1)
    embedding: int = setting(at_least=1)
    entropy_coef: dict[str, float] = setting(at_least=0)
    test_games: int = setting(at_least=1)


def setup(
    settings: SignalGameSettings, data: GameSplits, cell: LvmCell, generator: torch.Generator
) -> Setup:
    """The signalling game of ``cell``: training games from ``data.train``, test games from
    ``data.test``."""
    device = generator.device
    train, test = data.train.to(device), data.test.to(device)
    features = data.train.features.shape[1]
    model = SignalGame(
        features,
        vocab_size=settings.vocab_size,
        hidden=settings.hidden,
        embedding=settings.embedding,
    )
    name, reward = method_and_reward(cell.method)
    method = build_method(
        name, "categorical", gumbel_rate=settings.gumbel_rate, nvil_features=features
    )
    entropy_coef = settings.per_method("entropy_coef", cell.method)

    def games(split: GameData, n_games: int, draw: torch.Generator) -> Games:
        return sample_games(split.features, split.concepts, n_games, settings.candidates, draw)

    def step_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        return loss(
            model,
            method,
            games(train, settings.batch_size, generator),
            step,
            entropy_coef=entropy_coef,
            reward=reward,
            generator=generator,
        )

    def evaluate() -> dict[str, float]:
        drawn = games(test, settings.test_games, evaluation_generator(device))
        return {"communication_success": success(model, drawn)}

    return Setup(model, method, step_fn, evaluate)
