"""params.yaml and the profiles: every section builds its settings; errors name the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from learnable_sparsity.analysis.heads import AnalysisSettings
from learnable_sparsity.data.corpora import corpus_settings
from learnable_sparsity.data.datasets import dataset_settings
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.grid import NmtSettings
from learnable_sparsity.nmt.model import TransformerConfig
from learnable_sparsity.nmt.speed import SpeedSettings
from learnable_sparsity.nmt.training import TrainingSettings
from pipelines.commands.preflight import settings_checks
from pipelines.commands.profile import apply_profile
from pipelines.scaffold.params import Params, deep_merge, load_params
from pipelines.scaffold.runner import RaySettings
from pipelines.scaffold.tracking.store import MlflowSettings

ROOT = Path(__file__).resolve().parents[2]


def check_every_section(params: Params) -> None:
    failed = [check for check in settings_checks(params) if not check.ok]
    assert not failed


def test_committed_params_are_the_smoke_profile_and_valid() -> None:
    params = load_params(ROOT / "params.yaml")
    assert params.get("profile", str) == "smoke"
    check_every_section(params)
    nmt = params.settings("nmt", NmtSettings)
    assert {cell.variant for cell in nmt.cells()} == {
        "softmax",
        "sparsemax",
        "entmax15",
        "entmax_alpha",
        "topk",
    }


@pytest.mark.parametrize("profile", sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml")))
def test_profiles_apply_on_smoke_and_refuse_stacking(profile: str, tmp_path: Path) -> None:
    params_file = tmp_path / "params.yaml"
    params_file.write_text((ROOT / "params.yaml").read_text())
    apply_profile(profile, params_file, ROOT / "profiles")
    merged = load_params(params_file)
    overlay = yaml.safe_load((ROOT / "profiles" / f"{profile}.yaml").read_text())
    assert merged.get("profile", str) == profile
    assert merged.get("nmt.train.max_steps", int) == overlay["nmt"]["train"]["max_steps"]
    check_every_section(merged)
    with pytest.raises(LearnableSparsityError, match="git checkout"):
        apply_profile("ci", params_file, ROOT / "profiles")
    with pytest.raises(LearnableSparsityError, match="no profile 'huge'"):
        apply_profile("huge", params_file, ROOT / "profiles")


def smoke_with(change: dict) -> Params:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    return Params(deep_merge(data, change), "params.yaml")


@pytest.mark.parametrize(
    ("key", "cls", "change", "message"),
    [
        (
            "nmt",
            NmtSettings,
            {"nmt": {"train": {"max_steps": "many"}}},
            r"nmt.train.max_steps must be an integer",
        ),
        (
            "nmt",
            NmtSettings,
            {"nmt": {"train": {"peak_lr": -1}}},
            r"nmt.train.peak_lr must be > 0, got -1.0",
        ),
        (
            "nmt",
            NmtSettings,
            {"nmt": {"variants": ["softmax", "gumbel"]}},
            r"nmt.variants has \['gumbel'\]",
        ),
        (
            "nmt",
            NmtSettings,
            {"nmt": {"variants": ["topk", "topk"]}},
            r"nmt.variants lists \['topk'\] more than once",
        ),
        ("nmt", NmtSettings, {"nmt": {"seeds": [0, 0]}}, r"nmt.seeds lists \[0\] more than once"),
        (
            "nmt",
            NmtSettings,
            {"nmt": {"model": {"n_heads": 3}}},
            r"nmt.model.d_model must be divisible by n_heads=3",
        ),
        (
            "nmt",
            NmtSettings,
            {"nmt": {"model": {"alpha_init": 3}}},
            r"nmt.model.alpha_init must be > 1.01 and < 2",
        ),
        (
            "nmt",
            NmtSettings,
            {"nmt": {"model": {"heads": 4}}},
            r"nmt.model has unknown keys \['heads'\]",
        ),
        (
            "nmt",
            NmtSettings,
            {"nmt": {"model": {"src_vocab": 4}}},
            r"nmt.model has unknown keys \['src_vocab'\]",
        ),
        (
            "nmt",
            NmtSettings,
            {"nmt": {"decode": {"beam_size": 0}}},
            r"nmt.decode.beam_size must be >= 1",
        ),
        (
            "nmt",
            NmtSettings,
            {"nmt": {"train": {"weight_decay": -0.1}}},
            r"nmt.train.weight_decay must be >= 0",
        ),
        (
            "analysis",
            AnalysisSettings,
            {"analysis": {"role_threshold": 0}},
            r"analysis.role_threshold must be > 0 and <= 1",
        ),
        (
            "analysis",
            AnalysisSettings,
            {"analysis": {"interrogatives": {"es": ["qué", "por qué"]}}},
            r"analysis.interrogatives.es\[1\] must be one word",
        ),
        (
            "speed",
            SpeedSettings,
            {"speed": {"variants": ["topk"]}},
            r"speed.variants must include softmax",
        ),
        ("ray", RaySettings, {"ray": {"task_cpus": 0}}, r"ray.task_cpus must be > 0"),
        (
            "mlflow",
            MlflowSettings,
            {"mlflow": {"experiment": " "}},
            r"mlflow.experiment must be a non-empty",
        ),
    ],
)
def test_errors_name_the_file_and_the_key(key: str, cls: type, change: dict, message: str) -> None:
    with pytest.raises(LearnableSparsityError, match=rf"^params\.yaml: {message}"):
        smoke_with(change).settings(key, cls)


def test_yaml_float_spellings_are_numbers() -> None:
    # YAML 1.1 (PyYAML) reads 1e-3 without a dot as the string "1e-3".
    params = Params(
        yaml.safe_load("train: {max_steps: 5, max_tokens: 10, warmup: 1, peak_lr: 1e-3}"), "p"
    )
    assert params.settings("train", TrainingSettings).peak_lr == 0.001


def test_entries_name_the_entry_at_fault() -> None:
    params = smoke_with({"corpora": {"mine": {"source": "ftp"}}})
    with pytest.raises(LearnableSparsityError, match=r"corpora.mine.source must be one of"):
        params.entries("corpora", corpus_settings)
    params = smoke_with({"images": {"digits": {"test_size": 1.5}}})
    with pytest.raises(LearnableSparsityError, match=r"images.digits.test_size as a fraction"):
        params.entries("images", dataset_settings)


def test_derived_fields_are_set_by_code_not_params() -> None:
    config = smoke_with({}).settings("nmt.model", TransformerConfig)
    assert config.src_vocab is None
    sized = config.for_vocabulary(300, "entmax_alpha")
    assert (sized.src_vocab, sized.tgt_vocab, sized.normalizer) == (300, 300, "entmax_alpha")


def test_load_params_errors(tmp_path: Path) -> None:
    with pytest.raises(LearnableSparsityError, match="does not exist"):
        load_params(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("nmt: [unclosed\n")
    with pytest.raises(LearnableSparsityError, match="not valid YAML"):
        load_params(broken)


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    twice = tmp_path / "params.yaml"
    twice.write_text("nmt:\n  seeds: [0]\n  variants: [softmax]\n  seeds: [1]\n")
    with pytest.raises(LearnableSparsityError, match=r"key 'seeds' appears twice(.|\n)*line 4"):
        load_params(twice)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nmt": {"model": {"dropout": 1.5}}}, r"nmt.model.dropout must be >= 0 and < 1"),
        ({"nmt": {"model": {"d_ff": 0}}}, r"nmt.model.d_ff must be >= 1"),
        ({"nmt": {"model": {"enc_layers": 0}}}, r"nmt.model.enc_layers must be >= 1"),
        ({"nmt": {"model": {"topk_k": 0}}}, r"nmt.model.topk_k must be >= 1"),
        (
            {"nmt": {"train": {"label_smoothing": 1.0}}},
            r"nmt.train.label_smoothing must be >= 0 and < 1",
        ),
        ({"nmt": {"train": {"clip_norm": -1}}}, r"nmt.train.clip_norm must be >= 0"),
        (
            {"nmt": {"train": {"peak_lr": "fast"}}},
            r"nmt.train.peak_lr must be a number, got 'fast'",
        ),
    ],
)
def test_the_settings_probed_in_the_audit_fail_in_the_driver(change: dict, message: str) -> None:
    with pytest.raises(LearnableSparsityError, match=rf"^params\.yaml: {message}"):
        smoke_with(change).settings("nmt", NmtSettings)
