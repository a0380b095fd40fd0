r"""Multi-head attention with a pluggable (possibly sparse) normalizer.

Per head h, with queries Q_h = X W^Q_h, keys K_h = M W^K_h and values V_h = M W^V_h (M = X for
self-attention, the encoder memory for cross-attention) and d_head = d_model / n_heads:

    P_h = π(Q_h K_hᵀ / √d_head; mask),    head_h = P_h V_h,    out = [head_1; …; head_H] W^O

where π normalizes each query's row of scores over the keys: softmax, sparsemax, 1.5-entmax,
α-entmax with one learnable α per head (Correia et al. 2019), or top-k softmax (Zhao et al.
2019). Masks are boolean with True = "may attend"; masked keys get exactly zero probability and a
query with no visible key gets an all-zero row (its head output is 0).

Incremental decoding keeps a ``KVCache`` per attention block: self-attention appends each step's
projected keys/values, cross-attention projects the encoder memory once (a *static* cache).
``KVCache.reorder`` follows the surviving hypotheses in beam search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from learnable_sparsity.core import fused_attention
from learnable_sparsity.core.registry import NORMALIZERS, get

# α = ALPHA_MIN + (ALPHA_MAX − ALPHA_MIN)·sigmoid(w) lies in (ALPHA_MIN, ALPHA_MAX): α → 1 makes
# α-entmax degenerate. A squashed sigmoid rather than a clamp of 1 + sigmoid(w): a clamp has zero
# gradient below logit(0.01), so a head initialised there never moves again.
ALPHA_MIN = 1.01
ALPHA_MAX = 2.0


def alpha_of_logit(w: Tensor) -> Tensor:
    """α = ALPHA_MIN + (ALPHA_MAX − ALPHA_MIN)·sigmoid(w), differentiable everywhere."""
    return ALPHA_MIN + (ALPHA_MAX - ALPHA_MIN) * torch.sigmoid(w)


def logit_of_alpha(alpha: Tensor) -> Tensor:
    """The inverse of :func:`alpha_of_logit`, for α in (ALPHA_MIN, ALPHA_MAX)."""
    return torch.logit((alpha - ALPHA_MIN) / (ALPHA_MAX - ALPHA_MIN))


# AST's a ~ N(0, 1) is truncated to |a| ≤ 3 (99.7% of its mass, α ∈ [1.047, 1.953]): an a near
# logit(0.01) = −4.6 puts α on ALPHA_MIN, where the gradient in the logit nearly vanishes.
ALPHA_INIT_TRUNCATION = 3.0


def alpha_logit_parameter(
    shape: int | tuple[int, ...], alpha_init: float, device: torch.device | None = None
) -> nn.Parameter:
    """A float32 parameter w of ``shape`` with every α = :func:`alpha_of_logit` (w) equal to
    ``alpha_init`` ∈ (ALPHA_MIN, ALPHA_MAX): the learned α of an attention block (one per head)
    or of ``EntmaxAlpha`` (any shape); a ValueError names an ``alpha_init`` outside."""
    if not ALPHA_MIN < alpha_init < ALPHA_MAX:
        raise ValueError(f"alpha_init must lie in ({ALPHA_MIN}, {ALPHA_MAX}), got {alpha_init!r}")
    w = logit_of_alpha(torch.tensor(float(alpha_init), dtype=torch.float64))
    return nn.Parameter(torch.full(shape, float(w), dtype=torch.float32, device=device))


def random_alpha_logit(like: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """AST's random initial α per head, as the logit w (α = :func:`alpha_of_logit` (w)).

    α = 1 + sigmoid(a) with a ~ N(0, 1) truncated to |a| ≤ ``ALPHA_INIT_TRUNCATION``; a tensor
    shaped like ``like`` (e.g. the [n_heads] ``alpha_logit`` parameter), drawn from ``generator``
    or the global RNG (one ``trunc_normal_`` draw of ``like.numel()`` numbers).
    """
    a = nn.init.trunc_normal_(
        torch.empty_like(like),
        a=-ALPHA_INIT_TRUNCATION,
        b=ALPHA_INIT_TRUNCATION,
        generator=generator,
    )
    return logit_of_alpha(1 + torch.sigmoid(a))


# Values of MultiHeadAttention's ``implementation``.
IMPLEMENTATIONS = ("auto", "fused", "materialized")


def _prefix_mask(lengths: Tensor, k_len: int) -> Tensor:
    """[batch, k_len] boolean: True on the first ``lengths[b]`` keys of row b."""
    return torch.arange(k_len, device=lengths.device) < lengths[:, None]


@dataclass(frozen=True)
class KVCache:
    """Projected keys and values of one attention block, each [batch, heads, length, d_head].

    ``static`` marks a cross-attention cache (the encoder memory, projected once and reused at
    every step); a self-attention cache grows by the new keys/values at every step.
    """

    key: Tensor
    value: Tensor
    static: bool = False

    def reorder(self, beam_indices: Tensor) -> KVCache:
        """The cache whose entry b is entry ``beam_indices[b]`` of this one (batch dim 0)."""
        return KVCache(
            self.key.index_select(0, beam_indices),
            self.value.index_select(0, beam_indices),
            self.static,
        )


class AttentionOutput(NamedTuple):
    """Result of ``MultiHeadAttention.forward``.

    ``output`` is [batch, q, d_model]; ``probs`` the attention probabilities [batch, heads, q, k]
    before dropout (differentiable) when requested, else None; ``cache`` the updated cache when
    caching, else None.
    """

    output: Tensor
    probs: Tensor | None
    cache: KVCache | None


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention whose normalizer is chosen by name.

    Args:
        d_model: model width, divisible by ``n_heads``.
        n_heads: number of heads H.
        normalizer: a name in ``learnable_sparsity.core.registry.NORMALIZERS``.
        k: keys kept per query by a normalizer whose argument is k (``"topk"``; ties at the
            threshold are kept as well).
        alpha_init: initial α of every head for a normalizer whose argument is α
            (``"entmax_alpha"``), in (1.01, 2); the parameter is w with α =
            :func:`alpha_of_logit` (w).
        dropout: dropout rate on the attention probabilities.
        bias: whether the four projections have biases.
        implementation: how P V is computed. ``"materialized"``: from the stored scores.
            ``"fused"``: the normalizer's fused kernel (``fused_attention.entmax_attention`` for
            α-entmax), which never stores the scores; a ValueError names the condition a call
            breaks. ``"auto"`` (default): fused where :meth:`fused_unavailable` finds nothing
            against it (CUDA, a head size and dtype the kernel takes, no KV-cache step, no
            probabilities returned, no dropout in training, right-padded keys), else
            materialized. The attribute can be changed after construction.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        normalizer: str = "softmax",
        *,
        k: int = 8,
        alpha_init: float = 1.5,
        dropout: float = 0.0,
        bias: bool = True,
        implementation: str = "auto",
    ) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads), ("k", k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        spec = get(normalizer)
        if not ALPHA_MIN < alpha_init < ALPHA_MAX:
            raise ValueError(
                f"alpha_init must lie in ({ALPHA_MIN}, {ALPHA_MAX}), got {alpha_init!r}"
            )
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"implementation must be one of {', '.join(IMPLEMENTATIONS)}; "
                f"got {implementation!r}"
            )
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")

        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.normalizer = normalizer
        self.k = k
        self.implementation = implementation
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.alpha_logit: nn.Parameter | None = None
        if spec.argument == "alpha":
            self.alpha_logit = alpha_logit_parameter((n_heads,), alpha_init)

    @property
    def alpha(self) -> Tensor | None:
        """Current α of each head (detached, shape [n_heads]) for a learned α; else None."""
        return None if self.alpha_logit is None else self._head_alpha().detach()

    def _head_alpha(self) -> Tensor:
        """α per head, :func:`alpha_of_logit` of the parameter."""
        return alpha_of_logit(self.alpha_logit)

    def _normalize(self, scores: Tensor, mask: Tensor | None) -> Tensor:
        alpha = None if self.alpha_logit is None else self._head_alpha().view(1, -1, 1, 1)
        return NORMALIZERS[self.normalizer](scores, mask, k=self.k, alpha=alpha)

    def fused_unavailable(
        self,
        q: Tensor,
        key_padding_mask: Tensor | None = None,
        *,
        cache: KVCache | None = None,
        return_probs: bool = False,
    ) -> str | None:
        """Why the fused kernel cannot compute a call with projected queries ``q`` [batch, heads,
        q, d_head], or None when it can.

        The right-padding check (``key_padding_mask`` True on a prefix of each row: the kernel
        takes a key length per batch entry) reads the mask's values, a device synchronisation;
        it comes last, after every free check.
        """
        fused = NORMALIZERS[self.normalizer].fused_attention
        if fused is None:
            return f"normalizer {self.normalizer!r} has no fused kernel"
        if cache is not None:
            return "a KV-cache step (keys from earlier steps)"
        if return_probs:
            return "return_probs=True needs the probabilities, which the kernel never stores"
        if self.training and self.dropout.p > 0:
            return f"dropout {self.dropout.p} on the probabilities in training"
        if not fused_attention.usable(q):
            return (
                f"the kernel does not take {q.device.type} tensors of {q.dtype} with head size "
                f"{q.shape[-1]} (CUDA, head sizes {fused_attention.HEAD_SIZES}, Triton)"
            )
        if key_padding_mask is not None and not torch.equal(
            key_padding_mask, _prefix_mask(key_padding_mask.sum(-1), key_padding_mask.shape[-1])
        ):
            return "key_padding_mask is not right padding (True on a prefix of each row)"
        return None

    def _split_heads(self, x: Tensor) -> Tensor:
        """[batch, length, d_model] -> [batch, heads, length, d_head]."""
        return x.view(x.shape[0], x.shape[1], self.n_heads, self.d_head).transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        use_cache: bool = False,
        return_probs: bool = False,
    ) -> AttentionOutput:
        """Attend from ``x`` [batch, q, d_model] to itself or to ``memory`` [batch, k, d_model].

        Args:
            x: queries (and, for self-attention, keys and values).
            memory: encoder states for cross-attention; None for self-attention. Not projected
                again when ``cache`` is a static (cross-attention) cache.
            key_padding_mask: boolean [batch, key_len], True for real keys that may be attended;
                with a self-attention cache it covers the cached keys followed by the new ones.
            causal: self-attention only; the query at absolute position t (counting cached
                steps) sees the keys at positions 0..t.
            cache: keys/values from earlier steps (self) or from the memory (cross).
            use_cache: return a cache even when none was given (first decoding step).
            return_probs: also return the attention probabilities [batch, heads, q, key_len].

        Returns:
            ``AttentionOutput(output, probs, cache)``.
        """
        self._check_inputs(x, memory, causal, cache)
        cross = memory is not None or (cache is not None and cache.static)

        q = self._split_heads(self.q_proj(x))
        if cache is not None and cache.static:
            key, value = cache.key, cache.value
        else:
            source = x if memory is None else memory
            key = self._split_heads(self.k_proj(source))
            value = self._split_heads(self.v_proj(source))
            if cache is not None:
                key = torch.cat([cache.key, key], dim=2)
                value = torch.cat([cache.value, value], dim=2)
        new_cache = KVCache(key, value, static=cross) if use_cache or cache is not None else None

        batch, k_len = x.shape[0], key.shape[2]
        if key_padding_mask is not None and (
            key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (batch, k_len)
        ):
            raise ValueError(
                f"key_padding_mask must be a boolean tensor of shape [{batch}, {k_len}] "
                f"(True = real key), got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
        if self._fused(q, key_padding_mask, cache, return_probs):
            lengths = None if key_padding_mask is None else key_padding_mask.sum(-1)
            fused = NORMALIZERS[self.normalizer].fused_attention
            heads = fused(q, key, value, self._head_alpha(), causal=causal, key_lengths=lengths)
            probs = None
        else:
            scores = (q @ key.transpose(-2, -1)) / math.sqrt(self.d_head)
            probs = self._normalize(scores, self._mask(key_padding_mask, causal, scores))
            heads = self.dropout(probs) @ value
        output = self.out_proj(heads.transpose(1, 2).reshape(x.shape[0], x.shape[1], self.d_model))
        return AttentionOutput(output, probs if return_probs else None, new_cache)

    def _fused(
        self, q: Tensor, key_padding_mask: Tensor | None, cache: KVCache | None, return_probs: bool
    ) -> bool:
        """Whether this call runs the fused kernel (``implementation``; see the class)."""
        if self.implementation == "materialized":
            return False
        reason = self.fused_unavailable(q, key_padding_mask, cache=cache, return_probs=return_probs)
        if reason is not None and self.implementation == "fused":
            raise ValueError(f"implementation='fused' cannot compute this call: {reason}")
        return reason is None

    def _check_inputs(
        self, x: Tensor, memory: Tensor | None, causal: bool, cache: KVCache | None
    ) -> None:
        """Raise a ValueError naming the argument when shapes or modes are inconsistent."""
        for name, tensor in (("x", x), ("memory", memory)):
            if tensor is not None and (tensor.ndim != 3 or tensor.shape[-1] != self.d_model):
                raise ValueError(
                    f"{name} must have shape [batch, length, {self.d_model}], "
                    f"got {tuple(tensor.shape)}"
                )
        batch = x.shape[0]
        if memory is not None and memory.shape[0] != batch:
            raise ValueError(f"memory has batch size {memory.shape[0]} but x has {batch}")
        if cache is not None and cache.key.shape[0] != batch:
            raise ValueError(
                f"cache has batch size {cache.key.shape[0]} but x has {batch} "
                "(reorder it with KVCache.reorder)"
            )
        if causal and (memory is not None or (cache is not None and cache.static)):
            raise ValueError("causal=True applies to self-attention only (memory or static cache)")
        if memory is not None and cache is not None and not cache.static:
            raise ValueError("a self-attention cache cannot be used with memory (cross-attention)")

    @staticmethod
    def _mask(key_padding_mask: Tensor | None, causal: bool, scores: Tensor) -> Tensor | None:
        """Combined boolean mask broadcastable to scores [batch, heads, q, k]; True = attend.

        The q queries are the last q of the k positions, so query i sees keys j ≤ i + (k − q).
        """
        _, _, q_len, k_len = scores.shape
        mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        if causal:
            visible = torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device)
            visible = visible.tril(diagonal=k_len - q_len)
            mask = visible if mask is None else mask & visible
        return mask
