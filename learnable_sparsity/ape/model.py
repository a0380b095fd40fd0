r"""The APE models of Correia & Martins (2019) and their dual-source baseline, on BERT's modules.

"A Simple and Effective Approach to Automatic Post-Editing with Transfer Learning" (thesis
ch. 3) post-edits a machine translation mt of a source sentence src into pe:

* **"bert"**: one BERT encoder reads the joint input x = ``src [SEP] mt`` (no [CLS]) with
  segment (token type) 0 on src and the [SEP], 1 on mt, and positions restarting at 0 where
  mt begins (:func:`segments_and_positions`). A decoder of BERT-shaped layers reads
  y_in = [CLS] pe (bos = [CLS], eos = [SEP], pad = [PAD]); each layer is

      h ← LN(h + SA(h)),    h ← LN(h + CA(h, memory)),    h ← LN(h + FF(h))

  (BERT's post-norm sublayers, dropout before each residual sum) with SA causal self-attention,
  CA context attention over the encoder output and FF(h) = W₂ GELU(W₁ h + b₁) + b₂. The decoder
  embeds y_in with the encoder's embedding module (word + position + token type, LayerNorm) and
  token type 1 (segment B) everywhere; logits = h Eᵀ + b with E the word-embedding matrix.
* **"dual_source"** (Junczys-Dowmunt & Grundkiewicz 2018): two randomly initialised BERT-shaped
  encoders, one reading src (with its [SEP]), one reading mt, and decoder layers with two
  stacked context attentions, h ← LN(h + CA_src(h, memory_src)), then
  h ← LN(h + CA_mt(h, memory_mt)), between SA and FF. One embedding module serves both encoders
  and the decoder (segment 0 on src, 1 on mt and pe, positions from 0 in each).

Initialisation and sharing (:class:`ApeConfig`; Table 3.1 of the thesis). Random weights are
BERT's init — N(0, σ²) matrices and embeddings with σ = ``initializer_range``, zero biases,
unit LayerNorm gains — drawn from torch's global RNG, so the caller's seed fixes them.

* ``bert_encoder``: the encoder (and so the shared embeddings) starts from the pre-trained BERT;
  ``bert_decoder``: decoder layer l's SA and FF start as copies of BERT layer l's (CA random).
* ``ca_init_sa`` (CA ← SA): each CA starts as a copy of its layer's SA (query, key, value,
  output dense, LayerNorm), after the SA got its weights. The flags are cumulative as the rows
  of Table 3.1: with ``ca_tied_sa`` as well, CA *is* SA and the copy has nothing left to do.
* ``sa_tied_encoder`` (SA ↔ Encoder SA), ``ca_tied_sa`` (CA ↔ SA), ``ff_tied_encoder`` (FF ↔
  Encoder FF): the decoder sublayer *is* the other one's modules (the same ``nn.Parameter``
  objects, counted once by ``parameters()``, trained by the gradients of both uses). A tied
  sublayer takes its weights from where it is tied (BERT's only with ``bert_encoder``); the
  decoder SA keeps its causal mask and CA its memory however its projections are shared.

Attention: every SA and CA, of encoder and decoder alike, normalises its scores with the core
normalizer named by ``attention`` (``learnable_sparsity.hf.attention``). For "entmax_alpha" each
attention module has its own α per head, tied projections or not: α belongs to where the
projections are used (bidirectional, causal or context attention), not to the projections.

Incremental decoding keeps transformers' :class:`ApeCache` (an ``EncoderDecoderCache``): per
decoder layer the SA keys and values so far and each CA's projected memory (layer l's CA over
source s at cross-cache index l + s · n_layers). :meth:`ApeModel.encode` returns the memory laid
out like the joint input, [B, S, d], and the *sides* [B, S]: 0 on padding, 1 on src positions
(with the [SEP]), 2 on mt positions; "bert" attends to both sides at once, "dual_source"'s two
CAs to one side each (its memory holds the src encoder's states on side 1 and the mt encoder's
on side 2). Each dual-source encoder runs over the whole joint input with the other side's keys
masked, so a src query sees exactly the src tokens at positions 0, 1, …, as if encoded alone
(the states it computes at the other side's positions are discarded): simple, at twice the
attention cost of encoding each side apart.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor, nn

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    from transformers import (
        BertConfig,
        BertModel,
        DynamicCache,
        EncoderDecoderCache,
        PreTrainedTokenizerBase,
    )
    from transformers.models.bert.modeling_bert import BertAttention, BertIntermediate, BertOutput

from learnable_sparsity.ape.wordpiece import SPECIAL_TOKENS
from learnable_sparsity.core.attention import ALPHA_MAX, ALPHA_MIN, alpha_of_logit
from learnable_sparsity.core.registry import NORMALIZERS
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.hf.attention import add_head_alphas, register
from learnable_sparsity.settings import Settings, SettingsError, setting

# Sides of the memory (ApeModel.encode): which input each position of the joint input holds.
PAD_SIDE, SRC_SIDE, MT_SIDE = 0, 1, 2

# The decoder reads the post-edit as BERT's segment B, as the mt it corrects.
TARGET_SEGMENT = 1

# Block-key names of a decoder layer's context attentions, in source order (src, then mt).
CONTEXT_KINDS = ("context", "context_mt")

# WordPiece's prefix of a piece that continues the word before it.
CONTINUATION = "##"

# The sharing flags of Table 3.1 (only "bert" has them).
SHARING_FLAGS = ("ca_init_sa", "sa_tied_encoder", "ca_tied_sa", "ff_tied_encoder")


@dataclass(frozen=True, kw_only=True)
class ApeConfig(Settings):
    """The APE model (params ``ape.model``): architecture, initialisation, sharing, attention.

    ``attention`` names the normalizer of every attention (``learnable_sparsity.hf.attention``),
    with ``topk_k`` for "topk" and ``alpha_init`` for "entmax_alpha" (None: AST's random α per
    head). ``decoder_layers`` None: as many as the encoder. Not params keys (``derived``, set by
    :func:`build_ape_model` from the tokenizer and BERT): the special ids, ``tgt_vocab`` (BERT's
    vocabulary) and ``max_positions`` (BERT's ``max_position_embeddings``: the longest segment
    and the longest decoded output, eos included).
    "Transformer trained from scratch" is ``architecture: bert`` with both ``bert_*`` false.
    """

    architecture: Literal["bert", "dual_source"]
    bert_encoder: bool = False
    bert_decoder: bool = False
    ca_init_sa: bool = False
    sa_tied_encoder: bool = False
    ca_tied_sa: bool = False
    ff_tied_encoder: bool = False
    attention: str = "softmax"
    topk_k: int = setting(8, at_least=1)
    alpha_init: float | None = setting(None, above=ALPHA_MIN, below=ALPHA_MAX)
    decoder_layers: int | None = setting(None, at_least=1)
    tgt_vocab: int | None = setting(None, at_least=1, derived=True)
    max_positions: int = setting(512, at_least=1, derived=True)
    pad_id: int = setting(SPECIAL_TOKENS.index("[PAD]"), at_least=0, derived=True)
    bos_id: int = setting(SPECIAL_TOKENS.index("[CLS]"), at_least=0, derived=True)
    eos_id: int = setting(SPECIAL_TOKENS.index("[SEP]"), at_least=0, derived=True)

    def validate(self) -> None:
        if self.attention not in NORMALIZERS:
            raise SettingsError(
                "attention", f"must be one of {', '.join(NORMALIZERS)}, got {self.attention!r}"
            )
        if self.architecture == "dual_source":
            for key in ("bert_encoder", "bert_decoder", *SHARING_FLAGS):
                if getattr(self, key):
                    raise SettingsError(
                        key,
                        "must be false for architecture 'dual_source' (randomly initialised "
                        "encoders and decoder, no BERT weights, no sharing)",
                    )
        if len({self.pad_id, self.bos_id, self.eos_id}) != 3:
            raise SettingsError("pad_id, bos_id and eos_id", "must be distinct")
        if self.tgt_vocab is not None:
            for key in ("pad_id", "bos_id", "eos_id"):
                if getattr(self, key) >= self.tgt_vocab:
                    raise SettingsError(key, f"is outside the vocabulary of {self.tgt_vocab}")

    @property
    def n_sources(self) -> int:
        """Context attentions per decoder layer: 1 ("bert") or 2 ("dual_source")."""
        return 2 if self.architecture == "dual_source" else 1


# --------------------------------------------------------------------------- inputs


def segments_and_positions(joint: Tensor, sep_id: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """Segment (token type) and position ids [B, S] of the padded joint input ``src [SEP] mt``.

    Up to and including the first ``sep_id`` of a row: segment 0, positions 0, 1, …; after it:
    segment 1, positions 0, 1, … again. Padding: segment 0, position 0. Raises
    LearnableSparsityError for a row without ``sep_id``.
    """
    is_sep = joint == sep_id
    if not bool(is_sep.any(dim=1).all()):
        raise LearnableSparsityError(
            f"every joint input needs the separator {sep_id} between src and mt"
        )
    after_sep = (is_sep.cumsum(dim=1) - is_sep.long()) > 0
    mt_start = is_sep.long().argmax(dim=1, keepdim=True) + 1
    index = torch.arange(joint.shape[1], device=joint.device).expand_as(joint)
    positions = torch.where(after_sep, index - mt_start, index)
    real = joint != pad_id
    return (after_sep & real).long(), positions.masked_fill(~real, 0)


def joint_input(tokenizer: PreTrainedTokenizerBase, src: str, mt: str) -> list[int]:
    """The WordPiece ids of ``src [SEP] mt`` (the encoder input, without [CLS])."""
    return [
        *tokenizer.encode(src, add_special_tokens=False),
        tokenizer.sep_token_id,
        *tokenizer.encode(mt, add_special_tokens=False),
    ]


def target_ids(tokenizer: PreTrainedTokenizerBase, pe: str) -> list[int]:
    """The WordPiece ids of the post-edit ``pe``, without [CLS]/[SEP] (collate adds bos/eos)."""
    return tokenizer.encode(pe, add_special_tokens=False)


def detokenize(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """Text of WordPiece ``ids``: "##" pieces joined to the piece before, the others separated
    by one space, special tokens dropped (so a whitespace-tokenized sentence whose words are
    not split at punctuation comes back as it was).

    Done here rather than by ``tokenizer.decode``, whose WordPiece decoder also removes the
    space before punctuation ("cage ." → "cage."), which tokenized APE references keep.
    """
    special = set(tokenizer.all_special_ids)
    words: list[str] = []
    for piece in tokenizer.convert_ids_to_tokens([i for i in ids if i not in special]):
        if piece.startswith(CONTINUATION) and words:
            words[-1] += piece[len(CONTINUATION) :]
        else:
            words.append(piece)
    return " ".join(words)


# --------------------------------------------------------------------------- decoder


class ApeCache(EncoderDecoderCache):
    """transformers' encoder-decoder cache with the ``reorder`` that beam search calls."""

    def reorder(self, beam_indices: Tensor) -> ApeCache:
        """This cache, reordered in place so that batch entry b is entry ``beam_indices[b]``."""
        self.reorder_cache(beam_indices)
        return self


class DecoderLayer(nn.Module):
    """Causal self-attention, a context attention per source, feed-forward (module docstring).

    Submodule names follow ``BertLayer`` (``attention``, ``intermediate``, ``output``), with
    ``crossattention`` a list: one context attention per source.
    """

    def __init__(self, config: BertConfig, index: int, n_layers: int, n_sources: int) -> None:
        super().__init__()
        self.attention = BertAttention(config, is_causal=True, layer_idx=index)
        self.crossattention = nn.ModuleList(
            BertAttention(config, layer_idx=index + s * n_layers, is_cross_attention=True)
            for s in range(n_sources)
        )
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(
        self,
        hidden: Tensor,
        causal_mask: Tensor,
        memory: Tensor,
        memory_masks: Sequence[Tensor],
        cache: ApeCache | None,
    ) -> Tensor:
        """``hidden`` [B, q, d] → [B, q, d]; masks are boolean [B, 1, q or 1, k], True = see."""
        hidden, _ = self.attention(hidden, causal_mask, past_key_values=cache)
        for attention, mask in zip(self.crossattention, memory_masks, strict=True):
            hidden, _ = attention(
                hidden, None, memory, encoder_attention_mask=mask, past_key_values=cache
            )
        return self.output(self.intermediate(hidden), hidden)


# --------------------------------------------------------------------------- the model


def attention_config(bert_config: BertConfig, config: ApeConfig) -> BertConfig:
    """A copy of ``bert_config`` whose attentions use ``config.attention`` (k: ``topk_k``)."""
    adapted = copy.deepcopy(bert_config)
    adapted._attn_implementation = config.attention
    adapted.topk_k = config.topk_k
    adapted.is_decoder = adapted.add_cross_attention = False
    return adapted


def _bert_init(module: nn.Module, std: float) -> None:
    """BERT's initialisation of ``module``'s linear layers and LayerNorms (module docstring)."""
    for part in module.modules():
        if isinstance(part, nn.Linear):
            nn.init.normal_(part.weight, std=std)
            nn.init.zeros_(part.bias)
        elif isinstance(part, nn.LayerNorm):
            nn.init.ones_(part.weight)
            nn.init.zeros_(part.bias)


def _tie_attention(target: BertAttention, source: BertAttention) -> None:
    """Make ``target`` use ``source``'s query/key/value projections and output sublayer."""
    for name in ("query", "key", "value"):
        setattr(target.self, name, getattr(source.self, name))
    target.output = source.output


@torch.no_grad()
def _copy_attention(target: BertAttention, source: BertAttention) -> None:
    """Copy ``source``'s query/key/value/output weights into ``target`` (α is not copied)."""
    for name in ("query", "key", "value"):
        getattr(target.self, name).load_state_dict(getattr(source.self, name).state_dict())
    target.output.load_state_dict(source.output.state_dict())


class ApeModel(nn.Module):
    """The APE encoder-decoder (module docstring), a
    :class:`~learnable_sparsity.nmt.seq2seq.Seq2Seq`.

    ``ApeModel(config, bert_config)`` is the architecture of ``config`` in the shape of
    ``bert_config`` with random weights and the ties in place (then load a checkpoint into
    it); :func:`build_ape_model` initialises it from a pre-trained BERT. ``config`` must have
    its derived fields set (``tgt_vocab`` equal to BERT's vocabulary).
    """

    def __init__(self, config: ApeConfig, bert_config: BertConfig) -> None:
        super().__init__()
        if config.tgt_vocab != bert_config.vocab_size:
            raise LearnableSparsityError(
                f"tgt_vocab {config.tgt_vocab} differs from BERT's vocabulary "
                f"{bert_config.vocab_size}: build the model with build_ape_model"
            )
        if config.max_positions > bert_config.max_position_embeddings:
            raise LearnableSparsityError(
                f"max_positions {config.max_positions} exceeds BERT's "
                f"max_position_embeddings {bert_config.max_position_embeddings}"
            )
        n_encoder = bert_config.num_hidden_layers
        n_decoder = config.decoder_layers or n_encoder
        layerwise = [
            key
            for key in ("bert_decoder", "sa_tied_encoder", "ff_tied_encoder")
            if getattr(config, key)
        ]
        if layerwise and n_decoder > n_encoder:
            raise SettingsError(
                "decoder_layers",
                f"must not exceed the encoder's {n_encoder} layers with {', '.join(layerwise)} "
                f"(decoder layer l takes encoder layer l's), got {n_decoder}",
            )
        register()
        self.config = config
        self.bert_config = attention_config(bert_config, config)
        self.encoder = BertModel(self.bert_config, add_pooling_layer=False)
        self.mt_encoder = (
            BertModel(self.bert_config, add_pooling_layer=False)
            if config.architecture == "dual_source"
            else None
        )
        if self.mt_encoder is not None:
            self.mt_encoder.embeddings = self.encoder.embeddings
        self.decoder = nn.ModuleList(
            DecoderLayer(self.bert_config, i, n_decoder, config.n_sources) for i in range(n_decoder)
        )
        _bert_init(self.decoder, self.bert_config.initializer_range)
        self.output_bias = nn.Parameter(torch.zeros(bert_config.vocab_size))
        for layer, encoder_layer in zip(self.decoder, self.encoder.encoder.layer, strict=False):
            if config.sa_tied_encoder:
                _tie_attention(layer.attention, encoder_layer.attention)
            if config.ca_tied_sa:
                _tie_attention(layer.crossattention[0], layer.attention)
            if config.ff_tied_encoder:
                layer.intermediate, layer.output = encoder_layer.intermediate, encoder_layer.output
        if NORMALIZERS[config.attention].argument == "alpha":
            add_head_alphas(self, config.alpha_init)

    @property
    def embeddings(self) -> nn.Module:
        """The embedding module shared by the encoder(s) and the decoder."""
        return self.encoder.embeddings

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Joint input ``src [SEP] mt`` ids [B, S] → (memory [B, S, d], sides [B, S]).

        sides: :data:`PAD_SIDE` on padding, :data:`SRC_SIDE` on src and its [SEP],
        :data:`MT_SIDE` on mt (see the module docstring for dual-source memory).
        """
        segments, positions = segments_and_positions(src, self.config.eos_id, self.config.pad_id)
        if int(positions.max()) >= self.config.max_positions:
            raise LearnableSparsityError(
                f"a segment of {int(positions.max()) + 1} tokens exceeds "
                f"max_positions={self.config.max_positions}"
            )
        real = src != self.config.pad_id
        sides = torch.where(real, segments + SRC_SIDE, PAD_SIDE)
        inputs = {"input_ids": src, "token_type_ids": segments, "position_ids": positions}
        if self.mt_encoder is None:
            memory = self.encoder(**inputs, attention_mask=real).last_hidden_state
            return memory, sides
        src_side, mt_side = sides == SRC_SIDE, sides == MT_SIDE
        src_memory = self.encoder(**inputs, attention_mask=src_side).last_hidden_state
        mt_memory = self.mt_encoder(**inputs, attention_mask=mt_side).last_hidden_state
        return torch.where(src_side[..., None], src_memory, mt_memory), sides

    def decode(
        self,
        tokens: Tensor,
        memory: Tensor,
        sides: Tensor,
        cache: ApeCache | None = None,
        *,
        use_cache: bool = False,
    ) -> tuple[Tensor, ApeCache | None]:
        """Logits [B, q, V] of the target positions of ``tokens`` [B, q], and the cache.

        Full decoding: ``tokens`` = [bos] + y, ``cache`` None. Incremental decoding: the first
        call passes the first token(s) with ``use_cache=True``, later ones the new token(s) and
        the returned cache, whose length is the position offset of ``tokens``. The cache is
        returned when ``use_cache`` or ``cache``.
        """
        use_cache = use_cache or cache is not None
        if use_cache and cache is None:
            cache = ApeCache(DynamicCache(), DynamicCache())
        offset = 0 if cache is None else cache.get_seq_length()
        batch, length = tokens.shape
        end = offset + length
        if end > self.config.max_positions:
            raise LearnableSparsityError(
                f"target of length {end} exceeds max_positions={self.config.max_positions}"
            )
        positions = torch.arange(offset, end, device=tokens.device).expand(batch, length)
        hidden = self.embeddings(
            input_ids=tokens,
            token_type_ids=torch.full_like(tokens, TARGET_SEGMENT),
            position_ids=positions,
        )
        # Query i (position offset + i) sees keys 0 … offset + i.
        causal = torch.ones(length, end, dtype=torch.bool, device=tokens.device).tril(offset)
        causal = causal.expand(batch, 1, length, end)
        memory_masks = [mask[:, None, None, :] for mask in self._memory_masks(sides)]
        for layer in self.decoder:
            hidden = layer(hidden, causal, memory, memory_masks, cache)
        logits = hidden @ self.embeddings.word_embeddings.weight.T + self.output_bias
        return logits, cache if use_cache else None

    def _memory_masks(self, sides: Tensor) -> list[Tensor]:
        """What each context attention of a layer sees: both sides, or src then mt."""
        if self.mt_encoder is None:
            return [sides != PAD_SIDE]
        return [sides == SRC_SIDE, sides == MT_SIDE]

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits [B, T, V] for ``tgt_in`` = [bos] + y given the joint ``src``."""
        memory, sides = self.encode(src)
        logits, _ = self.decode(tgt_in, memory, sides)
        return logits

    def attention_blocks(self) -> dict[str, nn.Module]:
        """Every attention module by block key: "encoder.self.layer{i}" (the src encoder in
        "dual_source"), "mt_encoder.self.layer{i}", "decoder.self.layer{i}",
        "decoder.context.layer{i}" and, in "dual_source", "decoder.context_mt.layer{i}"."""
        blocks: dict[str, nn.Module] = {}
        for name, encoder in (("encoder", self.encoder), ("mt_encoder", self.mt_encoder)):
            if encoder is not None:
                for i, layer in enumerate(encoder.encoder.layer):
                    blocks[f"{name}.self.layer{i}"] = layer.attention.self
        for i, layer in enumerate(self.decoder):
            blocks[f"decoder.self.layer{i}"] = layer.attention.self
            for kind, attention in zip(CONTEXT_KINDS, layer.crossattention, strict=False):
                blocks[f"decoder.{kind}.layer{i}"] = attention.self
        return blocks

    def alphas(self) -> dict[str, Tensor]:
        """Current α per head ([heads], detached) by block key; empty unless entmax_alpha."""
        return {
            key: alpha_of_logit(block.alpha_logit).detach()
            for key, block in self.attention_blocks().items()
            if isinstance(getattr(block, "alpha_logit", None), Tensor)
        }


def build_ape_model(
    config: ApeConfig, bert: BertModel, tokenizer: PreTrainedTokenizerBase
) -> ApeModel:
    """The APE model of ``config`` in ``bert``'s shape, initialised as ``config`` says.

    The derived fields of ``config`` come from ``tokenizer`` (pad = [PAD], bos = [CLS], eos =
    [SEP]) and ``bert.config`` (vocabulary, ``max_position_embeddings``). ``bert``'s weights
    (a ``BertModel``; pass ``.bert`` of a ``BertForMaskedLM``) are copied where
    ``bert_encoder`` / ``bert_decoder`` say, then each CA copies its SA when ``ca_init_sa``.
    Random weights and α come from torch's global RNG (seed it before calling).
    """
    if not isinstance(bert, BertModel):
        raise LearnableSparsityError(
            f"build_ape_model needs a BertModel, got {type(bert).__name__} (pass model.bert)"
        )
    if len(tokenizer) > bert.config.vocab_size:
        raise LearnableSparsityError(
            f"the tokenizer has {len(tokenizer)} tokens, more than BERT's vocabulary "
            f"{bert.config.vocab_size}"
        )
    config = replace(
        config,
        tgt_vocab=bert.config.vocab_size,
        max_positions=bert.config.max_position_embeddings,
        pad_id=tokenizer.pad_token_id,
        bos_id=tokenizer.cls_token_id,
        eos_id=tokenizer.sep_token_id,
    )
    model = ApeModel(config, bert.config)
    if config.bert_encoder:
        bert_weights = {k: v for k, v in bert.state_dict().items() if not k.startswith("pooler.")}
        missing, unexpected = model.encoder.load_state_dict(bert_weights, strict=False)
        if unexpected or any(not key.endswith("alpha_logit") for key in missing):
            raise LearnableSparsityError(
                f"BERT's weights do not fit the encoder: missing {missing}, unexpected {unexpected}"
            )
    for layer, bert_layer in zip(model.decoder, bert.encoder.layer, strict=False):
        if config.bert_decoder and not config.sa_tied_encoder:
            _copy_attention(layer.attention, bert_layer.attention)
        if config.bert_decoder and not config.ff_tied_encoder:
            layer.intermediate.load_state_dict(bert_layer.intermediate.state_dict())
            layer.output.load_state_dict(bert_layer.output.state_dict())
        if config.ca_init_sa and not config.ca_tied_sa:
            _copy_attention(layer.crossattention[0], layer.attention)
    return model
