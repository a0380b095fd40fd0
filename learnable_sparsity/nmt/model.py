r"""Transformer encoder-decoder (Vaswani et al. 2017) whose attention normalizer is a parameter.

Every attention block (encoder self-, decoder self- and decoder context attention) is the shared
``learnable_sparsity.core.attention.MultiHeadAttention`` with the normalizer named in the config, so
softmax, sparsemax, 1.5-entmax, α-entmax with a learned α per head (Correia et al. 2019) and
top-k softmax (Zhao et al. 2019) are one model class with one switch.

Embeddings: x_t = √d · E[y_t] + PE(t), with sinusoidal positions
PE(t, 2i) = sin(t / 10000^{2i/d}), PE(t, 2i+1) = cos(t / 10000^{2i/d}).

Layers (``pre_norm=True``, the default), each sublayer f with its own LayerNorm:
    x ← x + Dropout(f(LN(x)))        and a final LN after the last layer of each stack;
(``pre_norm=False``, the original post-norm Transformer):
    x ← LN(x + Dropout(f(x))).
Pre-norm is the default because the AST experiments ran on OpenNMT-py, whose Transformer is
pre-norm, and pre-norm trains stably without long warm-up at the small smoke-profile scale;
post-norm (fairseq's default, used by the Explicit Sparse Transformer) is one flag away.

Feed-forward: FFN(x) = W₂ Dropout(ReLU(W₁ x + b₁)) + b₂ (OpenNMT-py's dropout placement).
Output: logits = h Wᵀ with W the target embedding when ``share_embeddings`` (one joint
vocabulary for source, target and output projection), else a separate projection.

Decoder self-attention needs no padding mask: targets are right-padded and the causal mask
already hides every later (hence every padded) position from a real one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from learnable_sparsity.core.attention import ALPHA_MAX, ALPHA_MIN, KVCache, random_alpha_logit
from learnable_sparsity.core.attention import MultiHeadAttention as Attention
from learnable_sparsity.core.registry import NORMALIZERS
from learnable_sparsity.data.bpe import BOS_ID, EOS_ID, PAD_ID
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import Settings, SettingsError, setting


@dataclass(frozen=True, kw_only=True)
class TransformerConfig(Settings):
    """Hyper-parameters (params ``nmt.model``); the defaults are the base Transformer.

    ``topk_k`` is k for "topk" attention; ``alpha_init`` is the initial α of every head for
    "entmax_alpha", or None for AST's random init α = 1 + sigmoid(a), a ~ N(0, 1) per head
    (truncated to |a| ≤ 3, ``learnable_sparsity.core.attention.random_alpha_logit``).
    Not params keys (``derived``): the vocabulary sizes, which the BPE model decides (set them
    with :meth:`for_vocabulary`), the ``normalizer`` of every attention block (the grid's
    attention variant, one of ``NORMALIZERS``) and the special ids (distinct, as the BPE
    models of ``learnable_sparsity.data.bpe`` number them).
    """

    src_vocab: int | None = setting(None, at_least=1, derived=True)
    tgt_vocab: int | None = setting(None, at_least=1, derived=True)
    d_model: int = setting(512, at_least=2)
    n_heads: int = setting(8, at_least=1)
    d_ff: int = setting(2048, at_least=1)
    enc_layers: int = setting(6, at_least=1)
    dec_layers: int = setting(6, at_least=1)
    dropout: float = setting(0.1, at_least=0, below=1)
    attention_dropout: float = setting(0.1, at_least=0, below=1)
    normalizer: str = setting("softmax", derived=True)
    topk_k: int = setting(8, at_least=1)
    alpha_init: float | None = setting(1.5, above=ALPHA_MIN, below=ALPHA_MAX)
    share_embeddings: bool = False
    pre_norm: bool = True
    pad_id: int = setting(PAD_ID, at_least=0, derived=True)
    bos_id: int = setting(BOS_ID, at_least=0, derived=True)
    eos_id: int = setting(EOS_ID, at_least=0, derived=True)
    max_positions: int = setting(1024, at_least=1)

    def validate(self) -> None:
        if self.d_model % self.n_heads != 0:
            raise SettingsError("d_model", f"must be divisible by n_heads={self.n_heads}")
        if self.d_model % 2 != 0:
            raise SettingsError("d_model", "must be even (sinusoidal positions)")
        if self.normalizer not in NORMALIZERS:
            raise SettingsError("normalizer", f"must be one of {', '.join(NORMALIZERS)}")
        if len({self.pad_id, self.bos_id, self.eos_id}) != 3:
            raise SettingsError("pad_id, bos_id and eos_id", "must be distinct")
        if self.src_vocab is None or self.tgt_vocab is None:
            return
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise SettingsError("share_embeddings", "needs src_vocab == tgt_vocab")
        for key in ("pad_id", "bos_id", "eos_id"):
            if getattr(self, key) >= min(self.src_vocab, self.tgt_vocab):
                raise SettingsError(key, "is outside the vocabulary")

    def for_vocabulary(self, vocab_size: int, normalizer: str) -> TransformerConfig:
        """This architecture over one joint vocabulary (shared BPE) of ``vocab_size`` ids, with
        every attention block using ``normalizer``."""
        return replace(self, src_vocab=vocab_size, tgt_vocab=vocab_size, normalizer=normalizer)


@dataclass(frozen=True)
class DecoderCache:
    """Incremental-decoding state: per decoder layer, (self-attention cache, context cache).

    The self-attention caches grow by one position per decoded token; the context caches are
    static (the encoder memory projected once).
    """

    layers: tuple[tuple[KVCache, KVCache], ...]

    @property
    def length(self) -> int:
        """Number of target positions decoded so far."""
        return self.layers[0][0].key.shape[2]

    def reorder(self, beam_indices: Tensor) -> DecoderCache:
        """The cache whose batch entry b is entry ``beam_indices[b]`` of this one."""
        return DecoderCache(
            tuple((s.reorder(beam_indices), c.reorder(beam_indices)) for s, c in self.layers)
        )


# AST's random α (alpha_init None) is drawn by Transformer._init_weights, in module order with the
# other weights; until then a block holds the logit of this α (it consumes no random numbers).
_ALPHA_BEFORE_RANDOM_INIT = 1.5


def attention_block(config: TransformerConfig) -> Attention:
    """A fresh attention block with the config's normalizer, k, initial α and dropout."""
    alpha_init = _ALPHA_BEFORE_RANDOM_INIT if config.alpha_init is None else config.alpha_init
    return Attention(
        config.d_model,
        config.n_heads,
        config.normalizer,
        k=config.topk_k,
        alpha_init=alpha_init,
        dropout=config.attention_dropout,
    )


def sinusoidal_positions(length: int, d_model: int) -> Tensor:
    """PE [length, d_model]: PE(t, 2i) = sin(t / 10000^{2i/d}), PE(t, 2i+1) = cos(same)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model)
    )
    pe = torch.zeros(length, d_model)
    pe[:, 0::2] = torch.sin(position * inv_freq)
    pe[:, 1::2] = torch.cos(position * inv_freq)
    return pe


class FeedForward(nn.Module):
    """FFN(x) = W₂ Dropout(ReLU(W₁ x + b₁)) + b₂."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff)
        self.w2 = nn.Linear(config.d_ff, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.dropout(torch.relu(self.w1(x))))


class Residual(nn.Module):
    """Residual connection around a sublayer f: x ← after(x, f(before(x))).

    pre-norm: before(x) = LN(x), after = x + Dropout(f);  post-norm: before(x) = x,
    after = LN(x + Dropout(f)).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.pre_norm = config.pre_norm
        self.norm = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def before(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre_norm else x

    def after(self, x: Tensor, fx: Tensor) -> Tensor:
        x = x + self.dropout(fx)
        return x if self.pre_norm else self.norm(x)


class EncoderLayer(nn.Module):
    """Self-attention over the (unpadded) source positions, then the feed-forward block."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = attention_block(config)
        self.ffn = FeedForward(config)
        self.res_attn = Residual(config)
        self.res_ffn = Residual(config)

    def forward(
        self, x: Tensor, src_mask: Tensor, return_probs: bool
    ) -> tuple[Tensor, Tensor | None]:
        attn = self.self_attn(
            self.res_attn.before(x), key_padding_mask=src_mask, return_probs=return_probs
        )
        x = self.res_attn.after(x, attn.output)
        x = self.res_ffn.after(x, self.ffn(self.res_ffn.before(x)))
        return x, attn.probs


class DecoderLayer(nn.Module):
    """Causal self-attention, context attention over the memory, then the feed-forward block."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = attention_block(config)
        self.context_attn = attention_block(config)
        self.ffn = FeedForward(config)
        self.res_self = Residual(config)
        self.res_context = Residual(config)
        self.res_ffn = Residual(config)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: tuple[KVCache, KVCache] | None,
        use_cache: bool,
        return_probs: bool,
    ) -> tuple[Tensor, tuple[KVCache, KVCache] | None, Tensor | None, Tensor | None]:
        """Returns (x, (self cache, context cache) or None, self probs, context probs)."""
        self_cache, context_cache = cache if cache is not None else (None, None)
        sa = self.self_attn(
            self.res_self.before(x),
            causal=True,
            cache=self_cache,
            use_cache=use_cache,
            return_probs=return_probs,
        )
        x = self.res_self.after(x, sa.output)
        ca = self.context_attn(
            self.res_context.before(x),
            memory,
            key_padding_mask=src_mask,
            cache=context_cache,
            use_cache=use_cache,
            return_probs=return_probs,
        )
        x = self.res_context.after(x, ca.output)
        x = self.res_ffn.after(x, self.ffn(self.res_ffn.before(x)))
        new_cache = (sa.cache, ca.cache) if sa.cache is not None else None
        return x, new_cache, sa.probs, ca.probs


class Transformer(nn.Module):
    """Encoder-decoder Transformer; see the module docstring for the equations.

    Attention probabilities for analysis: pass a dict as ``attention`` to ``encode``, ``decode``
    or ``forward`` and it is filled with one [batch, heads, queries, keys] tensor per block,
    under the keys "encoder.self.layer{i}", "decoder.self.layer{i}", "decoder.context.layer{i}"
    (the same keys as ``alphas()``).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if config.src_vocab is None or config.tgt_vocab is None:
            raise LearnableSparsityError(
                "TransformerConfig needs its vocabulary sizes: use config.for_vocabulary(...)"
            )
        self.config = config
        d = config.d_model
        self.src_embed = nn.Embedding(config.src_vocab, d, padding_idx=config.pad_id)
        self.tgt_embed = (
            self.src_embed
            if config.share_embeddings
            else nn.Embedding(config.tgt_vocab, d, padding_idx=config.pad_id)
        )
        self.register_buffer(
            "positions", sinusoidal_positions(config.max_positions, d), persistent=False
        )
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(config) for _ in range(config.enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(config) for _ in range(config.dec_layers))
        # Pre-norm stacks end un-normalized: one final LayerNorm each (identity for post-norm).
        self.encoder_norm = nn.LayerNorm(d) if config.pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if config.pre_norm else nn.Identity()
        self.output_proj = (
            None if config.share_embeddings else nn.Linear(d, config.tgt_vocab, bias=False)
        )
        self._init_weights()

    def _init_weights(self) -> None:
        """Xavier-uniform linear weights, zero biases, N(0, d^-1/2) embeddings (zero pad row);
        AST's α = 1 + sigmoid(a), a ~ N(0, 1) truncated to ±3, when ``alpha_init`` is None."""
        random_alpha = self.config.alpha_init is None
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=self.config.d_model**-0.5)
                with torch.no_grad():
                    module.weight[self.config.pad_id].zero_()
            elif random_alpha and isinstance(module, Attention) and module.alpha_logit is not None:
                with torch.no_grad():
                    module.alpha_logit.copy_(random_alpha_logit(module.alpha_logit))

    def _embed(self, embedding: nn.Embedding, tokens: Tensor, offset: int) -> Tensor:
        """√d · E[tokens] + PE(offset + t), then dropout."""
        end = offset + tokens.shape[1]
        if end > self.config.max_positions:
            raise LearnableSparsityError(
                f"sequence of length {end} exceeds max_positions={self.config.max_positions}"
            )
        x = embedding(tokens) * math.sqrt(self.config.d_model) + self.positions[offset:end]
        return self.embed_dropout(x)

    def encode(
        self, src: Tensor, attention: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        """Source ids [batch, src_len] → (memory [batch, src_len, d], src_mask [batch, src_len]).

        ``src_mask`` is True on real (non-pad) source tokens.
        """
        src_mask = src != self.config.pad_id
        x = self._embed(self.src_embed, src, 0)
        for i, layer in enumerate(self.encoder):
            x, probs = layer(x, src_mask, attention is not None)
            if attention is not None:
                attention[f"encoder.self.layer{i}"] = probs
        return self.encoder_norm(x), src_mask

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: DecoderCache | None = None,
        *,
        use_cache: bool = False,
        attention: dict[str, Tensor] | None = None,
    ) -> tuple[Tensor, DecoderCache | None]:
        """Target-side logits [batch, tgt_len, tgt_vocab] and the updated cache.

        Full decoding: ``tgt_in`` is the whole shifted target ([bos] + y) and ``cache`` None.
        Incremental decoding: the first call passes the first token(s) with ``use_cache=True``;
        later calls pass only the new token(s) and the returned cache, whose length is the
        position offset of ``tgt_in``. The cache is returned when ``use_cache`` or ``cache``.
        """
        offset = 0 if cache is None else cache.length
        use_cache = use_cache or cache is not None
        x = self._embed(self.tgt_embed, tgt_in, offset)
        new_layers = []
        for i, layer in enumerate(self.decoder):
            layer_cache = None if cache is None else cache.layers[i]
            x, layer_cache, self_probs, context_probs = layer(
                x, memory, src_mask, layer_cache, use_cache, attention is not None
            )
            new_layers.append(layer_cache)
            if attention is not None:
                attention[f"decoder.self.layer{i}"] = self_probs
                attention[f"decoder.context.layer{i}"] = context_probs
        h = self.decoder_norm(x)
        weight = self.tgt_embed.weight if self.output_proj is None else self.output_proj.weight
        logits = h @ weight.T
        return logits, (DecoderCache(tuple(new_layers)) if use_cache else None)

    def forward(
        self, src: Tensor, tgt_in: Tensor, attention: dict[str, Tensor] | None = None
    ) -> Tensor:
        """Teacher-forced logits [batch, tgt_len, tgt_vocab] for ``tgt_in`` = [bos] + y."""
        memory, src_mask = self.encode(src, attention)
        logits, _ = self.decode(tgt_in, memory, src_mask, attention=attention)
        return logits

    def attention_blocks(self) -> dict[str, Attention]:
        """Every attention block by key: "encoder.self.layer{i}", "decoder.self.layer{i}" and
        "decoder.context.layer{i}"."""
        blocks = {f"encoder.self.layer{i}": layer.self_attn for i, layer in enumerate(self.encoder)}
        for i, layer in enumerate(self.decoder):
            blocks[f"decoder.self.layer{i}"] = layer.self_attn
            blocks[f"decoder.context.layer{i}"] = layer.context_attn
        return blocks

    def alphas(self) -> dict[str, Tensor]:
        """Current α per head ([n_heads], detached) of every block; empty unless entmax_alpha."""
        return {
            key: block.alpha
            for key, block in self.attention_blocks().items()
            if block.alpha is not None
        }
