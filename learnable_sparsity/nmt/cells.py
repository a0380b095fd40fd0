"""One cell of the NMT grid and its key, without torch: the report stages read results by key."""

from __future__ import annotations

from dataclasses import dataclass

from learnable_sparsity.errors import LearnableSparsityError


@dataclass(frozen=True, order=True)
class NmtCell:
    """One grid cell: a model trained on ``corpus`` with attention ``variant`` and ``seed``
    (cells sort by corpus, variant, seed)."""

    corpus: str
    variant: str
    seed: int

    @property
    def key(self) -> str:
        """The cell's results and models live under this path: corpus/variant/seedN."""
        return f"{self.corpus}/{self.variant}/seed{self.seed}"

    @classmethod
    def from_key(cls, key: str) -> NmtCell:
        """The cell whose :attr:`key` is ``key``."""
        parts = key.split("/")
        if len(parts) != 3 or not parts[2].startswith("seed") or not parts[2][4:].isdigit():
            raise LearnableSparsityError(f"not an NMT cell key (corpus/variant/seedN): {key!r}")
        return cls(parts[0], parts[1], int(parts[2][4:]))
