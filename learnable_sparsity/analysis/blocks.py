"""Names of the Transformer's attention blocks and of the head roles (no torch needed).

A block key is ``<attention type>.layer<i>``, e.g. ``encoder.self.layer3``, as the Transformer
of ``learnable_sparsity.nmt.model`` names its attention maps and α values; layers are 0-based.
"""

from __future__ import annotations

import re

from learnable_sparsity.errors import LearnableSparsityError

ATTENTION_TYPES: tuple[str, ...] = ("encoder.self", "decoder.context", "decoder.self")
ROLES: tuple[str, ...] = ("positional_prev", "positional_next", "bpe_merge", "interrogation")

_BLOCK_KEY = re.compile(r"(encoder\.self|decoder\.self|decoder\.context)\.layer(\d+)")


def split_block(key: str) -> tuple[str, int]:
    """("encoder.self", 3) for the block key "encoder.self.layer3"."""
    match = _BLOCK_KEY.fullmatch(key)
    if match is None:
        raise LearnableSparsityError(
            f"attention block key {key!r} is not '<encoder.self|decoder.self|decoder.context>"
            f".layer<i>'"
        )
    return match.group(1), int(match.group(2))


def block_order(key: str) -> tuple[int, int]:
    """Sort key of block keys: attention type (in ``ATTENTION_TYPES`` order), then layer."""
    kind, layer = split_block(key)
    return ATTENTION_TYPES.index(kind), layer
