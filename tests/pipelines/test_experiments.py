"""The latent-variable experiments' records (``pipelines/lvm_experiments.py``) are the one list of
experiments: ``dvc.yaml``, the params, the profiles and ``claims.yaml`` name the same ones."""

from __future__ import annotations

import yaml

from learnable_sparsity.claims import load_claims
from learnable_sparsity.lvm.settings import LvmSettings
from pipelines.lvm_experiments import LVM
from pipelines.scaffold import layout
from pipelines.scaffold.imports import ROOT

DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def test_dvc_yaml_trains_every_experiment_and_no_other() -> None:
    assert DVC["stages"]["train_lvm"]["foreach"] == list(LVM)


def test_params_yaml_has_a_section_per_experiment_and_profiles_no_other() -> None:
    assert list(PARAMS["lvm"]) == list(LVM)
    for profile in sorted((ROOT / "profiles").glob("*.yaml")):
        sections = yaml.safe_load(profile.read_text()).get("lvm", {})
        assert set(sections) <= set(LVM), f"{profile.name}: lvm.{set(sections) - set(LVM)}"


def test_the_report_stages_depend_on_every_experiments_results() -> None:
    results = [layout.lvm_results(name) for name in LVM]
    curves = [layout.lvm_curves(name, curve) for name in LVM for curve in layout.LVM_CURVE_FILES]
    for stage, files in (("claims", results + curves), ("tables", results)):
        deps = DVC["stages"][stage]["deps"]
        missing = [str(path) for path in files if str(path) not in deps]
        assert not missing, f"dvc.yaml stage {stage} misses the deps {missing}"


def test_claims_yaml_names_only_registered_experiments() -> None:
    named = set()
    for claim in load_claims():
        named |= {claim.args["experiment"]} if "experiment" in claim.args else set()
        named |= set(claim.args.get("experiments", ()))
    assert named, "no claim about a latent-variable experiment"
    assert named <= set(LVM), f"claims.yaml names unknown experiments {named - set(LVM)}"


def test_each_record_has_a_task_with_a_headline_metric() -> None:
    for name, experiment in LVM.items():
        task = experiment.task()
        assert issubclass(task.settings, LvmSettings) and callable(task.setup), name
        assert task.settings.HEADLINE[0], f"{name}: no headline metric"
