"""Tests for ``learnable_sparsity.nmt.model``: config validation, masks, incremental decoding, α,
probs.

Every behavioural test runs for each of the five normalizers on tiny random models in eval mode.
"""

from __future__ import annotations

import pytest
import torch

from learnable_sparsity.core.attention import NORMALIZERS
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.model import DecoderCache
from learnable_sparsity.nmt.seq2seq import Seq2Seq

TOL = 1e-5


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"normalizer": "relu"}, "normalizer"),
        ({"d_model": 30, "n_heads": 4}, "d_model must be divisible by n_heads=4"),
        ({"n_heads": 0}, "n_heads"),
        ({"src_vocab": 0}, "src_vocab"),
        ({"dropout": 1.0}, "dropout"),
        ({"attention_dropout": -0.1}, "attention_dropout"),
        ({"alpha_init": 2.5}, "alpha_init"),
        ({"share_embeddings": True, "tgt_vocab": 25}, "share_embeddings"),
        ({"eos_id": 0}, "eos_id"),
        ({"bos_id": 40}, "bos_id"),
        ({"topk_k": 0}, "topk_k"),
    ],
)
def test_config_rejects_bad_values(make_config, overrides, named) -> None:
    with pytest.raises(LearnableSparsityError, match=named):
        make_config(**overrides)


def test_too_long_input_names_max_positions(make_model, make_tokens) -> None:
    model = make_model(max_positions=8)
    with pytest.raises(LearnableSparsityError, match="max_positions=8"):
        model.encode(make_tokens([9], seed=0))


# --------------------------------------------------------------------------- shapes and masks


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_logits_shape(make_model, make_tokens, normalizer) -> None:
    model = make_model(normalizer)
    src, tgt_in = make_tokens([5, 3, 7], seed=1), make_tokens([4, 6, 2], seed=2)
    assert model(src, tgt_in).shape == (3, 6, 20)


@pytest.mark.parametrize("pre_norm", [True, False])
@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_source_padding_does_not_change_real_positions(
    make_model, make_tokens, normalizer, pre_norm
) -> None:
    """Sentence 1 of a padded batch gives the same memory and logits as on its own."""
    model = make_model(normalizer, pre_norm=pre_norm)
    src, tgt_in = make_tokens([7, 4], seed=3), make_tokens([3, 5], seed=4)
    memory, src_mask = model.encode(src)
    logits, _ = model.decode(tgt_in, memory, src_mask)
    alone_memory, _ = model.encode(src[1:, :4])
    alone_logits = model(src[1:, :4], tgt_in[1:, :5])
    assert src_mask.tolist() == [[True] * 7, [True] * 4 + [False] * 3]
    assert torch.allclose(memory[1, :4], alone_memory[0], atol=TOL)
    assert torch.allclose(logits[1, :5], alone_logits[0], atol=TOL)


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_decoder_output_at_t_ignores_later_tokens(make_model, make_tokens, normalizer) -> None:
    model = make_model(normalizer)
    src, tgt_in = make_tokens([6, 6], seed=5), make_tokens([7, 7], seed=6)
    changed = tgt_in.clone()
    changed[:, 4:] = make_tokens([3, 3], seed=7)
    logits, changed_logits = model(src, tgt_in), model(src, changed)
    assert torch.allclose(logits[:, :4], changed_logits[:, :4], atol=TOL)
    assert not torch.allclose(logits[:, 4:], changed_logits[:, 4:], atol=TOL)


# --------------------------------------------------------------------------- incremental decoding


@pytest.mark.parametrize("pre_norm", [True, False])
@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_incremental_decoding_equals_full(make_model, make_tokens, normalizer, pre_norm) -> None:
    model = make_model(normalizer, pre_norm=pre_norm)
    src, tgt_in = make_tokens([6, 3, 5], seed=8), make_tokens([7, 7, 7], seed=9)
    memory, src_mask = model.encode(src)
    full, _ = model.decode(tgt_in, memory, src_mask)
    cache = None
    for t in range(tgt_in.shape[1]):
        step, cache = model.decode(tgt_in[:, t : t + 1], memory, src_mask, cache, use_cache=True)
        assert cache.length == t + 1
        assert torch.allclose(step[:, 0], full[:, t], atol=TOL), f"step {t}"


def test_cache_reorder_follows_the_batch(make_model, make_tokens) -> None:
    """Decoding after ``DecoderCache.reorder(perm)`` equals decoding the permuted batch."""
    model = make_model("entmax15")
    src, tgt_in = make_tokens([6, 3, 5], seed=10), make_tokens([4, 4, 4], seed=11)
    perm = torch.tensor([2, 2, 0])
    memory, src_mask = model.encode(src)
    _, cache = model.decode(tgt_in[:, :3], memory, src_mask, use_cache=True)
    assert isinstance(cache, DecoderCache)
    step, _ = model.decode(tgt_in[perm, 3:], memory[perm], src_mask[perm], cache.reorder(perm))
    full, _ = model.decode(tgt_in[perm], memory[perm], src_mask[perm])
    assert torch.allclose(step[:, 0], full[:, 3], atol=TOL)


# --------------------------------------------------------------------------- analysis hooks


def test_alphas_per_head_for_entmax_alpha_only(make_model) -> None:
    alphas = make_model("entmax_alpha").alphas()
    assert sorted(alphas) == sorted(
        f"{side}.layer{i}"
        for side in ("encoder.self", "decoder.self", "decoder.context")
        for i in range(2)
    )
    for alpha in alphas.values():
        assert torch.allclose(alpha, torch.tensor([1.2, 1.8]))
        assert not alpha.requires_grad
    assert make_model("softmax").alphas() == {}


def test_random_alpha_init_differs_per_head_and_block(make_model) -> None:
    """alpha_init=None: α = 1 + sigmoid(a), a ~ N(0, 1), seeded like the other weights."""
    alphas = make_model("entmax_alpha", seed=4, alpha_init=None).alphas()
    values = torch.cat(list(alphas.values()))
    assert values.unique().numel() == values.numel() == 12
    assert ((values > 1.01) & (values < 2)).all()
    again = make_model("entmax_alpha", seed=4, alpha_init=None).alphas()
    assert all(torch.equal(alphas[k], again[k]) for k in alphas)
    assert make_model("softmax", alpha_init=None).alphas() == {}


def test_random_alpha_init_is_asts_distribution_truncated_at_three_sigma(make_model) -> None:
    """a = logit(α − 1) ~ N(0, 1) truncated to ±3: no head starts near the lower bound."""
    a = torch.cat(
        [
            torch.logit(
                torch.cat(
                    list(make_model("entmax_alpha", seed=s, alpha_init=None).alphas().values())
                )
                - 1
            )
            for s in range(100)
        ]
    )
    assert a.abs().max() <= 3 + 1e-4
    assert abs(a.mean().item()) < 0.1  # 1200 draws: standard error 0.03
    assert a.std().item() == pytest.approx(0.9866, abs=0.06)  # the truncated normal's std


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_forward_returns_attention_of_every_block(make_model, make_tokens, normalizer) -> None:
    model = make_model(normalizer)
    src, tgt_in = make_tokens([6, 4], seed=12), make_tokens([5, 5], seed=13)
    attention: dict[str, torch.Tensor] = {}
    logits = model(src, tgt_in, attention)
    assert torch.equal(logits, model(src, tgt_in))
    assert sorted(attention) == sorted(model.attention_blocks())
    for key, probs in attention.items():
        keys = 5 if key.startswith("decoder.self") else 6
        assert probs.shape == (2, 2, 6 if key.startswith("encoder") else 5, keys), key
        assert torch.allclose(probs.sum(-1), torch.ones(()), atol=TOL), key
        if not key.startswith("decoder.self"):
            assert (probs[1, :, :, 4:] == 0).all(), key  # padded source keys
        else:
            assert (probs.triu(diagonal=1) == 0).all(), key  # causal
    if normalizer != "softmax":
        assert (attention["encoder.self.layer0"][0] == 0).any()  # sparse without padding


def test_shared_embeddings_tie_source_target_and_output(make_model, make_tokens) -> None:
    model = make_model(share_embeddings=True)
    assert model.tgt_embed is model.src_embed and model.output_proj is None
    untied = sum(p.numel() for p in make_model().parameters())
    assert untied - sum(p.numel() for p in model.parameters()) == 2 * 20 * 32
    model(make_tokens([3], seed=14), make_tokens([2], seed=15)).sum().backward()
    assert model.src_embed.weight.grad is not None


def test_the_transformer_is_a_seq2seq_model(make_model) -> None:
    """The training loop and beam search are typed with the Seq2Seq protocol."""
    assert isinstance(make_model(), Seq2Seq)
