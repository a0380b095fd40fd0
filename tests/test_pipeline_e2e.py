"""End to end: `dvc repro` of the real stages on the ci profile, in a copy of the repository.

The copy is a fresh git repository (DVC needs one) holding exactly the project's files; MLflow
logs to a SQLite database in the temporary directory. Checks the stage outputs, the MLflow
parent/child runs, and that a second `dvc repro` does nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ["softmax", "sparsemax", "entmax15", "entmax_alpha", "topk"]


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    completed = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert completed.returncode == 0, (
        f"{command}:\n{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}"
    )
    return completed.stdout + completed.stderr


def environment(repo: Path, uri: str) -> dict[str, str]:
    """The stages' environment: this Python's tools, the copy's code, a local Ray, MLflow."""
    return {
        **os.environ,
        "MLFLOW_TRACKING_URI": uri,
        "PYTHONPATH": str(repo),
        "RAY_ADDRESS": "",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


@pytest.fixture(scope="module")
def repro(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """Run `dvc repro` on the ci profile once; (repository copy, MLflow URI, second repro log)."""
    work = tmp_path_factory.mktemp("e2e")
    repo = work / "repo"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in listed:
        if (ROOT / name).is_file() and not name.startswith(("data/", "models/", "results/")):
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = environment(repo, uri)
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid"]
    run(["git", "init", "-q"], repo, env)
    run([*git, "add", "-A"], repo, env)
    run([*git, "commit", "-qm", "copy"], repo, env)
    run([sys.executable, "-m", "pipelines.profile", "ci"], repo, env)
    run(["dvc", "repro"], repo, env)
    second = run(["dvc", "repro"], repo, env)
    return repo, uri, second


def test_outputs_of_every_stage(repro: tuple[Path, str, str]) -> None:
    repo, _, _ = repro
    for split in ("train", "valid", "test"):
        assert (repo / f"data/corpora/smoke/{split}.src").stat().st_size > 0
    assert (repo / "data/bpe/smoke/bpe.model").exists()
    summary = json.loads((repo / "results/train_nmt/summary.json").read_text())
    bleu = json.loads((repo / "results/evaluate_nmt/bleu.json").read_text())
    keys = [f"smoke/{v}/seed0" for v in VARIANTS]
    assert sorted(summary) == sorted(keys) and sorted(bleu["cells"]) == sorted(keys)
    assert all(set(bleu["cells"][k]) == {"bleu", "tokenized_bleu", "chrf"} for k in keys)
    assert "tok:13a" in bleu["signatures"]["bleu"]
    for key in keys:
        translations = (repo / f"results/evaluate_nmt/cells/{key}/translations.txt").read_text()
        assert len(translations.splitlines()) == 40
        assert (repo / f"models/nmt/{key}/last.pt").exists()
    trajectories = json.loads((repo / "results/train_nmt/alpha_trajectories.json").read_text())
    assert list(trajectories) == ["smoke/entmax_alpha/seed0"]
    header = (repo / "results/train_nmt/train_loss.csv").read_text().splitlines()[0]
    assert header.split(",") == ["step", *keys]
    speed = json.loads((repo / "results/speed/speed.json").read_text())
    assert {row["variant"] for row in speed["rows"]} == set(VARIANTS)


def test_head_analysis_outputs(repro: tuple[Path, str, str]) -> None:
    repo, _, _ = repro
    heads = json.loads((repo / "results/analyze_heads/heads.json").read_text())
    assert sorted(heads) == sorted(f"smoke/{v}/seed0" for v in VARIANTS)
    softmax = heads["smoke/softmax/seed0"]["mean_density"]
    assert softmax and all(value == 1.0 for value in softmax.values())
    assert all(0 < value <= 1 for value in heads["smoke/sparsemax/seed0"]["mean_density"].values())
    assert all(0 <= js <= 1 for js in heads["smoke/entmax15/seed0"]["js"].values())
    assert set(heads["smoke/entmax_alpha/seed0"]["alpha"]) == {
        "encoder.self",
        "decoder.self",
        "decoder.context",
    }
    figures = repo / "reports/figures/heads/smoke/seed0"
    assert (figures / "js_per_layer.png").stat().st_size > 0
    assert (figures / "alpha_trajectories_encoder_self.png").stat().st_size > 0
    assert len(list((repo / "results/analyze_heads/plots/alpha").glob("*.csv"))) == 3 * 2


def test_latent_variable_experiments_and_tables(repro: tuple[Path, str, str]) -> None:
    repo, _, _ = repro
    expected = {
        "ssvae": ({"dense", "sparsemax", "sfe"}, "accuracy"),
        "signal_game": ({"dense", "sparsemax", "sfe_zero_one"}, "communication_success"),
        "bitvector_vae": ({"topk_sparsemax", "sparsemap", "gumbel"}, "nll_bits_per_dim"),
    }
    for experiment, (methods, metric) in expected.items():
        results = json.loads((repo / f"results/train_lvm/{experiment}.json").read_text())
        assert set(results["methods"]) == methods and results["profile"] == "ci"
        for method, seeds in results["methods"].items():
            assert len(seeds) == 1 and seeds[0][metric] >= 0
            calls = seeds[0]["decoder_calls"]
            if method in ("sfe", "sfe_zero_one", "gumbel"):
                assert calls == 1
            if method == "dense":
                assert calls == (10 if experiment == "ssvae" else 16)
        assert (repo / f"reports/figures/lvm/{experiment}").is_dir()
    tables = (repo / "reports/tables.md").read_text()
    assert "ci profile" in tables and "not comparable to the publication" in tables
    for name in ("Sparsemax", "SparseMAP", "Communication success".lower()):
        assert name.lower() in tables.lower()
    index = (repo / "reports/index.md").read_text()
    assert "figures/heads/smoke/seed0/js_per_layer.png" in index and "http" not in index


def test_mlflow_has_a_parent_run_per_stage_and_a_child_per_cell(
    repro: tuple[Path, str, str],
) -> None:
    _, uri, _ = repro
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("learnable-sparsity")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = {r.info.run_name: r for r in runs if "mlflow.parentRunId" not in r.data.tags}
    assert {"train_nmt", "evaluate_nmt", "analyze_heads", "speed"} <= set(parents)
    assert {f"train_lvm/{e}" for e in ("ssvae", "signal_game", "bitvector_vae")} <= set(parents)
    for stage in ("train_nmt", "evaluate_nmt", "analyze_heads"):
        parent = parents[stage]
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert sorted(c.info.run_name for c in children) == sorted(
            f"smoke/{v}/seed0" for v in VARIANTS
        )
        assert all(c.info.status == "FINISHED" for c in [parent, *children])
    train_children = [
        r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents["train_nmt"].info.run_id
    ]
    alpha_child = next(r for r in train_children if r.info.run_name.endswith("entmax_alpha/seed0"))
    history = client.get_metric_history(alpha_child.info.run_id, "loss")
    assert [m.step for m in history] == [4, 8, 12]
    assert any(
        name.startswith("alpha/encoder.self.layer0/head") for name in alpha_child.data.metrics
    )
    # analyze_heads adds its figures to the run of the model it analysed
    analysis = client.list_artifacts(alpha_child.info.run_id, "analysis")
    assert "analysis/alpha_histograms.png" in {a.path for a in analysis}


def test_second_repro_is_a_no_op(repro: tuple[Path, str, str]) -> None:
    _, _, second = repro
    assert "Data and pipelines are up to date" in second


def test_changing_an_imported_file_makes_its_stages_stale(repro: tuple[Path, str, str]) -> None:
    repo, uri, _ = repro
    env = environment(repo, uri)
    batching = repo / "components/nmt/batching.py"
    original = batching.read_text()
    try:
        batching.write_text(original + "\n# an edit\n")
        status = run(["dvc", "status"], repo, env)
    finally:
        batching.write_text(original)
    stale = {line.rstrip(":") for line in status.splitlines() if line and not line[0].isspace()}
    assert stale == {"train_nmt", "evaluate_nmt", "analyze_heads", "speed"}
    assert "Data and pipelines are up to date" in run(["dvc", "status"], repo, env)
