"""Every text family transformers ships, with the registered "softmax" against "eager".

For each model type of transformers' seq2seq, causal and masked language-model tables (the
seq2seq head first, so that encoder-decoders run their cross-attention), a tiny model is built
from its config class with small sizes (:data:`SMALL`: hidden 16, 2 heads of 8, one key/value
head where the config has them (grouped-query attention), sliding window 3 < the 6 tokens,
Gemma-style logit soft-capping 0.5; a batch of 2 with right padding), run once with eager
attention and once, same weights, with the registered "softmax". The test demands one of two
outcomes: the logits of the real tokens agree within :data:`TOL`, or our attention refuses with
a LearnableSparsityError naming the model type. A family our attention function never reaches
must be one transformers marks as not dispatching through the attention interface
(``is_backend_compatible()`` false), which ignores every registered name.

Families that cannot be compared are skipped with their reason (pytest ``-rs`` lists them):
those in :data:`SKIPPED` (composite configs with vision/audio or encoder/decoder sub-configs,
models over 2M parameters even at the small sizes, small configs their validators reject or
their eager forward fails on, all measured with transformers 5.23), and, under another
transformers version, any family whose eager forward fails at these sizes.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import CONFIG_MAPPING
from transformers.models.auto import modeling_auto

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.hf import attention as hf_attention

pytestmark = pytest.mark.slow

# fp32 agreement of two computations of the same attention in a different operation order.
TOL = 1e-5
# A model over this many parameters at the small sizes (big fixed vocabularies or expert
# counts) costs seconds to build and is skipped.
MAX_PARAMETERS = 2_000_000
SMALL = {
    "hidden_size": 16,
    "d_model": 16,
    "n_embd": 16,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "num_layers": 2,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "num_decoder_layers": 1,
    "num_attention_heads": 2,
    "n_head": 2,
    "num_heads": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 32,
    "encoder_ffn_dim": 32,
    "decoder_ffn_dim": 32,
    "d_ff": 32,
    "n_inner": 32,
    "d_kv": 8,
    "head_dim": 8,
    "vocab_size": 99,
    "pad_token_id": 0,
    "max_position_embeddings": 64,
    "n_positions": 64,
    "sliding_window": 3,
    "moe_intermediate_size": 8,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "attn_logit_softcapping": 0.5,
    "initializer_range": 0.2,
}
TOKENS = 6
# Right padding: the second sequence has 4 real tokens of 6.
REAL = torch.arange(TOKENS) < torch.tensor([[TOKENS], [4]])
TABLES = (
    modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)
FAMILIES = sorted(set().union(*TABLES))

SKIPPED: dict[str, str] = {
    "audioflamingo3": "composite config (audio_config, text_config)",
    "axk1": "eager forward fails: tensor a (32) must match the size of tensor b (4) at non-sing...",
    "axk2": "over 2M parameters when small (2165872)",
    "bailing_hybrid": "linear-attention cache needs other layer types",
    "bamba": "config validator 'validate_architecture'",
    "blt": "composite config (patcher_config, encoder_config, decoder_config, global_config)",
    "codegen": "RuntimeError: shape '[2, 6, 4, 0, 8]' is invalid for input of size 192",
    "cohere_compass_text": "KeyError: 'full_attention'",
    "dbrx": "composite config (attn_config, ffn_config)",
    "deepseek_v2": "eager forward fails: tensor a (2) must match the size of tensor b (4) at no...",
    "deepseek_v3": "eager forward fails: tensor a (32) must match the size of tensor b (4) at n...",
    "deepseek_v32": "over 2M parameters when small (26962608)",
    "diffllama": "ValueError: DiffLlama requires `num_key_value_heads` to be even (and at least...",
    "dots3_note": "composite config (text_config, vision_config, audio_config)",
    "dots3_note_text": "per-layer config: 'num_attention_heads' is a per-layer attribute and may v",
    "emu3": "composite config (vq_config, text_config)",
    "encoder-decoder": "composite config (encoder, decoder)",
    "esm": "composite config (esmfold_config)",
    "esmc": "config validator 'validate_architecture'",
    "falcon": "AttributeError: property 'head_dim' of 'FalconConfig' object has no setter",
    "funnel": "NotImplementedError: This model does not support the setting of `num_hidden_laye...",
    "fuyu": "composite config (text_config)",
    "gemma3": "composite config (text_config, vision_config)",
    "gemma3n": "composite config (text_config, vision_config, audio_config)",
    "gemma3n_text": "ValueError: The set of layer types producing a cache is different than the...",
    "gemma4": "composite config (text_config, vision_config, audio_config)",
    "gemma4_assistant": "config validator 'validate_architecture'",
    "gemma4_text": "per-layer config: 'head_dim' is a per-layer attribute and may vary across ",
    "gemma4_unified": "composite config (text_config, vision_config, audio_config)",
    "gemma4_unified_assistant": "composite config (text_config)",
    "gemma4_unified_text": "per-layer config: 'head_dim' is a per-layer attribute and may vary...",
    "git": "composite config (vision_config)",
    "glm4_moe_lite": "eager forward fails: tensor a (2) must match the size of tensor b (4) at...",
    "glm_moe_dsa": "over 2M parameters when small (19909296)",
    "glmasr": "composite config (text_config, audio_config)",
    "got_ocr2": "composite config (text_config, vision_config)",
    "gpt_neo": "config validator 'validate_architecture'",
    "gptj": "eager forward fails: tensor a (8) must match the size of tensor b (64) at non-sing...",
    "granite_speech": "composite config (text_config, encoder_config, projector_config)",
    "granite_speech_plus": "composite config (text_config, encoder_config, projector_config)",
    "granitemoehybrid": "config validator 'validate_architecture'",
    "hy_v4": "over 2M parameters when small (8900513)",
    "jamba": "linear-attention cache needs other layer types",
    "kimi_linear": "over 2M parameters when small (2744240)",
    "lfm2_moe": "TypeError: 'NoneType' object is not subscriptable",
    "lfm3": "linear-attention cache needs other layer types",
    "llama4": "composite config (text_config, vision_config)",
    "longcat_flash": "eager forward fails: tensor a (32) must match the size of tensor b (4) at...",
    "luke": "over 2M parameters when small (128521059)",
    "mamba2": "config validator 'validate_architecture'",
    "minicpm3": "eager forward fails: tensor a (2) must match the size of tensor b (4) at non-s...",
    "mllama": "composite config (text_config, vision_config)",
    "mobilebert": "RuntimeError: Trying to create tensor with negative dimension -112: [-112, 99]",
    "modernvbert": "composite config (text_config, vision_config)",
    "moshi": "composite config (audio_encoder_config, depth_decoder_config)",
    "moss_transcribe_diarize": "composite config (audio_config, text_config)",
    "mpt": "composite config (attn_config)",
    "musicflamingo": "composite config (audio_config, text_config)",
    "musicgen": "composite config (text_encoder, audio_encoder, decoder)",
    "musicgen_melody": "composite config (text_encoder, audio_encoder, decoder)",
    "nemo_speechlm": "composite config (audio_config, text_config, word_timestamp_config)",
    "neomme": "per-layer config: 'sliding_window' is a per-layer attribute and may vary a",
    "perceiver": "over 2M parameters when small (259938147)",
    "phi4_multimodal": "composite config (audio_config, vision_config)",
    "prophetnet": "NotImplementedError: This model does not support the setting of `num_hidden_...",
    "qwen2_audio": "composite config (text_config, audio_config)",
    "qwen3_5": "composite config (vision_config, text_config)",
    "qwen3_5_moe": "composite config (vision_config, text_config)",
    "qwen3_5_moe_text": "linear-attention cache needs other layer types",
    "qwen3_5_text": "linear-attention cache needs other layer types",
    "qwen3_asr": "composite config (audio_config, text_config)",
    "qwen3_next": "linear-attention cache needs other layer types",
    "qwen4_exp": "composite config (vision_config, text_config)",
    "qwen4_exp_text": "linear-attention cache needs other layer types",
    "recurrent_gemma": "linear-attention cache needs other layer types",
    "reformer": "AssertionError: If you want to use `ReformerModelWithLMHead` make sure that `i...",
    "roc_bert": "over 2M parameters when small (13454451)",
    "squeezebert": "AssertionError: If you want embedding_size != intermediate hidden_size, ple...",
    "t5gemma": "composite config (encoder, decoder)",
    "t5gemma2": "composite config (encoder, decoder)",
    "ultravbert": "composite config (text_config, vision_config)",
    "vibevoice_asr": "composite config (text_config, semantic_tokenizer_encoder_config, acousti...",
    "voxtral": "composite config (text_config, audio_config)",
    "voxtral_realtime": "composite config (text_config, audio_config)",
    "xlnet": "NotImplementedError: The model xlnet is one of the few models that has no sequenc...",
    "xlstm": "ValueError: matC_old has wrong shape, got torch.Size([2, 2, 32, 32])",
    "xmod": "ValueError: Input language unknown. Please call `XmodPreTrainedModel.set_default_l...",
    "youtu": "eager forward fails: tensor a (32) must match the size of tensor b (4) at non-sin...",
    "zamba": "config validator 'validate_layer_type'",
    "zamba2": "config validator 'validate_layer_type'",
    "zaya": "config validator 'validate_architecture'",
}


@pytest.fixture(autouse=True, scope="module")
def _registered() -> None:
    hf_attention.register()


def _model_class(family: str) -> type:
    name = next(table[family] for table in TABLES if family in table)
    return getattr(transformers, name[0] if isinstance(name, (tuple, list)) else name)


def _build(family: str) -> torch.nn.Module:
    config_class = CONFIG_MAPPING[family]
    if getattr(config_class, "sub_configs", None):
        pytest.skip(f"{family}: composite config ({', '.join(config_class.sub_configs)})")
    defaults = config_class()
    config = config_class(**{k: v for k, v in SMALL.items() if hasattr(defaults, k)})
    model_class = _model_class(family)
    with torch.device("meta"):
        n_parameters = sum(p.numel() for p in model_class._from_config(config).parameters())
    if n_parameters > MAX_PARAMETERS:
        pytest.skip(f"{family}: {n_parameters} parameters at the small sizes")
    torch.manual_seed(0)
    return model_class._from_config(config, attn_implementation="eager").eval()


def _real(logits: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    """The logits of real tokens: a padded query may see no key at all, where eager attention
    gives a uniform row and ours a zero row (the core's convention); no real token sees one."""
    return logits if model.config.is_encoder_decoder else logits[REAL]


@pytest.mark.parametrize("family", FAMILIES)
def test_registered_softmax_equals_eager_or_refuses_by_name(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if family in SKIPPED:
        pytest.skip(f"{family}: {SKIPPED[family]}")
    ids = torch.randint(1, 99, (2, TOKENS), generator=torch.Generator().manual_seed(0))
    try:
        model = _build(family)
        inputs = {"input_ids": ids, "attention_mask": REAL.long()}
        if model.config.is_encoder_decoder:
            inputs["decoder_input_ids"] = ids[:, : TOKENS - 1]
        with torch.no_grad():
            eager = _real(model(**inputs).logits, model)
    except Exception as error:  # a family that does not build or run at these sizes
        if isinstance(error, pytest.skip.Exception):
            raise
        pytest.skip(f"{family}: {type(error).__name__}: {str(error)[:120]}")

    calls = []
    forward = hf_attention.sparse_attention_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(hf_attention, "sparse_attention_forward", counted)
    model.set_attn_implementation("softmax")
    try:
        with torch.no_grad():
            ours = _real(model(**inputs).logits, model)
    except LearnableSparsityError as refusal:
        assert model.config.model_type in str(refusal)
        return
    if not calls:
        assert not model.is_backend_compatible(), f"{family} never called the attention function"
        with pytest.raises(LearnableSparsityError, match="is ignored"):
            hf_attention.require_attention_interface(model, **inputs)
    else:
        hf_attention.require_attention_interface(model, **inputs)  # one that calls it passes
    torch.testing.assert_close(ours, eager, atol=TOL, rtol=0)
