r"""Parallel examples as id lists, token batches of similar length, and padded tensors.

An :data:`Example` is (source ids, target ids) without bos/eos. :func:`token_batches` groups
examples of similar length so that a batch holds at most ``max_tokens`` padded tokens;
:func:`collate` pads a batch into a :class:`Batch` with the shifted target
tgt_in = [bos] + y, tgt_out = y + [eos].
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from learnable_sparsity.data.bpe import BpeModel
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.seq2seq import Seq2Seq

# A parallel example: (source ids, target ids), without bos/eos.
Example = tuple[list[int], list[int]]


class Batch(NamedTuple):
    """Right-padded ids: ``src`` [batch, S]; ``tgt_in`` = [bos] + y and ``tgt_out`` = y + [eos],
    both [batch, T]."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor

    def to(self, device: torch.device | str) -> Batch:
        """The batch on ``device``. A copy from the host to a CUDA device goes through pinned
        memory without waiting for it (``non_blocking``), so that the host does not wait for
        the device's queue to drain before every batch."""
        if torch.device(device).type != "cuda":
            return Batch(*(tensor.to(device) for tensor in self))
        return Batch(*(_pinned(tensor).to(device, non_blocking=True) for tensor in self))


def _pinned(tensor: Tensor) -> Tensor:
    """``tensor`` in pinned (page-locked) host memory, where it is a host tensor."""
    return tensor.pin_memory() if tensor.device.type == "cpu" else tensor


def encode_pairs(bpe: BpeModel, pairs: Sequence[tuple[str, str]]) -> list[Example]:
    """BPE ids of each (source, target) sentence pair, without bos/eos."""
    sources = bpe.encode_ids_batch([s for s, _ in pairs], add_bos=False, add_eos=False)
    targets = bpe.encode_ids_batch([t for _, t in pairs], add_bos=False, add_eos=False)
    return list(zip(sources, targets, strict=True))


def pad(
    rows: Sequence[Sequence[int | bool]],
    fill: int | bool,
    *,
    width: int | None = None,
    dtype: torch.dtype = torch.long,
) -> Tensor:
    """[len(rows), width] with each row left-aligned and ``fill`` after it (width: the longest
    row by default)."""
    width = max(map(len, rows)) if width is None else width
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out


def collate(
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]],
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> Batch:
    """Right-pad source ids (as given) and targets, shifted: tgt_in = [bos]+y, tgt_out = y+[eos]."""
    if len(src) != len(tgt) or not src:
        raise LearnableSparsityError(
            f"collate needs as many targets as sources (at least one), got {len(src)} and "
            f"{len(tgt)}"
        )
    return Batch(
        pad([list(s) for s in src], pad_id),
        pad([[bos_id, *y] for y in tgt], pad_id),
        pad([[*y, eos_id] for y in tgt], pad_id),
    )


def collate_examples(examples: Sequence[Example], indices: Sequence[int], model: Seq2Seq) -> Batch:
    """The padded ``Batch`` of the examples at ``indices``, with the model's special ids."""
    config = model.config
    return collate(
        [examples[i][0] for i in indices],
        [examples[i][1] for i in indices],
        pad_id=config.pad_id,
        bos_id=config.bos_id,
        eos_id=config.eos_id,
    )


def token_batches(
    lengths_src: Sequence[int],
    lengths_tgt: Sequence[int],
    max_tokens: int,
    shuffle_seed: int | None = None,
) -> list[list[int]]:
    """Group sentence indices into batches of similar length with at most ``max_tokens`` padded.

    A batch's padded size is len(batch) · max_i max(src_i, tgt_i) (pass the collated lengths,
    e.g. target length + 1). Indices are sorted by (max length, src, tgt) — ties broken at
    random when ``shuffle_seed`` is given — and cut greedily; a sentence longer than
    ``max_tokens`` alone gets its own batch. With a seed the batch order is shuffled too.
    """
    if len(lengths_src) != len(lengths_tgt):
        raise LearnableSparsityError(
            f"lengths_src has {len(lengths_src)} entries but lengths_tgt {len(lengths_tgt)}"
        )
    if max_tokens < 1:
        raise LearnableSparsityError(f"max_tokens must be positive, got {max_tokens}")
    rng = random.Random(shuffle_seed)
    order = list(range(len(lengths_src)))
    if shuffle_seed is not None:
        rng.shuffle(order)
    order.sort(key=lambda i: (max(lengths_src[i], lengths_tgt[i]), lengths_src[i], lengths_tgt[i]))

    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order:
        length = max(lengths_src[i], lengths_tgt[i])
        if batch and (len(batch) + 1) * max(longest, length) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, length)
    if batch:
        batches.append(batch)
    if shuffle_seed is not None:
        rng.shuffle(batches)
    return batches


def batches_of(examples: Sequence[Example], max_tokens: int, seed: int | None) -> list[list[int]]:
    """Token batches (lists of indices) of ``examples``; +1 for the bos/eos the collate adds."""
    return token_batches(
        [len(s) for s, _ in examples], [len(t) + 1 for _, t in examples], max_tokens, seed
    )
