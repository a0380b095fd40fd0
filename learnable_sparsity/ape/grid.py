"""The APE experiments' settings: the grid of APE systems (params ``ape``): system × data
regime × seed, as in the thesis' Tables 3.1 and 3.2.

A *system* is a named :class:`~learnable_sparsity.ape.model.ApeConfig` (which weights come from
BERT, which parameters are shared), written in params as the flags it changes from ``ape.model``.
A *regime* is the training data: the low-resource real triplets alone (the paper's 23K), or
the real triplets repeated ``oversample_real`` times plus the large synthetic set (the paper's
8M = eSCAPE + 23K × 35), and the systems trained on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from learnable_sparsity.ape.model import ApeConfig
from learnable_sparsity.nmt.search import DecodeSettings
from learnable_sparsity.nmt.training import TrainingSettings
from learnable_sparsity.settings import Settings, SettingsError, build, params_of, setting


@dataclass(frozen=True, kw_only=True)
class RegimeSettings(Settings):
    """One data regime: the real training triplets repeated ``oversample_real`` times, plus the
    synthetic set when ``synthetic``; and the systems trained on it."""

    systems: tuple[str, ...] = setting(distinct=True)
    synthetic: bool = False
    oversample_real: int = setting(1, at_least=1)


@dataclass(frozen=True, kw_only=True)
class ApeSettings(Settings):
    """Params ``ape``: the data, the systems, the regimes and what every cell shares.

    ``data.real`` / ``data.synthetic`` are directories of triplet files: sets made by
    ``synthetic_ape`` (``data/ape/<set>``) or downloaded triplet corpora
    (``data/corpora/<name>``). ``evaluate`` names the splits of the real set that are scored
    (the thesis: Table 3.1 on the dev set, Table 3.2 on test 2016–2018).
    """

    data: dict[str, str]  # set → directory of <split>.{src,mt,pe} files
    systems: dict[str, dict[str, bool | int | str | None]]  # flags over ape.model
    regimes: dict[str, RegimeSettings]
    seeds: tuple[int, ...] = setting(distinct=True, at_least=0)
    evaluate: tuple[str, ...] = setting(("valid", "test"), distinct=True)  # splits of data.real
    model: ApeConfig
    train: TrainingSettings
    decode: DecodeSettings
    max_source_pieces: int = setting(200, at_least=3)  # paper: src + mt < 200 WordPieces
    max_target_pieces: int = setting(100, at_least=1)  # paper: pe < 100

    def validate(self) -> None:
        if sorted(self.data) != ["real", "synthetic"]:
            raise SettingsError("data", "must name the sets 'real' and 'synthetic'")
        for name in self.systems:
            self.system(name)  # every system's flags form a valid model config
        for regime, settings in self.regimes.items():
            unknown = [s for s in settings.systems if s not in self.systems]
            if unknown:
                raise SettingsError(
                    f"regimes.{regime}.systems", f"names {unknown}, not in ape.systems"
                )
        if not self.seeds:
            raise SettingsError("seeds", "is empty")

    def system(self, name: str) -> ApeConfig:
        """The model config of system ``name``: ``ape.model`` with its flags applied."""
        flags = self.systems[name]
        return build(ApeConfig, {**params_of(self.model), **flags}, f"systems.{name}")

    def cells(self) -> list[ApeCell]:
        """Every cell, regime by regime, system by system, seed by seed."""
        return [
            ApeCell(regime, system, seed)
            for regime, settings in self.regimes.items()
            for system in settings.systems
            for seed in self.seeds
        ]


@dataclass(frozen=True, order=True)
class ApeCell:
    """One APE model: ``system`` trained on data ``regime`` from ``seed``."""

    regime: str
    system: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.regime}/{self.system}/seed{self.seed}"
