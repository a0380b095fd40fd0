"""params.yaml reading and the profile switch: errors name the key, profiles overlay smoke."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.errors import LearnableSparsityError
from components.nmt.trainer import TrainingSettings
from pipelines.nmt_grid import grid
from pipelines.params import Params, deep_merge, load_params
from pipelines.profile import apply_profile

ROOT = Path(__file__).resolve().parents[2]


def test_committed_params_are_the_smoke_profile_and_valid() -> None:
    params = load_params(ROOT / "params.yaml")
    assert params.get("profile", str) == "smoke"
    cells = grid(params)
    assert {c.variant for c in cells} == {
        "softmax",
        "sparsemax",
        "entmax15",
        "entmax_alpha",
        "topk",
    }
    params.build("nmt.train", TrainingSettings, seed=0)


@pytest.mark.parametrize("profile", ["paper", "ci"])
def test_profiles_apply_on_smoke_and_refuse_stacking(profile: str, tmp_path: Path) -> None:
    params_file = tmp_path / "params.yaml"
    params_file.write_text((ROOT / "params.yaml").read_text())
    apply_profile(profile, params_file, ROOT / "profiles")
    merged = load_params(params_file)
    overlay = yaml.safe_load((ROOT / "profiles" / f"{profile}.yaml").read_text())
    assert merged.get("profile", str) == profile
    assert merged.get("nmt.train.max_steps", int) == overlay["nmt"]["train"]["max_steps"]
    merged.build("nmt.train", TrainingSettings, seed=0)
    grid(merged)
    with pytest.raises(LearnableSparsityError, match="git checkout"):
        apply_profile("ci", params_file, ROOT / "profiles")
    with pytest.raises(LearnableSparsityError, match="no profile 'huge'"):
        apply_profile("huge", params_file, ROOT / "profiles")


def test_errors_name_the_key() -> None:
    params = Params({"nmt": {"train": {"max_steps": "many"}, "seeds": [0, "x"]}}, "p.yaml")
    with pytest.raises(LearnableSparsityError, match=r"p.yaml: nmt.train.max_steps must be int"):
        params.get("nmt.train.max_steps", int)
    with pytest.raises(LearnableSparsityError, match=r"p.yaml: nmt.model is missing"):
        params.get("nmt.model.d_model")
    with pytest.raises(LearnableSparsityError, match="must be int"):
        Params({"a": True}, "p").get("a", int)
    train = Params(
        {"t": {"max_steps": 5, "max_tokens": 10, "warmup": 1, "peak_lr": 1.0, "lr": 2}}, "p"
    )
    with pytest.raises(LearnableSparsityError, match=r"p: t has unknown keys \['lr'\]"):
        train.build("t", TrainingSettings)
    bad = Params({"t": {"max_steps": 0, "max_tokens": 10, "warmup": 1, "peak_lr": 1.0}}, "p")
    with pytest.raises(LearnableSparsityError, match=r"p: t: max_steps must be a positive"):
        bad.build("t", TrainingSettings)


def test_grid_rejects_unknown_variant_and_corpus(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    wrong = deep_merge(data, {"nmt": {"variants": ["softmax", "gumbel"]}})
    with pytest.raises(LearnableSparsityError, match=r"nmt.variants has 'gumbel'"):
        grid(Params(wrong, "params.yaml"))
    wrong = deep_merge(data, {"nmt": {"corpora": ["wmt99"]}})
    with pytest.raises(LearnableSparsityError, match=r"nmt.corpora names 'wmt99'"):
        grid(Params(wrong, "params.yaml"))


def test_load_params_errors(tmp_path: Path) -> None:
    with pytest.raises(LearnableSparsityError, match="does not exist"):
        load_params(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("nmt: [unclosed\n")
    with pytest.raises(LearnableSparsityError, match="not valid YAML"):
        load_params(broken)
