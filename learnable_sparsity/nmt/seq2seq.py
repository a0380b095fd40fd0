r"""What the training loop and beam search need of a sequence-to-sequence model.

:func:`learnable_sparsity.nmt.training.train` (and its
:func:`~learnable_sparsity.nmt.training.train_step`,
:func:`~learnable_sparsity.nmt.training.validation_nll`),
:func:`learnable_sparsity.nmt.batching.collate_examples` and
:func:`learnable_sparsity.nmt.search.beam_search` / :func:`~learnable_sparsity.nmt.search.translate`
work on any ``nn.Module`` with the members below: the NMT ``Transformer`` and the APE model
(``learnable_sparsity.ape.model.ApeModel``) both have them.

With x the padded source ids [B, S] and y_in = [bos] + y the shifted target [B, T]:

* ``model(x, y_in)`` → logits [B, T, V] of p(y_t | y_<t, x) (teacher forcing);
* ``encode(x)`` → (memory, mask), both batch-first tensors (beam search repeats them per beam
  with ``repeat_interleave(K, 0)``); what they hold is the model's business;
* ``decode(y_new, memory, mask, cache, use_cache=True)`` → (logits of y_new's positions, cache):
  incremental decoding, the first call with ``cache`` None; ``cache.reorder(indices)`` gives the
  cache whose batch entry b is entry ``indices[b]`` (beams follow their parents);
* ``alphas()`` → the current α per head of each α-entmax attention block (empty otherwise).

These are ``typing.Protocol`` classes: a model satisfies them by having the members, without
inheriting from them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn


class Seq2SeqConfig(Protocol):
    """The special ids, output vocabulary size and longest target a model can decode."""

    @property
    def pad_id(self) -> int: ...

    @property
    def bos_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def tgt_vocab(self) -> int | None: ...

    @property
    def max_positions(self) -> int: ...


class DecodingCache(Protocol):
    """Incremental-decoding state that follows the beams."""

    def reorder(self, beam_indices: Tensor, /) -> DecodingCache:
        """The cache whose batch entry b is entry ``beam_indices[b]`` of this one."""
        ...


@runtime_checkable
class Seq2Seq(Protocol):
    """An encoder-decoder ``nn.Module`` that :func:`~learnable_sparsity.nmt.training.train` and
    :func:`~learnable_sparsity.nmt.search.beam_search` can train and search (see the module
    docstring).

    The ``nn.Module`` members listed are those the loop and the search call.
    """

    training: bool

    @property
    def config(self) -> Seq2SeqConfig: ...

    def __call__(self, src: Tensor, tgt_in: Tensor, /) -> Tensor: ...

    def encode(self, src: Tensor, /) -> tuple[Tensor, Tensor]: ...

    def decode(
        self,
        tokens: Tensor,
        memory: Tensor,
        mask: Tensor,
        cache: Any,
        /,
        *,
        use_cache: bool,
    ) -> tuple[Tensor, DecodingCache | None]: ...

    def alphas(self) -> dict[str, Tensor]: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> Any: ...
