"""Settings of the latent-variable experiments: every committed profile builds, every bad key is
named, the grid keeps params order, per-method tables fall back to their default."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from learnable_sparsity.lvm.bitvector_vae import BitVectorVaeSettings
from learnable_sparsity.lvm.settings import LvmCell, LvmSettings
from learnable_sparsity.lvm.signal_game import SignalGameSettings, method_and_reward
from learnable_sparsity.lvm.ssvae import SsvaeSettings
from learnable_sparsity.settings import SettingsError, build

ROOT = Path(__file__).resolve().parents[2]
SECTIONS: dict[str, type[LvmSettings]] = {
    "ssvae": SsvaeSettings,
    "signal_game": SignalGameSettings,
    "bitvector_vae": BitVectorVaeSettings,
}
# The lvm_settings fixture: (experiment, **changed keys) -> settings.
Builder = Callable[..., LvmSettings]


def _overlay(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with a profile applied as ``python -m pipelines.commands.profile`` does: nested
    mappings merge key by key, any other value replaces the base's."""
    merged = dict(base)
    for key, value in overlay.items():
        nested = isinstance(value, Mapping) and isinstance(merged.get(key), Mapping)
        merged[key] = _overlay(merged[key], value) if nested else value
    return merged


@pytest.mark.parametrize("profile", [None, "ci", "paper"])
def test_every_committed_profile_builds(profile: str | None) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    if profile is not None:
        overlay = yaml.safe_load((ROOT / "profiles" / f"{profile}.yaml").read_text())
        params = _overlay(params, overlay)
    assert set(params["lvm"]) == set(SECTIONS)
    for experiment, cls in SECTIONS.items():
        settings = build(cls, params["lvm"][experiment], f"lvm.{experiment}")
        assert settings.cells()


@pytest.mark.parametrize(
    ("experiment", "change", "message"),
    [
        ("ssvae", {"steps": 0}, "lvm.ssvae.steps must be >= 1, got 0"),
        ("ssvae", {"batch_size": 0}, "lvm.ssvae.batch_size must be >= 1, got 0"),
        ("ssvae", {"log_every": 0}, "lvm.ssvae.log_every must be >= 1, got 0"),
        ("ssvae", {"checkpoint_every": -1}, "lvm.ssvae.checkpoint_every must be >= 1, got -1"),
        ("ssvae", {"gumbel_rate": -1e-4}, "lvm.ssvae.gumbel_rate must be >= 0, got -0.0001"),
        ("ssvae", {"seeds": [0, 1, 0]}, "lvm.ssvae.seeds lists [0] more than once"),
        ("ssvae", {"seeds": [-1]}, "lvm.ssvae.seeds[0] must be >= 0, got -1"),
        ("ssvae", {"seeds": []}, "lvm.ssvae.seeds is empty"),
        ("ssvae", {"methods": ["sfe", "sfe"]}, "lvm.ssvae.methods lists ['sfe'] more than"),
        ("ssvae", {"methods": []}, "lvm.ssvae.methods is empty"),
        ("ssvae", {"methods": ["sfe_zero_one"]}, "lvm.ssvae.methods has 'sfe_zero_one'"),
        ("ssvae", {"lr": {"sfe": 0.1}}, "lvm.ssvae.lr.default is missing"),
        ("ssvae", {"lr": {"default": 0}}, "lvm.ssvae.lr.default must be > 0, got 0.0"),
        ("ssvae", {"lr": {"default": "fast"}}, "lvm.ssvae.lr must be a mapping of names to"),
        ("ssvae", {"lr": {"default": 1, "sparsmax": 1}}, "lvm.ssvae.lr has ['sparsmax']"),
        ("ssvae", {"labelled_fraction": 1.0}, "lvm.ssvae.labelled_fraction must be > 0 and < 1"),
        ("ssvae", {"latent_dim": 0}, "lvm.ssvae.latent_dim must be >= 1"),
        ("ssvae", {"hidden": [16, 0]}, "lvm.ssvae.hidden[1] must be >= 1, got 0"),
        ("ssvae", {"classifier_weight": -1}, "lvm.ssvae.classifier_weight must be >= 0"),
        ("ssvae", {"pretrain_steps": 8}, "lvm.ssvae.pretrain_steps must be < steps"),
        ("ssvae", {"topk": 10}, "lvm.ssvae has unknown keys ['topk']"),
        (
            "ssvae",
            {"warm_start": {"lr": 0.001, "validate_every": 79}, "pretrain_steps": 0},
            "lvm.ssvae.warm_start needs pretrain_steps > 0",
        ),
        (
            "ssvae",
            {"warm_start": {"lr": 0, "validate_every": 79}},
            "lvm.ssvae.warm_start.lr must be > 0, got 0",
        ),
        ("ssvae", {"warm_start": {"lr": 0.001}}, "lvm.ssvae.warm_start.validate_every is missing"),
        ("signal_game", {"methods": ["dense", "sparsemap"]}, "methods has 'sparsemap'; choose"),
        ("signal_game", {"entropy_coef": {"default": -0.1}}, "entropy_coef.default must be >= 0"),
        ("signal_game", {"entropy_coef": {"sfe": 0.1}}, "entropy_coef.default is missing"),
        ("signal_game", {"candidates": 1}, "lvm.signal_game.candidates must be >= 2, got 1"),
        ("signal_game", {"vocab_size": 1}, "lvm.signal_game.vocab_size must be >= 2, got 1"),
        ("signal_game", {"test_games": 0}, "lvm.signal_game.test_games must be >= 1"),
        ("bitvector_vae", {"bits": [8, 8]}, "lvm.bitvector_vae.bits lists [8] more than once"),
        ("bitvector_vae", {"bits": [0]}, "lvm.bitvector_vae.bits[0] must be >= 1, got 0"),
        ("bitvector_vae", {"bits": []}, "lvm.bitvector_vae.bits is empty"),
        ("bitvector_vae", {"methods": ["sparsemax"]}, "methods has 'sparsemax'; choose"),
        ("bitvector_vae", {"rank": 0}, "lvm.bitvector_vae.rank must be >= 1, got 0"),
        ("bitvector_vae", {"topk": 0}, "lvm.bitvector_vae.topk must be >= 1, got 0"),
        ("bitvector_vae", {"importance_samples": 0}, "importance_samples must be >= 1"),
        ("bitvector_vae", {"test_examples": 0}, "test_examples must be >= 1"),
        (
            "bitvector_vae",
            {"overrides": {"D128/sparsmap": {"batch_size": 16}}},
            "lvm.bitvector_vae.overrides has 'D128/sparsmap', which is not D<bits>/<method>",
        ),
        (
            "bitvector_vae",
            {"overrides": {"sparsemap": {"batch_size": 16}}},
            "overrides has 'sparsemap', which is not D<bits>/<method>",
        ),
        ("ssvae", {"overrides": {"D8/sfe": {"lr": 0.1}}}, "overrides has 'D8/sfe', which is not"),
        (
            "bitvector_vae",
            {"overrides": {"D128/sparsemap": {"batch_size": 16.5}}},
            "lvm.bitvector_vae.overrides.D128/sparsemap.batch_size must be a whole number",
        ),
        (
            "bitvector_vae",
            {"overrides": {"D128/sparsemap": {"batch_size": 0}}},
            "lvm.bitvector_vae.overrides.D128/sparsemap.batch_size must be >= 1, got 0",
        ),
        (
            "bitvector_vae",
            {"overrides": {"D8/gumbel": {"bits": 4}}},
            "lvm.bitvector_vae.overrides.D8/gumbel.bits cannot be overridden per cell",
        ),
        (
            "bitvector_vae",
            {"overrides": {"D8/gumbel": {"lr": "fast"}}},
            "lvm.bitvector_vae.overrides must be a mapping of names to",
        ),
    ],
)
def test_settings_errors_name_the_key(
    experiment: str, change: dict, message: str, lvm_settings: Builder
) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        lvm_settings(experiment, **change)


def test_a_missing_key_is_named(lvm_settings: Builder) -> None:
    values = dataclasses.asdict(lvm_settings("signal_game"))
    del values["entropy_coef"]
    with pytest.raises(SettingsError, match=r"lvm\.signal_game\.entropy_coef is missing"):
        build(SignalGameSettings, values, "lvm.signal_game")


def test_the_grid_keeps_params_order(lvm_settings: Builder) -> None:
    assert [c.key for c in lvm_settings("ssvae").cells()] == [
        "sfe/seed0",
        "sfe/seed1",
        "gumbel/seed0",
        "gumbel/seed1",
    ]
    cells = lvm_settings("bitvector_vae", methods=["gumbel", "sfe"], seeds=[3]).cells()
    assert cells == [LvmCell(m, 3, d) for d in (8, 4) for m in ("gumbel", "sfe")]
    assert cells[0].key == "D8/gumbel/seed3"


def test_per_method_values_fall_back_to_the_default(lvm_settings: Builder) -> None:
    game = lvm_settings("signal_game")
    assert game.per_method("lr", "sfe") == 0.005
    assert game.per_method("lr", "sfe_zero_one") == 0.01
    assert game.per_method("entropy_coef", "sfe_zero_one") == 0.01
    assert game.per_method("entropy_coef", "gumbel") == 0.1


def test_game_method_names_fix_the_sfe_reward() -> None:
    assert method_and_reward("sfe_nll") == ("sfe", "nll")
    assert method_and_reward("sfe_zero_one") == ("sfe", "zero_one")
    assert method_and_reward("sfe") == ("sfe", "nll")
    assert method_and_reward("sparsemax") == ("sparsemax", "nll")


def test_run_settings_hold_only_what_the_cell_depends_on(lvm_settings: Builder) -> None:
    game = lvm_settings("signal_game")
    values = game.run_settings(LvmCell("sfe_zero_one", 1))
    assert {"methods", "seeds"}.isdisjoint(values)
    assert values["lr"] == 0.01 and values["entropy_coef"] == 0.01
    assert (values["method"], values["seed"], values["bits"]) == ("sfe_zero_one", 1, None)
    # Another method's entry leaves this cell's settings as they were.
    other = lvm_settings("signal_game", lr={"default": 0.01, "sfe": 0.5, "sparsemax": 0.1})
    assert other.run_settings(LvmCell("sfe_zero_one", 1)) == values


def test_overrides_change_their_series_only(lvm_settings: Builder) -> None:
    vae = lvm_settings(
        "bitvector_vae",
        methods=["gumbel", "sparsemap"],
        lr={"default": 0.001, "sparsemap": 0.002},
        overrides={
            "D8/sparsemap": {"batch_size": 16, "lr": "1e-4"},  # as YAML 1.1 reads 1e-4
            "D8/gumbel": {"gumbel_rate": 0.25},
        },
    )
    sparsemap_8 = vae.for_cell(LvmCell("sparsemap", 0, 8))
    assert (sparsemap_8.batch_size, sparsemap_8.per_method("lr", "sparsemap")) == (16, 1e-4)
    assert isinstance(sparsemap_8.batch_size, int) and sparsemap_8.overrides is None
    assert vae.for_cell(LvmCell("gumbel", 0, 8)).gumbel_rate == 0.25 != vae.gumbel_rate
    sparsemap_4 = vae.for_cell(LvmCell("sparsemap", 0, 4))
    assert (sparsemap_4.batch_size, sparsemap_4.per_method("lr", "sparsemap")) == (
        vae.batch_size,
        0.002,
    )
    assert sparsemap_4.gumbel_rate == vae.gumbel_rate
    # narrowing twice changes nothing; the run's settings hold the resolved values only
    assert sparsemap_8.for_cell(LvmCell("sparsemap", 0, 8)) == sparsemap_8
    values = vae.run_settings(LvmCell("sparsemap", 0, 8))
    assert (values["batch_size"], values["lr"]) == (16, 1e-4) and "overrides" not in values
    # another series' override leaves this cell's run settings as they were
    fewer = dataclasses.replace(vae, overrides={"D8/sparsemap": {"batch_size": 16, "lr": 1e-4}})
    assert fewer.run_settings(LvmCell("sparsemap", 0, 8)) == values
    assert fewer.run_settings(LvmCell("gumbel", 0, 8)) != vae.run_settings(LvmCell("gumbel", 0, 8))
