"""The NMT experiment grid (params ``nmt``): corpus × attention variant × seed.

Every cell trains one Transformer with one attention normalizer (``NORMALIZERS`` of the
core) on one corpus from one seed, under the settings all cells share: the architecture
(``model``), the optimisation (``train``) and the decoding of the test set (``decode``).
"""

from __future__ import annotations

from dataclasses import dataclass

from learnable_sparsity.core.registry import NORMALIZERS
from learnable_sparsity.nmt.cells import NmtCell
from learnable_sparsity.nmt.model import TransformerConfig
from learnable_sparsity.nmt.search import DecodeSettings
from learnable_sparsity.nmt.training import TrainingSettings
from learnable_sparsity.settings import Settings, SettingsError, setting


@dataclass(frozen=True, kw_only=True)
class NmtSettings(Settings):
    """Params ``nmt``: the grid axes and the settings every cell shares.

    ``variants`` lists normalizer names (``learnable_sparsity.core.registry.NORMALIZERS``): the
    params key keeps its name, as do the results keyed by it.
    """

    corpora: tuple[str, ...] = setting(distinct=True)
    variants: tuple[str, ...] = setting(distinct=True)
    seeds: tuple[int, ...] = setting(distinct=True, at_least=0)
    model: TransformerConfig
    train: TrainingSettings
    decode: DecodeSettings

    def validate(self) -> None:
        for axis in ("corpora", "variants", "seeds"):
            if not getattr(self, axis):
                raise SettingsError(axis, "is empty")
        unknown = [v for v in self.variants if v not in NORMALIZERS]
        if unknown:
            raise SettingsError("variants", f"has {unknown}; choose from {list(NORMALIZERS)}")

    def cells(self) -> list[NmtCell]:
        """Every cell, corpus by corpus, variant by variant, seed by seed."""
        return [
            NmtCell(corpus, variant, seed)
            for corpus in self.corpora
            for variant in self.variants
            for seed in self.seeds
        ]
