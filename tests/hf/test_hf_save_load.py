"""Saved sparse models reload as they were: ``save_sparse`` → ``load_sparse``.

Three model kinds, each with every normalizer: a BERT masked LM (encoder), a BART
(encoder-decoder: self-, causal and cross-attention) and a Llama with grouped-query attention
(2 key/value heads for 4 query heads). Each is built with the name (entmax_alpha with AST's
random α per head, different per head, so that a reload with fresh α would show), saved,
reloaded, and must give identical logits and, for the generative ones, identical greedy tokens.
A plain ``from_pretrained`` of the same directory runs dense "sdpa", which is why the loader
exists: the test checks that it differs, so the round trip cannot pass by accident.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertForMaskedLM,
    LlamaConfig,
    LlamaForCausalLM,
)

from learnable_sparsity.core.registry import NORMALIZERS
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.hf.attention import (
    add_head_alphas,
    head_alphas,
    load_sparse,
    register,
    save_sparse,
)

VOCAB = 60
SMALL = {"vocab_size": VOCAB, "initializer_range": 0.2, "topk_k": 3, "max_position_embeddings": 32}


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    register()


def _bert(name: str):
    config = BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        attn_implementation=name, **SMALL,
    )  # fmt: skip
    return BertForMaskedLM(config)


def _bart(name: str):
    config = BartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, forced_eos_token_id=None,
        attn_implementation=name, **SMALL,
    )  # fmt: skip
    return BartForConditionalGeneration(config)


def _llama(name: str):
    config = LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        attn_implementation=name, **SMALL,
    )  # fmt: skip
    return LlamaForCausalLM(config)


KINDS = {"bert": _bert, "bart": _bart, "llama": _llama}


def _model(kind: str, name: str):
    torch.manual_seed(0)
    model = KINDS[kind](name).eval()
    if name == "entmax_alpha":
        add_head_alphas(model, alpha_init=None, generator=torch.Generator().manual_seed(1))
    return model


def _inputs(kind: str) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # padding in the second sequence
    inputs = {"input_ids": ids, "attention_mask": mask}
    if kind == "bart":
        inputs["decoder_input_ids"] = ids[:, :4]
    return inputs


def _logits(model, kind: str) -> torch.Tensor:
    with torch.no_grad():
        return model(**_inputs(kind)).logits


def _generated(model, kind: str) -> torch.Tensor:
    inputs = _inputs(kind)
    inputs.pop("decoder_input_ids", None)
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=6, do_sample=False, num_beams=1)


@pytest.mark.parametrize("name", list(NORMALIZERS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_saved_sparse_model_reloads_to_the_same_logits_and_tokens(
    kind: str, name: str, tmp_path: Path
) -> None:
    model = _model(kind, name)
    save_sparse(model, tmp_path)
    reloaded = load_sparse(type(model), tmp_path).eval()
    assert reloaded.config._attn_implementation == name
    assert torch.equal(_logits(reloaded, kind), _logits(model, kind))
    for module, alpha in head_alphas(model).items():
        assert torch.equal(head_alphas(reloaded)[module], alpha), module
    if kind != "bert":
        assert torch.equal(_generated(reloaded, kind), _generated(model, kind))
    if name != "softmax":
        dense = type(model).from_pretrained(tmp_path).eval()
        assert not torch.allclose(_logits(dense, kind), _logits(model, kind), atol=1e-3)


def test_loading_a_directory_without_the_name_or_with_other_alphas_refuses(tmp_path: Path) -> None:
    plain = _model("bert", "sparsemax")
    plain.save_pretrained(tmp_path / "plain")
    with pytest.raises(LearnableSparsityError, match="save_sparse"):
        load_sparse(BertForMaskedLM, tmp_path / "plain")
    with pytest.raises(LearnableSparsityError, match="'sdpa'"):
        save_sparse(_model("bert", "sdpa"), tmp_path / "dense")
    model = _model("bert", "entmax_alpha")
    del model.bert.encoder.layer[1].attention.self.alpha_logit
    save_sparse(model, tmp_path / "partial")
    with pytest.raises(LearnableSparsityError, match="differ"):
        load_sparse(BertForMaskedLM, tmp_path / "partial")


def test_an_auto_class_loads_it_too(tmp_path: Path) -> None:
    model = _model("llama", "entmax_alpha")
    save_sparse(model, tmp_path)
    reloaded = load_sparse(AutoModelForCausalLM, tmp_path).eval()
    assert type(reloaded) is LlamaForCausalLM
    assert torch.equal(_logits(reloaded, "llama"), _logits(model, "llama"))
