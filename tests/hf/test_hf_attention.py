"""Tests for ``learnable_sparsity.hf.attention``: the core normalizers inside a ``transformers``
BERT.

A tiny random ``BertModel`` (2 layers, hidden 32, 4 heads of 8, vocabulary 50) is built from a
config with ``attn_implementation=<name>``. Its ``initializer_range`` is 0.2 rather than BERT's
0.02: at 0.02 every attention score is ≈ 0, sparsemax rows are nearly uniform and there are no
zeros on real keys to check. The batch has 3 right-padded sequences of lengths 7, 4 and 2;
"topk" keeps k = 3 keys, "entmax_alpha" heads start at AST's random α (different per head).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from transformers import (
    AttentionInterface,
    BertConfig,
    BertLMHeadModel,
    BertModel,
    DynamicCache,
    EncoderDecoderCache,
    EncoderDecoderConfig,
    EncoderDecoderModel,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function

from learnable_sparsity.core.attention import ALPHA_MIN, alpha_of_logit
from learnable_sparsity.core.registry import NORMALIZERS
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.hf.attention import (
    add_head_alphas,
    additive_attention_mask,
    attention_function,
    attention_modules,
    head_alphas,
    query_heads,
    register,
    require_registered,
    sparse_attention_forward,
)

HIDDEN, HEADS, LAYERS, VOCAB = 32, 4, 2, 50
D_HEAD = HIDDEN // HEADS
LENGTHS = (7, 4, 2)
SEQ = max(LENGTHS)
K = 3
SPARSE = ("sparsemax", "entmax15", "entmax_alpha", "topk")
# fp32 agreement of two computations of the same attention that differ only in operation order.
TOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    register()


def _config(name: str, **overrides) -> BertConfig:
    settings = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": 64,
        "max_position_embeddings": 16,
        "initializer_range": 0.2,
        "topk_k": K,
        "attn_implementation": name,
    }
    return BertConfig(**{**settings, **overrides})


def _bert(name: str, seed: int = 0, **overrides) -> BertModel:
    torch.manual_seed(seed)
    model = BertModel(_config(name, **overrides)).eval()
    if name == "entmax_alpha":
        add_head_alphas(model, alpha_init=None, generator=torch.Generator().manual_seed(seed))
    return model


def _padding(lengths: tuple[int, ...], total: int) -> Tensor:
    """[len(lengths), total] boolean, True on the (left-aligned) real tokens."""
    return torch.arange(total) < torch.tensor(lengths)[:, None]


def _batch(seed: int = 0) -> tuple[Tensor, Tensor]:
    """Right-padded token ids (pad id 0) and the 0/1 attention mask."""
    real = _padding(LENGTHS, SEQ)
    ids = torch.randint(1, VOCAB, real.shape, generator=torch.Generator().manual_seed(seed))
    return ids.masked_fill(~real, 0), real.long()


def _capture(model: nn.Module) -> tuple[dict[str, tuple], list]:
    """Forward hooks recording (module, hidden_states, encoder_hidden_states, output) per module."""
    records: dict[str, tuple] = {}

    def hook(name: str):
        def record(module, args, kwargs, output) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            records[name] = (module, hidden, kwargs.get("encoder_hidden_states"), output)

        return record

    handles = [
        module.register_forward_hook(hook(name), with_kwargs=True)
        for name, module in attention_modules(model).items()
    ]
    return records, handles


def _core_attention(
    module: nn.Module, hidden: Tensor, memory: Tensor | None, visible: Tensor, normalizer: str
) -> tuple[Tensor, Tensor]:
    """The module's attention recomputed with the core normalizer: (output [B, q, D], probs)."""

    def split(x: Tensor) -> Tensor:
        return x.view(x.shape[0], x.shape[1], HEADS, D_HEAD).transpose(1, 2)

    source = hidden if memory is None else memory
    q, k, v = split(module.query(hidden)), split(module.key(source)), split(module.value(source))
    scores = q @ k.transpose(-2, -1) / math.sqrt(D_HEAD)
    fn = NORMALIZERS[normalizer].function
    if normalizer == "entmax_alpha":
        probs = fn(scores, alpha_of_logit(module.alpha_logit).view(1, -1, 1, 1), mask=visible)
    elif normalizer == "topk":
        probs = fn(scores, K, mask=visible)
    else:
        probs = fn(scores, mask=visible)
    return (probs @ v).transpose(1, 2).reshape(hidden.shape), probs


# --------------------------------------------------------------------------- registration


def test_register_is_idempotent_and_covers_every_core_normalizer() -> None:
    register()
    register()
    for name in NORMALIZERS:
        assert AttentionInterface()[name] is attention_function(name)
        # Without a mask function of its own a name gets no mask at all (padding ignored).
        assert AttentionMaskInterface()[name] is additive_attention_mask


def test_the_mask_function_keeps_a_plain_causal_mask() -> None:
    """transformers' "sdpa" mask is None for a causal mask without padding (SDPA's is_causal
    flag does the work); ours must be the causal mask itself."""
    mask = additive_attention_mask(
        batch_size=2,
        q_length=4,
        kv_length=4,
        mask_function=causal_mask_function,
        attention_mask=None,
        allow_is_causal_skip=True,
        device="cpu",
    )
    assert mask is not None and mask.dtype == torch.float32
    visible = torch.ones(4, 4, dtype=torch.bool).tril().expand(2, 1, 4, 4)
    assert torch.equal(mask, torch.zeros(()).masked_fill(~visible, torch.finfo(torch.float32).min))


def test_register_refuses_to_replace_a_foreign_function(monkeypatch) -> None:
    def foreign(*args, **kwargs):
        raise AssertionError("never called")

    monkeypatch.setitem(AttentionInterface._global_mapping, "topk", foreign)
    with pytest.raises(LearnableSparsityError, match="not this module's"):
        register()


# --------------------------------------------------------------------------- encoder


def _assert_same_outputs(model: nn.Module, reference: nn.Module, ids: Tensor, mask: Tensor) -> None:
    """Same hidden states and attention probabilities (within TOL) on the same batch."""
    got = model(ids, attention_mask=mask, output_attentions=True)
    expected = reference(ids, attention_mask=mask, output_attentions=True)
    assert torch.allclose(got.last_hidden_state, expected.last_hidden_state, rtol=0, atol=TOL)
    for p, p_ref in zip(got.attentions, expected.attentions, strict=True):
        assert torch.allclose(p, p_ref, rtol=0, atol=TOL)


def test_core_softmax_matches_transformers_eager_attention_with_padding() -> None:
    eager = _bert("eager")
    ours = _bert("softmax")
    ours.load_state_dict(eager.state_dict())
    ids, mask = _batch()
    _assert_same_outputs(ours, eager, ids, mask)


@pytest.mark.parametrize("normalizer", SPARSE)
def test_bert_attention_equals_the_core_computed_directly(normalizer: str) -> None:
    model = _bert(normalizer)
    ids, mask = _batch()
    records, handles = _capture(model)
    model(ids, attention_mask=mask)
    for handle in handles:
        handle.remove()
    assert len(records) == LAYERS
    visible = mask.bool()[:, None, None, :]
    for module, hidden, _, (output, probs) in records.values():
        expected_output, expected_probs = _core_attention(module, hidden, None, visible, normalizer)
        assert torch.allclose(probs, expected_probs, rtol=0, atol=TOL)
        assert torch.allclose(output, expected_output, rtol=0, atol=TOL)


@pytest.mark.parametrize("normalizer", SPARSE)
def test_rows_sum_to_one_with_exact_zeros_on_padded_keys(normalizer: str) -> None:
    ids, mask = _batch()
    attentions = _bert(normalizer)(ids, attention_mask=mask, output_attentions=True).attentions
    padded = ~mask.bool()[:, None, None, :].expand(-1, HEADS, SEQ, -1)
    for probs in attentions:
        assert torch.allclose(probs.sum(-1), torch.ones(()), rtol=0, atol=1e-6)
        assert torch.all(probs[padded] == 0)


@pytest.mark.parametrize("normalizer", ["sparsemax", "entmax15"])
def test_sparse_normalizers_zero_out_some_real_keys(normalizer: str) -> None:
    ids, mask = _batch()
    attentions = _bert(normalizer)(ids, attention_mask=mask, output_attentions=True).attentions
    real = mask.bool()[:, None, None, :].expand(-1, HEADS, SEQ, -1)
    for probs in attentions:
        assert int((probs[real] == 0).sum()) > 0


@pytest.mark.parametrize("normalizer", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("masked_value", ["finfo_min", "-inf"])
def test_additive_float_masks_act_as_boolean_masks(normalizer: str, masked_value: str) -> None:
    """A ready 4D additive mask (eager style) reaches the function as is; its masking value
    must not leak into the thresholds: same result as the boolean mask, exact zeros."""
    model = _bert(normalizer)
    ids, mask = _batch()
    expected = model(ids, attention_mask=mask, output_attentions=True)
    visible = mask.bool()[:, None, None, :].expand(-1, 1, SEQ, -1)
    fill = torch.finfo(torch.float32).min if masked_value == "finfo_min" else float("-inf")
    additive = torch.zeros(visible.shape).masked_fill(~visible, fill)
    got = model(ids, attention_mask=additive, output_attentions=True)
    assert torch.allclose(got.last_hidden_state, expected.last_hidden_state, rtol=0, atol=TOL)
    for p, p_bool in zip(got.attentions, expected.attentions, strict=True):
        assert torch.equal(p, p_bool)
        assert torch.all(p[~visible.expand_as(p)] == 0)


# --------------------------------------------------------------------------- α-entmax


def test_alpha_per_head_is_a_parameter_that_gets_a_gradient() -> None:
    model = _bert("entmax_alpha").train()  # dropout on: the α path must survive it
    names = {f"encoder.layer.{i}.attention.self.alpha_logit" for i in range(LAYERS)}
    parameters = dict(model.named_parameters())
    assert names <= set(parameters)
    alphas = head_alphas(model)
    assert all(a.shape == (HEADS,) and len(set(a.tolist())) == HEADS for a in alphas.values())
    ids, mask = _batch()
    target = torch.randn(len(LENGTHS), SEQ, HIDDEN, generator=torch.Generator().manual_seed(1))
    (model(ids, attention_mask=mask).last_hidden_state * target).sum().backward()
    for name in names:
        grad = parameters[name].grad
        assert grad is not None and torch.isfinite(grad).all() and torch.all(grad != 0), name


def test_fixed_alpha_init_and_refusals() -> None:
    model = BertModel(_config("entmax_alpha")).eval()
    add_head_alphas(model, alpha_init=1.2)
    for alpha in head_alphas(model).values():
        assert torch.allclose(alpha, torch.full((HEADS,), 1.2), rtol=0, atol=1e-6)
    with pytest.raises(LearnableSparsityError, match="already has an alpha_logit"):
        add_head_alphas(model)
    with pytest.raises(LearnableSparsityError, match="alpha_init"):
        add_head_alphas(BertModel(_config("entmax_alpha")), alpha_init=2.5)
    # An α on a model whose attention reads none would never get a gradient.
    for other in ("sparsemax", "eager", "sdpa"):
        with pytest.raises(LearnableSparsityError, match=f"runs attention '{other}'"):
            add_head_alphas(BertModel(_config(other)))
    without = _bert("entmax_alpha")
    for module in attention_modules(without).values():
        del module.alpha_logit
    with pytest.raises(LearnableSparsityError, match="add_head_alphas"):
        without(*_batch())


def test_alpha_two_is_sparsemax() -> None:
    """α = 2 (w = 40: sigmoid rounds to 1 in fp32) through the general α solver equals the
    exact sparsemax; the solver stops at |Σp − 1| ≤ 4·eps·bit_length(7) ≈ 1.4e-6, so TOL."""
    model = _bert("entmax_alpha")
    with torch.no_grad():
        for module in attention_modules(model).values():
            module.alpha_logit.fill_(40.0)
    assert all(torch.all(a == 2.0) for a in head_alphas(model).values())
    sparse = _bert("sparsemax")
    sparse.load_state_dict(model.state_dict(), strict=False)
    ids, mask = _batch()
    _assert_same_outputs(model, sparse, ids, mask)


def test_alpha_near_one_is_softmax_to_first_order() -> None:
    r"""At α = 1 + β (β = 0.01, the smallest α of the parameterisation) entmax is softmax q up
    to first order in β: p_i = (1 + β(s_i − c))^{1/β} = q_i (1 − β(u_i − E_q u) + O(β²)) with
    u_i = (s_i − lse s)²/2, so ‖p − q‖₁ ≤ β E_q|u − E_q u| ≤ 2β E_q u = β E_q (s − lse s)²;
    the tolerance doubles it for the O(β²) rest. Checked per row on each layer's own scores."""
    model = _bert("entmax_alpha")
    with torch.no_grad():
        for module in attention_modules(model).values():
            module.alpha_logit.fill_(-40.0)  # sigmoid rounds to 0: α = ALPHA_MIN
    beta = ALPHA_MIN - 1
    ids, mask = _batch()
    records, handles = _capture(model)
    with torch.no_grad():
        model(ids, attention_mask=mask)
        for handle in handles:
            handle.remove()
        visible = mask.bool()[:, None, None, :]
        for module, hidden, _, (_, probs) in records.values():
            _, softmax = _core_attention(module, hidden, None, visible, "softmax")
            q, k = module.query(hidden), module.key(hidden)
            q = q.view(*q.shape[:2], HEADS, D_HEAD).transpose(1, 2)
            k = k.view(*k.shape[:2], HEADS, D_HEAD).transpose(1, 2)
            scores = (q @ k.transpose(-2, -1) / math.sqrt(D_HEAD)).masked_fill(~visible, -math.inf)
            centred = (scores - scores.logsumexp(-1, keepdim=True)).masked_fill(~visible, 0)
            bound = 2 * beta * (softmax * centred**2).sum(-1)
            distance = (probs - softmax).abs().sum(-1)
            assert torch.all(distance <= bound + 1e-6)
            assert float(distance.max()) > 0  # not softmax itself
            assert float(bound.max()) < 0.2  # and the bound says something


# --------------------------------------------------------------------------- top-k


def test_topk_keeps_at_most_k_keys_per_row() -> None:
    model = _bert("topk")
    model.encoder.layer[1].attention.self.topk_k = 2  # a module attribute overrides the config
    ids, mask = _batch()
    attentions = model(ids, attention_mask=mask, output_attentions=True).attentions
    visible_keys = torch.tensor(LENGTHS)[:, None, None].expand(-1, HEADS, SEQ)
    for probs, k in zip(attentions, (K, 2), strict=True):
        assert torch.equal((probs != 0).sum(-1), visible_keys.clamp(max=k))  # no ties here
    with pytest.raises(LearnableSparsityError, match="topk_k"):
        _bert("topk", topk_k=None)(ids, attention_mask=mask)


# --------------------------------------------------------------------------- decoder


@pytest.mark.parametrize("normalizer", ["sparsemax", "entmax_alpha"])
def test_decoder_self_attention_is_causal_and_cross_attention_padded(normalizer: str) -> None:
    model = _bert(normalizer, is_decoder=True, add_cross_attention=True)
    assert len(attention_modules(model)) == 2 * LAYERS  # self- and cross-attention per layer
    ids, mask = _batch()
    memory_lengths = (6, 3, 5)
    memory = torch.randn(3, 6, HIDDEN, generator=torch.Generator().manual_seed(2))
    memory_mask = _padding(memory_lengths, 6)
    out = model(
        ids,
        attention_mask=mask,
        encoder_hidden_states=memory,
        encoder_attention_mask=memory_mask.long(),
        output_attentions=True,
    )
    future = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    hidden = ~mask.bool()[:, None, None, :] | future
    for probs in out.attentions:
        assert torch.all(probs[hidden.expand_as(probs)] == 0)
        assert torch.allclose(probs.sum(-1), torch.ones(()), rtol=0, atol=1e-6)
    padded_memory = ~memory_mask[:, None, None, :]
    for probs in out.cross_attentions:
        assert probs.shape == (3, HEADS, SEQ, 6)
        assert torch.all(probs[padded_memory.expand_as(probs)] == 0)
        assert torch.allclose(probs.sum(-1), torch.ones(()), rtol=0, atol=1e-6)

    # No padding at all: transformers' "sdpa" mask would be None here (is_causal=True in SDPA).
    full = model(ids, encoder_hidden_states=memory, output_attentions=True)
    for probs in full.attentions:
        assert torch.all(probs[future.expand_as(probs)] == 0)
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] % (VOCAB - 1)) + 1
    later = model(changed, encoder_hidden_states=memory).last_hidden_state
    past = full.last_hidden_state[:, :-1]
    assert torch.allclose(later[:, :-1], past, rtol=0, atol=1e-6)
    assert not torch.allclose(later[:, -1], full.last_hidden_state[:, -1])


def test_cached_incremental_decoding_matches_the_full_forward() -> None:
    """One token at a time with a cache: the mask then has q = 1 and a key offset."""
    model = BertLMHeadModel(_config("entmax15", is_decoder=True, add_cross_attention=True)).eval()
    ids, _ = _batch()
    memory = torch.randn(3, 6, HIDDEN, generator=torch.Generator().manual_seed(2))
    memory_mask = _padding((6, 3, 5), 6).long()
    with torch.no_grad():
        full = model(ids, encoder_hidden_states=memory, encoder_attention_mask=memory_mask)
        cache, steps = EncoderDecoderCache(DynamicCache(), DynamicCache()), []
        for t in range(SEQ):
            step = model(
                ids[:, t : t + 1],
                encoder_hidden_states=memory,
                encoder_attention_mask=memory_mask,
                past_key_values=cache,
                use_cache=True,
            )
            cache = step.past_key_values
            steps.append(step.logits)
    assert torch.allclose(torch.cat(steps, dim=1), full.logits, rtol=0, atol=TOL)


def test_encoder_decoder_model_keeps_the_name_only_when_its_config_carries_it() -> None:
    """The APE shape (BERT encoder, BERT decoder with cross-attention): EncoderDecoderModel
    resets its sub-configs' attention to the default unless the joint config names it."""
    encoder = _config("sparsemax")
    decoder = _config("sparsemax", is_decoder=True, add_cross_attention=True)
    reset = EncoderDecoderModel(
        config=EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    )
    assert reset.decoder.config._attn_implementation != "sparsemax"
    config = EncoderDecoderConfig.from_encoder_decoder_configs(
        encoder, decoder, attn_implementation="sparsemax"
    )
    config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = 1, 0, 2
    torch.manual_seed(0)
    model = EncoderDecoderModel(config=config).eval()
    assert model.encoder.config._attn_implementation == "sparsemax"
    assert model.decoder.config._attn_implementation == "sparsemax"
    ids, mask = _batch()
    out = model(
        input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :3], output_attentions=True
    )
    for probs in out.cross_attentions:
        assert torch.all(probs[~mask.bool()[:, None, None, :].expand_as(probs)] == 0)
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=3, num_beams=2)
    assert generated.shape[0] == len(LENGTHS)


# --------------------------------------------------------------------------- model families


KV_HEADS = 2  # Llama's grouped-query attention: two query heads share each key/value head


def _llama(name: str, seed: int = 0) -> LlamaForCausalLM:
    """A tiny Llama whose attention modules keep their head count in the config only."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=16,
        initializer_range=0.2,
        topk_k=K,
        attn_implementation=name,
    )
    return LlamaForCausalLM(config).eval()


def _encoder_decoder(name: str, seed: int = 0) -> EncoderDecoderModel:
    config = EncoderDecoderConfig.from_encoder_decoder_configs(
        _config(name),
        _config(name, is_decoder=True, add_cross_attention=True),
        attn_implementation=name,
    )
    config.decoder_start_token_id, config.pad_token_id = 1, 0
    torch.manual_seed(seed)
    return EncoderDecoderModel(config=config).eval()


def _family_loss(family: str, model: nn.Module) -> Tensor:
    ids, mask = _batch()
    if family == "bert":
        return model(ids, attention_mask=mask).last_hidden_state.square().sum()
    if family == "encoder-decoder":
        out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :4])
        return out.logits.logsumexp(-1).sum()
    return model(ids, attention_mask=mask).logits.logsumexp(-1).sum()


FAMILIES = {
    # family: (model builder, attention modules it has: self-attention per layer, and in the
    # decoder of the encoder-decoder also cross-attention)
    "bert": (lambda name: BertModel(_config(name)).eval(), LAYERS),
    "encoder-decoder": (_encoder_decoder, LAYERS + 2 * LAYERS),
    "llama": (_llama, LAYERS),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_gets_one_learned_alpha_per_query_head_that_trains(family: str) -> None:
    """BERT (heads on the module), BERT2BERT (encoder, decoder and cross-attention) and Llama
    with grouped-query attention (heads in the config only): add_head_alphas finds every
    attention module, gives it one α per query head, and each α gets a gradient."""
    build, count = FAMILIES[family]
    model = build("entmax_alpha")
    added = add_head_alphas(model, alpha_init=1.5)
    assert len(added) == count, sorted(added)
    assert all(p.shape == (HEADS,) for p in added.values())
    assert {query_heads(m) for m in attention_modules(model).values()} == {HEADS}
    _family_loss(family, model).backward()
    for name, parameter in added.items():
        grad = parameter.grad
        assert grad is not None and torch.isfinite(grad).all() and torch.all(grad != 0), name


def test_grouped_query_softmax_equals_transformers_eager_llama() -> None:
    """The key/value heads shared across query groups, checked against transformers' own eager
    attention (its repeat_kv) on the same Llama weights: logits agree to fp32 rounding."""
    ours, eager = _llama("softmax"), _llama("eager")
    eager.load_state_dict(ours.state_dict())
    ids, mask = _batch()
    with torch.no_grad():
        expected = eager(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    visible = mask.bool()  # padded positions' outputs are not compared
    assert torch.allclose(got[visible], expected[visible], rtol=0, atol=TOL)


def test_llama_sparse_attention_is_causal_with_exact_zeros() -> None:
    model = _llama("sparsemax")
    ids, mask = _batch()
    with torch.no_grad():
        attentions = model(ids, attention_mask=mask, output_attentions=True).attentions
    future = ~torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    for probs in attentions:
        assert probs.shape == (len(LENGTHS), HEADS, SEQ, SEQ)
        assert torch.all(probs[..., future] == 0)
        assert torch.all(probs[~mask.bool()[:, None, None, :].expand_as(probs)] == 0)
        real = mask.bool()[:, None, :, None].expand_as(probs)[..., 0]
        assert torch.allclose(probs.sum(-1)[real], torch.ones(()), atol=1e-6)


def test_an_unregistered_name_says_to_call_register(monkeypatch: pytest.MonkeyPatch) -> None:
    require_registered("sparsemax")
    monkeypatch.setitem(AttentionInterface._global_mapping, "sparsemax", lambda *a, **k: None)
    with pytest.raises(LearnableSparsityError, match=r"call .*register\(\)"):
        require_registered("sparsemax")
    with pytest.raises(LearnableSparsityError, match="not one of learnable_sparsity's"):
        require_registered("flash_attention_2")


def test_add_head_alphas_names_what_it_looks_for() -> None:
    with pytest.raises(LearnableSparsityError, match="num_attention_heads, num_heads or config"):
        add_head_alphas(nn.Sequential(nn.Linear(2, 2)))


# --------------------------------------------------------------------------- direct calls


def _qkv(heads_kv: int = HEADS, seed: int = 3) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = 2 * torch.randn(2, HEADS, 5, D_HEAD, generator=g)
    k = 2 * torch.randn(2, heads_kv, 5, D_HEAD, generator=g)
    v = torch.randn(2, heads_kv, 5, D_HEAD, generator=g)
    return q, k, v


def _stub(is_causal: bool = False) -> nn.Module:
    module = nn.Module().eval()
    module.is_causal = is_causal
    return module


def test_output_layout_and_grouped_query_heads() -> None:
    q, k, v = _qkv(heads_kv=2)
    output, probs = sparse_attention_forward(_stub(), q, k, v, None, normalizer="sparsemax")
    assert output.shape == (2, 5, HEADS, D_HEAD) and probs.shape == (2, HEADS, 5, 5)
    k_full, v_full = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    expected = NORMALIZERS["sparsemax"](q @ k_full.transpose(-2, -1) / math.sqrt(D_HEAD))
    assert torch.allclose(probs, expected, rtol=0, atol=TOL)
    assert torch.allclose(output, (expected @ v_full).transpose(1, 2), rtol=0, atol=TOL)


def test_without_a_mask_causality_follows_the_module_or_the_keyword() -> None:
    q, k, v = _qkv()
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    _, causal = sparse_attention_forward(_stub(True), q, k, v, None, normalizer="entmax15")
    assert torch.all(causal[..., future] == 0)
    _, free = sparse_attention_forward(_stub(False), q, k, v, None, normalizer="entmax15")
    _, overridden = sparse_attention_forward(
        _stub(True), q, k, v, None, normalizer="entmax15", is_causal=False
    )
    assert torch.equal(free, overridden) and bool((free[..., future] != 0).any())


def test_additive_mask_bias_is_added_and_fully_masked_rows_are_zero() -> None:
    q, k, v = _qkv()
    bias = torch.randn(2, 1, 5, 5, generator=torch.Generator().manual_seed(4))
    bias[0, 0, :, 3:] = torch.finfo(torch.float32).min
    bias[1, 0, 2, :] = torch.finfo(torch.float32).min  # a query that may see no key at all
    _, probs = sparse_attention_forward(_stub(), q, k, v, bias, normalizer="sparsemax")
    visible = bias > torch.finfo(torch.float32).min
    scores = q @ k.transpose(-2, -1) / math.sqrt(D_HEAD) + bias.masked_fill(~visible, 0)
    expected = NORMALIZERS["sparsemax"](scores, mask=visible)
    assert torch.allclose(probs, expected, rtol=0, atol=TOL)
    assert torch.all(probs[0, :, :, 3:] == 0)
    assert torch.all(probs[1, :, 2] == 0)  # an all-zero row, as the core gives for no key


def test_dropout_on_the_probabilities_in_training_only() -> None:
    q, k, v = _qkv()
    module = _stub().train()
    module.topk_k = 2
    torch.manual_seed(5)
    output, probs = sparse_attention_forward(module, q, k, v, None, 0.5, 0.5, normalizer="topk")
    torch.manual_seed(5)
    expected = (F.dropout(probs, p=0.5, training=True) @ v).transpose(1, 2)
    assert torch.allclose(output, expected, rtol=0, atol=TOL)
    assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-6)  # returned before dropout
    evaluated, _ = sparse_attention_forward(
        module.eval(), q, k, v, None, 0.5, 0.5, normalizer="topk"
    )
    assert torch.allclose(evaluated, (probs @ v).transpose(1, 2), rtol=0, atol=TOL)


# --------------------------------------------------------------------------- model score terms


def test_softcap_and_position_bias_enter_the_scores_before_the_normalizer() -> None:
    q, k, v = _qkv()
    bias = torch.randn(1, HEADS, 5, 5, generator=torch.Generator().manual_seed(6))
    _, probs = sparse_attention_forward(
        _stub(), q, k, v, None, softcap=0.5, position_bias=bias, normalizer="sparsemax"
    )
    scores = 0.5 * torch.tanh(q @ k.transpose(-2, -1) / math.sqrt(D_HEAD) / 0.5) + bias
    assert torch.allclose(probs, NORMALIZERS["sparsemax"](scores), rtol=0, atol=TOL)


@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax"])
def test_a_sink_is_an_always_visible_key_column_without_value(normalizer: str) -> None:
    q, k, v = _qkv()
    sinks = torch.tensor([-1.0, 0.0, 1.0, 3.0])
    padding = _padding((5, 3), 5)[:, None, None, :]
    output, probs = sparse_attention_forward(
        _stub(), q, k, v, padding, s_aux=sinks, normalizer=normalizer
    )
    scores = q @ k.transpose(-2, -1) / math.sqrt(D_HEAD)
    column = sinks.view(1, HEADS, 1, 1).expand(2, HEADS, 5, 1)
    visible = torch.cat([padding.expand(2, HEADS, 5, 5), torch.ones_like(column, dtype=bool)], -1)
    full = NORMALIZERS[normalizer](torch.cat([scores, column], -1), mask=visible)
    assert torch.allclose(probs, full[..., :5], rtol=0, atol=TOL)
    assert torch.allclose(output, (full[..., :5] @ v).transpose(1, 2), rtol=0, atol=TOL)
    assert bool((probs.sum(-1) < 1 - 1e-3).any())  # the sink took mass
    with pytest.raises(LearnableSparsityError, match="one sink logit per query head"):
        sparse_attention_forward(_stub(), q, k, v, None, s_aux=sinks[:2], normalizer=normalizer)


def test_an_argument_eager_attention_would_use_is_refused_by_name() -> None:
    q, k, v = _qkv()
    with pytest.raises(LearnableSparsityError, match="indices"):
        sparse_attention_forward(
            _stub(), q, k, v, None, indices=torch.zeros(1), normalizer="softmax"
        )
    # None values and the arguments only other kernels read pass.
    sparse_attention_forward(
        _stub(), q, k, v, None, indices=None, cu_seq_lens_q=torch.zeros(1), normalizer="softmax"
    )
    with pytest.raises(LearnableSparsityError, match="sliding_window=2"):
        sparse_attention_forward(_stub(), q, k, v, None, sliding_window=2, normalizer="softmax")


def test_importing_the_package_registers_the_names() -> None:
    """A fresh process that only imports ``learnable_sparsity.hf`` builds a model by name."""
    code = (
        "import learnable_sparsity.hf\n"
        "from transformers import BertConfig, BertModel\n"
        "config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1,\n"
        "    num_attention_heads=2, intermediate_size=16, attn_implementation='sparsemax')\n"
        "print(BertModel(config).config._attn_implementation)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "sparsemax"
