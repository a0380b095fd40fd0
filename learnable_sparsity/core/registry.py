r"""The attention normalizers by name: the one registry every model, table and benchmark reads.

A :class:`Normalizer` is what the rest of the project needs to know about one π:

* ``name`` — the value of a normalizer setting (``MultiHeadAttention(normalizer=…)``,
  ``TransformerConfig.normalizer``, the APE model's ``attention``, the Hugging Face
  ``attn_implementation``, params ``nmt.variants``), and the key of its results;
* ``function`` — π itself, ``function(scores, [argument,] dim=-1, mask=None)``;
* ``argument`` — the one extra input π takes, if any: ``"k"`` (the keys kept per query, a setting
  of the model) or ``"alpha"`` (α, which a model *learns*: each attention block that uses a
  normalizer with ``argument="alpha"`` owns a learnable α per head, see
  ``learnable_sparsity.core.attention``);
* ``label`` — its display name in tables;
* ``fused_attention`` — for a normalizer with ``argument="alpha"``, optionally a function
  ``(q, k, v, alpha, *, causal, key_lengths) → π(QKᵀ/√d) V`` that computes attention without
  storing the scores (``fused_attention.entmax_attention``), which ``MultiHeadAttention`` runs
  where it applies;
* ``published`` — its row name (``system``) in the published tables of
  ``learnable_sparsity/reporting/paper_results.yaml`` that report it, by table id; a table that
  does not report it has no entry, and the reproduced tables then show no published number.

The registry imports no torch (the reporting package reads labels and published names without
it): the built-in functions are imported at their first call. The order of :data:`NORMALIZERS`
is the row order of the tables (EST Table 4's). A new normalizer
is its function plus one :func:`register` call (or one entry below), and its name in the params.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch import Tensor

Argument = Literal["k", "alpha"]
ARGUMENTS: tuple[Argument, ...] = ("k", "alpha")

# Published tables (ids of reporting/paper_results.yaml) that name the normalizers' rows.
AST_BLEU = "ast_mt_bleu"  # AST Table 4.1: BLEU on four corpora
EST_TABLE_4 = "est_sparse_attention_speed"  # EST Table 4: BLEU de-en and speeds
AST_SPEED = "ast_training_speed"  # AST's in-text training speeds relative to softmax
AST_POSITIONAL_HEADS = "ast_positional_heads"
AST_BPE_HEADS = "ast_bpe_merging_heads"


@dataclass(frozen=True)
class Normalizer:
    """One attention normalizer π: its name, function, extra argument, label and published rows
    (the module docstring says what each field is for)."""

    name: str
    function: Callable[..., Tensor]
    label: str
    argument: Argument | None = None
    published: Mapping[str, str] = field(default_factory=dict)
    fused_attention: Callable[..., Tensor] | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"a normalizer name must be an identifier, got {self.name!r}")
        if self.argument is not None and self.argument not in ARGUMENTS:
            raise ValueError(
                f"normalizer {self.name!r}: argument must be one of {ARGUMENTS} or None, "
                f"got {self.argument!r}"
            )
        if self.fused_attention is not None and self.argument != "alpha":
            raise ValueError(
                f"normalizer {self.name!r}: a fused attention takes α, so argument must be "
                f"'alpha', got {self.argument!r}"
            )
        object.__setattr__(self, "published", MappingProxyType(dict(self.published)))

    def __call__(
        self,
        scores: Tensor,
        mask: Tensor | None = None,
        *,
        k: int | None = None,
        alpha: float | Tensor | None = None,
    ) -> Tensor:
        """π(scores; mask) over the last dim, given the argument π takes (``k`` or ``alpha``;
        the other one is ignored, so a caller may pass whatever it holds)."""
        if self.argument is None:
            return self.function(scores, mask=mask)
        value = {"k": k, "alpha": alpha}[self.argument]
        if value is None:
            raise ValueError(f"normalizer {self.name!r} needs {self.argument}, got None")
        return self.function(scores, value, mask=mask)


def _deferred(module: str, name: str) -> Callable[..., Tensor]:
    """``module.name``, imported at the first call."""

    @functools.cache
    def resolve() -> Callable[..., Tensor]:
        return getattr(importlib.import_module(module), name)

    def call(*args: Any, **kwargs: Any) -> Tensor:
        return resolve()(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``{module}.{name}`` (imported at the first call)."
    return call


_NORMALIZERS_MODULE = "learnable_sparsity.core.normalizers"
_REGISTRY: dict[str, Normalizer] = {}
# Read-only view of the registry, in registration order; change it with :func:`register`.
NORMALIZERS: Mapping[str, Normalizer] = MappingProxyType(_REGISTRY)


def register(normalizer: Normalizer) -> Normalizer:
    """Add ``normalizer`` to :data:`NORMALIZERS` (after the others); refuses a name in use."""
    if normalizer.name in _REGISTRY:
        raise ValueError(f"a normalizer named {normalizer.name!r} is already registered")
    _REGISTRY[normalizer.name] = normalizer
    return normalizer


@contextmanager
def registered(normalizer: Normalizer) -> Iterator[Normalizer]:
    """:func:`register` ``normalizer`` for the duration of the block (tests, experiments)."""
    register(normalizer)
    try:
        yield normalizer
    finally:
        del _REGISTRY[normalizer.name]


def get(name: str) -> Normalizer:
    """The registered normalizer ``name``; a ValueError naming the choices otherwise."""
    if name not in _REGISTRY:
        raise ValueError(f"normalizer must be one of {', '.join(_REGISTRY)}; got {name!r}")
    return _REGISTRY[name]


for _normalizer in (
    Normalizer(
        "softmax",
        _deferred(_NORMALIZERS_MODULE, "softmax"),
        "Transformer (softmax)",
        published={
            AST_BLEU: "softmax",
            EST_TABLE_4: "Transformer (softmax)",
            AST_POSITIONAL_HEADS: "softmax",
            AST_BPE_HEADS: "softmax",
        },
    ),
    Normalizer(
        "sparsemax",
        _deferred(_NORMALIZERS_MODULE, "sparsemax"),
        "Sparsemax",
        published={EST_TABLE_4: "Sparsemax (Martins & Astudillo, 2016)"},
    ),
    Normalizer(
        "entmax15",
        _deferred(_NORMALIZERS_MODULE, "entmax15"),
        "1.5-entmax",
        published={
            AST_BLEU: "1.5-entmax",
            EST_TABLE_4: "Entmax-1.5 (Peters et al., 2019)",
            AST_SPEED: "1.5-entmax",
            AST_POSITIONAL_HEADS: "1.5-entmax",
            AST_BPE_HEADS: "1.5-entmax",
        },
    ),
    Normalizer(
        "entmax_alpha",
        _deferred(_NORMALIZERS_MODULE, "entmax"),
        "α-entmax",
        argument="alpha",
        fused_attention=_deferred("learnable_sparsity.core.fused_attention", "entmax_attention"),
        published={
            AST_BLEU: "alpha-entmax (learned alpha per head)",
            EST_TABLE_4: "Entmax-alpha (Correia et al., 2019)",
            AST_SPEED: "alpha-entmax",
            AST_POSITIONAL_HEADS: "alpha-entmax",
            AST_BPE_HEADS: "alpha-entmax",
        },
    ),
    Normalizer(
        "topk",
        _deferred(_NORMALIZERS_MODULE, "topk_softmax"),
        "top-k",
        argument="k",
        published={EST_TABLE_4: "Proposal (top-k before softmax)"},
    ),
):
    register(_normalizer)
