r"""The core normalizers as ``transformers`` attention implementations, selected by name.

After :func:`register`, any ``transformers`` model whose attention modules dispatch through
``ALL_ATTENTION_FUNCTIONS`` (BERT and its relatives, and most 5.x models) runs with

    BertConfig(..., attn_implementation=name)    or    model.set_attn_implementation(name)

for ``name`` a normalizer of ``learnable_sparsity.core.registry.NORMALIZERS`` ("softmax",
"sparsemax", "entmax15", "entmax_alpha", "topk" and any registered before :func:`register` is
called). An ``EncoderDecoderModel``
built from a config resets its sub-configs' attention to the default unless the joint config names
it: ``EncoderDecoderConfig.from_encoder_decoder_configs(enc, dec, attn_implementation=name)``.

Per head h, with the query, key and value states Q_h, K_h, V_h the model has projected (and
cached) and its ``scaling`` c (1/√d_head for BERT):

    S_h = c · Q_h K_hᵀ + B,    P_h = π(S_h; visible),    O_h = Dropout(P_h) V_h

where π is the named normalizer applied to each query's row of scores, ``visible`` the keys the
model's mask lets the query see and B the finite part of an additive mask (zero for the masks
registered here). Masked keys get exactly zero probability, a query with no visible key gets an
all-zero row, and π never sees the masking values themselves: a float mask's −inf or
``finfo.min`` entries are turned into a boolean mask before normalizing, so they cannot move a
sparsemax/entmax threshold (or overflow (α−1)·(x − max x)).

The contract, read from ``transformers`` 5.23 (``eager_attention_forward`` and its callers in
``models/bert/modeling_bert.py``, ``masking_utils.py``):

* ``fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs)`` with
  query [B, H, q, d], key and value [B, H_kv, k, d] (H_kv < H: grouped-query attention) and
  ``dropout`` already 0 in eval mode; it returns (attn_output [B, q, H, d], attn_weights
  [B, H, q, k]). The weights are what ``output_attentions=True`` records.
* The mask the model passes is built by the *mask* function registered under the same name in
  ``AttentionMaskInterface``; for a name with none, ``create_causal_mask`` and
  ``create_bidirectional_mask`` silently return None, dropping padding and causality. So
  :func:`register` also registers :func:`additive_attention_mask`: eager attention's float
  [B, 1, q, k] mask (0 = may attend, ``finfo(dtype).min`` = masked), or None when every key is
  visible (no padding, no causality). BERT's encoder self-attention and a decoder's
  cross-attention get padding masks, a decoder's (``is_decoder=True``) self-attention the causal
  mask (∧ padding), never skipped: transformers' "sdpa" mask returns None for a plain causal
  mask and relies on SDPA's ``is_causal`` flag. Eager's form, not a boolean one, because some
  models add the mask to scores in code of their own that does not dispatch by name
  (BigBird-Pegasus's encoder): a boolean mask there would be added as 1/0.
* A model may pass a ready 4D mask instead (a caller's own 4D ``attention_mask`` reaches the
  attention function unchanged): boolean (True = attend) or additive float, where entries at or
  below half the dtype's most negative value (``finfo.min``, as transformers' eager masks, or
  −inf) mark masked keys and other entries are added to the scores like a bias.
* With no mask at all, the keys are all visible unless the query is causal (the ``is_causal``
  keyword, else the module's ``is_causal`` attribute, as SDPA decides) and q > 1: then query i
  of the last q positions sees keys j ≤ i + (k − q).

The argument of a normalizer that takes one (``Normalizer.argument``) lives on the model, not in
the registry: a learned α per head ("entmax_alpha") or k ("topk"):

* α: :func:`add_head_alphas` adds a parameter ``alpha_logit`` [n_heads] to each attention module
  (α = ``alpha_of_logit`` (w) ∈ (1.01, 2), as in the core and NMT models; a fixed initial α or
  AST's random one), which the attention function reads from ``module``.
* k: ``module.topk_k`` when the module has it, else ``module.config.topk_k`` (the model config,
  e.g. ``BertConfig(topk_k=8)``, so k is saved with the config; the per-module attribute can
  give one layer a different k). Ties at the k-th score are kept, as in the core.

Supported model score terms: logit soft-capping (``softcap``, Gemma 2), T5's relative-position
``position_bias`` and attention sinks (``s_aux``, GPT-OSS) as :func:`sparse_attention_forward`
states them; sliding windows come in the mask. Any other argument a model passes that eager
attention would use raises LearnableSparsityError naming it and the model type
(:func:`check_attention_arguments`) rather than being dropped.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from learnable_sparsity.extras import needs_extra

with needs_extra("hf", __name__):
    from transformers import AttentionInterface, AutoConfig, PreTrainedModel
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.modeling_utils import load_state_dict
    from transformers.utils.generic import TransformersKwargs

from learnable_sparsity.core.attention import (
    ALPHA_MAX,
    ALPHA_MIN,
    alpha_logit_parameter,
    alpha_of_logit,
    random_alpha_logit,
)
from learnable_sparsity.core.registry import NORMALIZERS
from learnable_sparsity.errors import LearnableSparsityError

# An additive float mask entry v marks a masked key when v ≤ _MASKED_FRACTION_OF_MIN · finfo.min.
# transformers' eager masks use exactly finfo(dtype).min (and a sum of two such masks, −inf); no
# real score bias comes within a factor of 2 of the most negative float, so the cut separates the
# two without depending on how a model spelt "masked".
_MASKED_FRACTION_OF_MIN = 0.5

AttentionFunction = Callable[..., tuple[Tensor, Tensor]]


# --------------------------------------------------------------------------- masks


def additive_attention_mask(**kwargs: Any) -> Tensor | None:
    """transformers' eager mask ([B, 1, q, k]: 0 = may attend, ``finfo(dtype).min`` = masked).

    The mask function registered for every normalizer of ``NORMALIZERS``: ``eager_mask``,
    which never skips a causal mask (the attention functions here have no ``is_causal`` kernel
    flag to fall back on) and which model code outside the attention interface adds to its
    scores as it does under "eager". A bidirectional mask without padding may be None.
    """
    return eager_mask(**kwargs)


def _visible_and_bias(
    attention_mask: Tensor | None, k_len: int
) -> tuple[Tensor | None, Tensor | None]:
    """(boolean mask True = visible, finite additive bias or None) from the model's mask."""
    if attention_mask is None:
        return None, None
    if not isinstance(attention_mask, Tensor):
        raise LearnableSparsityError(
            "attention_mask must be a boolean or float tensor or None, got "
            f"{type(attention_mask).__name__} (block masks are not supported)"
        )
    # A static cache's mask can be longer than the keys seen so far (as eager attention slices).
    attention_mask = attention_mask[..., :k_len]
    if attention_mask.dtype == torch.bool:
        return attention_mask, None
    if not attention_mask.is_floating_point():
        raise LearnableSparsityError(
            f"attention_mask must be boolean (True = attend) or additive float, got "
            f"{attention_mask.dtype}"
        )
    floor = _MASKED_FRACTION_OF_MIN * torch.finfo(attention_mask.dtype).min
    visible = attention_mask > floor
    return visible, attention_mask.masked_fill(~visible, 0.0)


def _is_causal(module: nn.Module, is_causal: bool | None) -> bool:
    return bool(getattr(module, "is_causal", False) if is_causal is None else is_causal)


def _causal_mask(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """[q, k]: the q queries are the last q of the k positions; query i sees j ≤ i + (k − q)."""
    visible = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    return visible.tril(diagonal=k_len - q_len)


# --------------------------------------------------------------------------- per-module settings


def _head_alpha(module: nn.Module, n_heads: int) -> Tensor:
    """α per head, shaped [1, H, 1, 1], from the module's ``alpha_logit`` parameter."""
    alpha_logit = getattr(module, "alpha_logit", None)
    if not isinstance(alpha_logit, Tensor):
        raise LearnableSparsityError(
            f"entmax_alpha attention needs a learnable α per head on {type(module).__name__}: "
            "call learnable_sparsity.hf.attention.add_head_alphas(model) after building the model"
        )
    if alpha_logit.shape != (n_heads,):
        raise LearnableSparsityError(
            f"{type(module).__name__}.alpha_logit has shape {tuple(alpha_logit.shape)}, "
            f"expected ({n_heads},): one α per query head"
        )
    return alpha_of_logit(alpha_logit).view(1, n_heads, 1, 1)


def _topk_k(module: nn.Module) -> int:
    """k for top-k attention: ``module.topk_k``, else ``module.config.topk_k``."""
    k = getattr(module, "topk_k", None)
    if k is None:
        k = getattr(getattr(module, "config", None), "topk_k", None)
    if k is None:
        raise LearnableSparsityError(
            f"topk attention needs k: set topk_k in the model config (e.g. BertConfig(topk_k=8)) "
            f"or as an attribute of {type(module).__name__}"
        )
    return k


def _normalize(module: nn.Module, normalizer: str, scores: Tensor, mask: Tensor | None) -> Tensor:
    """π(scores; mask) with the argument π takes read from ``module`` (α per head, or k)."""
    spec = NORMALIZERS[normalizer]
    alpha = _head_alpha(module, scores.shape[1]) if spec.argument == "alpha" else None
    k = _topk_k(module) if spec.argument == "k" else None
    return spec(scores, mask, k=k, alpha=alpha)


# --------------------------------------------------------------------------- model arguments

# Keyword arguments that transformers passes to every attention function for other kernels
# (flash attention's packed-sequence bookkeeping, output and cache flags) and that eager
# attention ignores, so that ignoring them here changes nothing. ``sliding_window`` is one of
# them when the model passes a mask: transformers builds the window into the mask with the mask
# function (``sliding_window_causal_mask_function``), and eager attention reads only the mask.
KERNEL_ONLY_ARGUMENTS: frozenset[str] = frozenset(TransformersKwargs.__annotations__) | {
    "sliding_window",
    "use_cache",
    "past_key_values",
    "cache_position",
    "layer_idx",
}


def _model_type(module: nn.Module) -> str:
    return str(getattr(getattr(module, "config", None), "model_type", type(module).__name__))


def _eager_parameters(module: nn.Module) -> frozenset[str] | None:
    """The named parameters of the eager attention function of ``module``'s model file, if any."""
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if not callable(eager):
        return None
    return frozenset(inspect.signature(eager).parameters)


def check_attention_arguments(
    module: nn.Module, kwargs: dict[str, Any], attention_mask: Tensor | None, k_len: int
) -> None:
    """Refuse a keyword argument that the model's eager attention uses and this one would drop.

    ``kwargs`` are the arguments :func:`sparse_attention_forward` does not name. Accepted: None
    values, :data:`KERNEL_ONLY_ARGUMENTS`, and arguments that the eager attention function of
    the module's model file (``eager_attention_forward``) does not name either, so that eager
    attention too drops them in its ``**kwargs`` (e.g. the ``decoder_input_ids`` Pegasus
    forwards); with no such function, only :data:`KERNEL_ONLY_ARGUMENTS`. ``sliding_window`` W
    passes only when the window is in the model's mask or cannot cut (k ≤ W). Anything else
    (DeepSeek's sparse ``indices``, Inkling's per-token ``sinks``, ...) raises
    LearnableSparsityError naming the argument and the model type.
    """
    window = kwargs.get("sliding_window")
    if window is not None and attention_mask is None and k_len > window:
        raise LearnableSparsityError(
            f"sliding_window={window} from a {_model_type(module)} model came without an "
            f"attention mask that carries it ({k_len} keys): the window cannot be applied"
        )
    eager = _eager_parameters(module)
    unknown = sorted(
        name
        for name, value in kwargs.items()
        if value is not None
        and name not in KERNEL_ONLY_ARGUMENTS
        and (eager is None or name in eager)
    )
    if unknown:
        raise LearnableSparsityError(
            f"{_model_type(module)} attention ({type(module).__name__}) passes "
            f"{', '.join(unknown)}, which learnable_sparsity's attention does not support "
            "(use attn_implementation='eager' for this model)"
        )


def _with_sink_column(
    module: nn.Module, scores: Tensor, visible: Tensor | None, sinks: Tensor
) -> tuple[Tensor, Tensor | None]:
    """[B, H, q, k+1] scores with the sink logit s_h as the last key, always visible."""
    n_heads = scores.shape[1]
    if sinks.shape != (n_heads,):
        raise LearnableSparsityError(
            f"s_aux of a {_model_type(module)} model has shape {tuple(sinks.shape)}, expected "
            f"({n_heads},): one sink logit per query head"
        )
    column = sinks.to(scores.dtype).view(1, n_heads, 1, 1).expand(*scores.shape[:-1], 1)
    scores = torch.cat([scores, column], dim=-1)
    if visible is None:
        return scores, None
    visible = visible.expand(*scores.shape[:-1], scores.shape[-1] - 1)
    return scores, torch.cat([visible, visible.new_ones(*visible.shape[:-1], 1)], dim=-1)


# --------------------------------------------------------------------------- attention function


# The calls require_attention_interface is counting (None: none is).
_CALLS: ContextVar[list[str] | None] = ContextVar("attention_calls", default=None)


def sparse_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    normalizer: str,
    is_causal: bool | None = None,
    softcap: float | None = None,
    position_bias: Tensor | None = None,
    s_aux: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """Attention with the core ``normalizer``: (output [B, q, H, d], probabilities [B, H, q, k]).

    S = scaling · Q Kᵀ (+ the finite part of an additive mask), P = π(S; visible keys),
    output = Dropout_p(P) V with p = ``dropout`` when ``module.training`` (eager attention's
    placement). The returned probabilities are P before dropout (the core's convention; eager
    attention returns them after dropout, which differs in training mode only). Keys and values
    with fewer heads than the query (grouped-query attention) are repeated per group.

    The model's own score terms, as its eager attention applies them: ``softcap`` c_s (Gemma 2)
    S ← c_s·tanh(S / c_s) before the masks; ``position_bias`` (T5's relative positions) added to
    S; ``s_aux`` (attention sinks, GPT-OSS: one logit s_h per query head) an extra key column of
    score s_h that every query sees and that has no value: P = π([S, s_h]) without its last
    column (for "topk" the sink is one of the k). The keyword arguments only other kernels read
    (:data:`KERNEL_ONLY_ARGUMENTS`) are unused; any other non-None one raises
    LearnableSparsityError naming it and the model type (see :func:`check_attention_arguments`).
    """
    check_attention_arguments(module, kwargs, attention_mask, key.shape[2])
    if (calls := _CALLS.get()) is not None:
        calls.append(normalizer)
    if normalizer not in NORMALIZERS:
        raise LearnableSparsityError(
            f"normalizer must be one of {', '.join(NORMALIZERS)}; got {normalizer!r}"
        )
    n_heads, q_len, k_len = query.shape[1], query.shape[2], key.shape[2]
    if n_heads != key.shape[1]:
        if n_heads % key.shape[1] != 0:
            raise LearnableSparsityError(
                f"{n_heads} query heads cannot share {key.shape[1]} key/value heads"
            )
        groups = n_heads // key.shape[1]
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5

    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if position_bias is not None:
        scores = scores + position_bias
    visible, bias = _visible_and_bias(attention_mask, k_len)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if visible is None and q_len > 1 and _is_causal(module, is_causal):
        visible = _causal_mask(q_len, k_len, scores.device)
    if s_aux is not None:
        scores, visible = _with_sink_column(module, scores, visible, s_aux)
    probs = _normalize(module, normalizer, scores, visible)
    if s_aux is not None:
        probs = probs[..., :k_len]  # the sink's probability leaves the row with no value
    dropped = F.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(dropped.to(value.dtype), value)
    return output.transpose(1, 2).contiguous(), probs


@functools.cache
def attention_function(normalizer: str) -> AttentionFunction:
    """The function :func:`register` registers for one normalizer: :func:`sparse_attention_forward`
    with it (a named function, for tracebacks; the same object at every call)."""

    def attention(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        return sparse_attention_forward(*args, normalizer=normalizer, **kwargs)

    attention.__name__ = attention.__qualname__ = f"{normalizer}_attention_forward"
    attention.__doc__ = f"{sparse_attention_forward.__doc__}\n\n    Normalizer: {normalizer}."
    return attention


# --------------------------------------------------------------------------- registration


def _register_once(interface: type, name: str, fn: Callable[..., Any]) -> None:
    """Register ``fn`` under ``name`` unless it is there; refuse to replace another's function."""
    current = interface().get(name)
    if current is fn:
        return
    if current is not None and getattr(current, "__module__", None) != __name__:
        raise LearnableSparsityError(
            f"{interface.__name__} already has a {name!r} that is not this module's "
            f"({getattr(current, '__module__', '?')}.{getattr(current, '__qualname__', '?')})"
        )
    interface.register(name, fn)


def register() -> None:
    """Register every normalizer of ``NORMALIZERS`` with transformers; idempotent.

    Each name gets its attention function (``AttentionInterface``) and
    :func:`additive_attention_mask` (``AttentionMaskInterface``), without which the model would
    build no mask at all for the name. Importing the package ``learnable_sparsity.hf`` calls it
    (so does any import of this module, which imports the package first): no model can ask for a
    name between the import and the registration. Calling it again is a no-op; a name already
    taken by a function from elsewhere raises LearnableSparsityError rather than being
    overwritten.
    """
    for name in NORMALIZERS:
        _register_once(AttentionInterface, name, attention_function(name))
        _register_once(AttentionMaskInterface, name, additive_attention_mask)


# --------------------------------------------------------------------------- learnable α


def query_heads(module: nn.Module) -> int | None:
    """The query heads of ``module`` if it is an attention module that calls the attention
    function, else None.

    transformers 5 writes such a module with a float ``scaling`` and an ``is_causal`` flag, and
    keeps its head count in one of three places: ``num_attention_heads`` (BERT, RoBERTa, ELECTRA),
    ``num_heads`` (BART, Whisper) or only in its config (``config.num_attention_heads``: Llama,
    Mistral, Qwen, where grouped-query attention keeps fewer key/value heads, and α is per query
    head).
    """
    if not isinstance(getattr(module, "scaling", None), float) or not hasattr(module, "is_causal"):
        return None
    config = getattr(module, "config", None)
    for heads in (
        getattr(module, "num_attention_heads", None),
        getattr(module, "num_heads", None),
        getattr(config, "num_attention_heads", None),
    ):
        if isinstance(heads, int):
            return heads
    return None


def attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The attention modules of ``model`` by name (those :func:`query_heads` knows).

    In BERT these are ``BertSelfAttention`` in every layer and, in a decoder with
    cross-attention, ``BertCrossAttention``; in Llama ``LlamaAttention``.
    """
    return {
        name: module for name, module in model.named_modules() if query_heads(module) is not None
    }


def add_head_alphas(
    model: nn.Module,
    alpha_init: float | None = 1.5,
    *,
    generator: torch.Generator | None = None,
) -> dict[str, nn.Parameter]:
    """Add a learnable α per head (``alpha_logit`` [n_heads]) to every attention module.

    α = ALPHA_MIN + (ALPHA_MAX − ALPHA_MIN)·sigmoid(w) ∈ (1.01, 2) as in the core attention;
    w starts at ``logit_of_alpha(alpha_init)`` for every head, or, with ``alpha_init=None``, at
    AST's random α = 1 + sigmoid(a), a ~ N(0, 1) truncated to ±3 (drawn from ``generator`` or
    the global RNG, one draw per module in ``named_modules`` order). The parameters are fp32 on
    the device of each module's other parameters; create the optimizer afterwards. Returns the
    new parameters by module name. Raises LearnableSparsityError if the model has no attention
    module (see :func:`attention_modules`), if one of them does not run "entmax_alpha" (its α
    would never be read, nor get a gradient) or already has an ``alpha_logit``.
    """
    if alpha_init is not None and not ALPHA_MIN < alpha_init < ALPHA_MAX:
        raise LearnableSparsityError(
            f"alpha_init must lie in ({ALPHA_MIN}, {ALPHA_MAX}), got {alpha_init!r}"
        )
    modules = attention_modules(model)
    if not modules:
        raise LearnableSparsityError(
            f"{type(model).__name__} has no attention module (a module with a float scaling, "
            "is_causal and a head count: num_attention_heads, num_heads or "
            "config.num_attention_heads)"
        )
    for name, module in modules.items():
        _require_learned_alpha(model, name, module)
    added: dict[str, nn.Parameter] = {}
    for name, module in modules.items():
        if hasattr(module, "alpha_logit"):
            raise LearnableSparsityError(f"{name} already has an alpha_logit")
        device = next(module.parameters(), torch.empty(0)).device
        if alpha_init is None:
            w = torch.empty(query_heads(module), dtype=torch.float32, device=device)
            module.alpha_logit = nn.Parameter(random_alpha_logit(w, generator))
        else:
            module.alpha_logit = alpha_logit_parameter((query_heads(module),), alpha_init, device)
        added[name] = module.alpha_logit
    return added


def _implementation(model: nn.Module, module: nn.Module) -> str | None:
    """The attention implementation ``module`` dispatches to: its config's, else the model's."""
    for holder in (module, model):
        name = getattr(getattr(holder, "config", None), "_attn_implementation", None)
        if name is not None:
            return name
    return None


def _require_learned_alpha(model: nn.Module, name: str, module: nn.Module) -> None:
    implementation = _implementation(model, module)
    if implementation != "entmax_alpha":
        raise LearnableSparsityError(
            f"{name or type(model).__name__} runs attention {implementation!r}, which reads no "
            "learned α: build the model with attn_implementation='entmax_alpha' (or call "
            "model.set_attn_implementation('entmax_alpha')) before add_head_alphas"
        )


def require_registered(name: str) -> None:
    """Raise unless ``name`` is a normalizer of ``NORMALIZERS`` registered with transformers."""
    if name not in NORMALIZERS:
        raise LearnableSparsityError(
            f"attention {name!r} is not one of learnable_sparsity's: {', '.join(NORMALIZERS)}"
        )
    if AttentionInterface().get(name) is not attention_function(name):
        raise LearnableSparsityError(
            f"attention {name!r} is not registered with transformers: call "
            "learnable_sparsity.hf.attention.register() before building or loading the model"
        )


def head_alphas(model: nn.Module) -> dict[str, Tensor]:
    """Current α per head ([n_heads], detached) of every module with an ``alpha_logit``."""
    return {
        name: alpha_of_logit(module.alpha_logit).detach()
        for name, module in model.named_modules()
        if isinstance(getattr(module, "alpha_logit", None), Tensor)
    }


# --------------------------------------------------------------------------- save and reload

# The config attribute (config.json key) that names a saved model's attention.
SAVED_ATTENTION_KEY = "sparse_attention"


def require_attention_interface(model: nn.Module, *inputs: Any, **named: Any) -> None:
    """Raise unless one forward pass of ``model(*inputs, **named)`` (without gradients) calls
    this module's attention function. A model that does not (BLOOM, DeBERTa, Longformer, XLM,
    ...) computes its own attention whatever ``attn_implementation`` names, so one of ours is
    accepted and silently ignored: dense attention under a sparse name. Neither transformers'
    ``is_backend_compatible()`` (False for BART, which calls it) nor the modules' shape
    (:func:`attention_modules`: none found in Doge or LayoutLM, which call it) can tell, so the
    check runs the model."""
    calls: list[str] = []
    token = _CALLS.set(calls)
    try:
        with torch.no_grad():
            model(*inputs, **named)
    finally:
        _CALLS.reset(token)
    if not calls:
        config = getattr(model, "config", None)
        raise LearnableSparsityError(
            f"{type(model).__name__} ({getattr(config, 'model_type', '?')}) computes its own "
            "attention instead of calling transformers' attention interface: "
            f"attn_implementation={getattr(config, '_attn_implementation', None)!r} is ignored"
        )


def save_sparse(model: PreTrainedModel, directory: str | os.PathLike, **kwargs: Any) -> None:
    """``model.save_pretrained(directory, **kwargs)`` that keeps the sparse attention.

    transformers does not save the attention implementation (a plain reload runs "sdpa"), so
    the name goes into the config as ``sparse_attention``; the learned α per head
    (``alpha_logit``) are model parameters and go into the weights. Any directory
    ``save_pretrained`` writes (a ``push_to_hub`` one included) reloads with
    :func:`load_sparse`. Raises LearnableSparsityError if the model's attention is not one of
    ``NORMALIZERS``.
    """
    name = model.config._attn_implementation
    require_registered(name)
    setattr(model.config, SAVED_ATTENTION_KEY, name)
    model.save_pretrained(directory, **kwargs)


def _saved_alphas(directory: Path) -> dict[str, Tensor]:
    """The ``alpha_logit`` tensors of the safetensors weights in ``directory``, by key."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise LearnableSparsityError(f"{directory} has no *.safetensors weights")
    return {
        key: tensor
        for file in files
        for key, tensor in load_state_dict(file).items()
        if key.endswith(".alpha_logit")
    }


def load_sparse(
    model_class: type[PreTrainedModel], directory: str | os.PathLike, **kwargs: Any
) -> PreTrainedModel:
    """``model_class.from_pretrained(directory, **kwargs)`` with the attention it was saved with.

    Reads the name :func:`save_sparse` put in the config, registers the names
    (:func:`register`), loads the model with ``attn_implementation=name`` and, when the weights
    hold learned α, adds them (:func:`add_head_alphas`) and loads their saved values: the
    reloaded model computes what the saved one did. ``directory`` is a local directory (a
    downloaded hub snapshot included) and ``model_class`` the class that saved it or an Auto
    class that resolves to it (``AutoModelForCausalLM``, ...). Raises
    LearnableSparsityError if the config names no sparse attention or the saved α and the
    model's attention modules differ.
    """
    directory = Path(directory)
    register()
    config = AutoConfig.from_pretrained(directory)
    name = getattr(config, SAVED_ATTENTION_KEY, None)
    if name is None:
        raise LearnableSparsityError(
            f"{directory / 'config.json'} has no {SAVED_ATTENTION_KEY!r}: save the model with "
            "learnable_sparsity.hf.attention.save_sparse"
        )
    require_registered(name)
    model = model_class.from_pretrained(directory, attn_implementation=name, **kwargs)
    alphas = _saved_alphas(directory)
    if alphas:
        added = add_head_alphas(model)
        expected = {f"{module}.alpha_logit" for module in added}
        if set(alphas) != expected:
            raise LearnableSparsityError(
                f"{directory}: saved α {sorted(set(alphas) - expected)} and the model's "
                f"attention modules {sorted(expected - set(alphas))} differ"
            )
        with torch.no_grad():
            for module, parameter in added.items():
                parameter.copy_(alphas[f"{module}.alpha_logit"])
    return model
