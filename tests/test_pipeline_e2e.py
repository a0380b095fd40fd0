"""End to end: `dvc repro` of the real stages on the ci profile, in copies of the repository.

A copy is a fresh git repository (DVC needs one) holding exactly the project's files; MLflow
logs to a SQLite database in the temporary directory. Checks the stage outputs, the MLflow
parent/child runs, that a second `dvc repro` does nothing, that a second copy whose run is
killed with SIGKILL mid-training resumes and ends with the same outputs (and no MLflow run left
RUNNING), and that changed code, settings and input files rerun exactly what depends on them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

from learnable_sparsity.core import fused
from learnable_sparsity.timing import MIN_ROUNDS_FOR_SPREAD
from pipelines.commands import compare_outputs
from tests.conftest import load_script

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
def snapshot(
    tmp_path_factory: pytest.TempPathFactory, project_files: Callable[[Path], None]
) -> Path:
    """The project's files (not its outputs) as they are when the module starts: every copy is
    made from this one, so all copies run the same code."""
    files = tmp_path_factory.mktemp("snapshot")
    project_files(files)
    return files


def copy_repository(snapshot: Path, work: Path) -> tuple[Path, str, dict[str, str]]:
    """A git repository under ``work`` with the ``snapshot``'s files on the ci profile; (its
    path, its MLflow URI, the stages' environment)."""
    repo = work / "repo"
    shutil.copytree(snapshot, repo)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = environment(repo, uri)
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid"]
    run(["git", "init", "-q"], repo, env)
    run([*git, "add", "-A"], repo, env)
    run([*git, "commit", "-qm", "copy"], repo, env)
    run([sys.executable, "-m", "pipelines.commands.profile", "ci"], repo, env)
    return repo, uri, env


@pytest.fixture(scope="module")
def repro(snapshot: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """Run `dvc repro` on the ci profile once; (repository copy, MLflow URI, second repro log)."""
    repo, uri, env = copy_repository(snapshot, tmp_path_factory.mktemp("e2e"))
    run(["dvc", "repro"], repo, env)
    second = run(["dvc", "repro"], repo, env)
    return repo, uri, second


@pytest.fixture(scope="module")
def interrupted(
    snapshot: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str, list[str]]:
    """A second copy: `dvc repro train_nmt` killed with SIGKILL (driver, Ray and all) after the
    first NMT checkpoint, then again; (the copy, its MLflow URI, the cells it interrupted). The
    stages after train_nmt are functions of its outputs (DVC hashes them): they need not run
    again to show that the resumed outputs are the uninterrupted ones."""
    repo, uri, env = copy_repository(snapshot, tmp_path_factory.mktemp("e2e_killed"))
    process = subprocess.Popen(
        ["dvc", "repro", "train_nmt"],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    models = repo / "models" / "nmt"
    deadline = time.monotonic() + 600
    while not any(models.rglob("last.pt")) and process.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    # Everything at once, as a crash would: dvc, the stage's driver and its Ray workers (which
    # run in their own process groups, in the copy's folder).
    doomed = [process.pid] + [
        proc.pid
        for proc in psutil.process_iter(["cwd"])
        if proc.info["cwd"] and Path(proc.info["cwd"]).is_relative_to(repo)
    ]
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    cut = sorted(  # cells that had started training (a checkpoint) but not finished
        str(path.parent.relative_to(models))
        for path in models.rglob("last.pt")
        if not (path.parent / "done.json").exists()
    )
    run(["dvc", "repro", "train_nmt"], repo, env)
    return repo, uri, cut


def test_outputs_of_every_stage(repro: tuple[Path, str, str]) -> None:
    repo, _, _ = repro
    for split in ("train", "valid", "test"):
        assert (repo / f"data/corpora/smoke/{split}.src").stat().st_size > 0
    assert (repo / "data/bpe/smoke/bpe.model").exists()
    summary = json.loads((repo / "results/train_nmt/summary.json").read_text())
    bleu = json.loads((repo / "results/evaluate_nmt/bleu.json").read_text())
    keys = [f"smoke/{v}/seed0" for v in VARIANTS]
    assert sorted(summary) == sorted(keys) and sorted(bleu["cells"]) == sorted(keys)
    scores = {"bleu", "tokenized_bleu", "chrf", "empty_hypotheses"}
    assert all(set(bleu["cells"][k]) == scores for k in keys)
    assert all(0 <= bleu["cells"][k]["empty_hypotheses"] <= 40 for k in keys)
    assert "tok:13a" in bleu["signatures"]["bleu"]
    for key in keys:
        translations = (repo / f"results/evaluate_nmt/cells/{key}/translations.txt").read_text()
        assert len(translations.splitlines()) == 40
        assert (repo / f"models/nmt/{key}/last.pt").exists()
    trajectories = json.loads((repo / "results/train_nmt/alpha_trajectories.json").read_text())
    assert list(trajectories) == ["smoke/entmax_alpha/seed0"]
    header = (repo / "results/train_nmt/train_loss.csv").read_text().splitlines()[0]
    assert header.split(",") == ["step", "series", "run", "loss"]
    metrics = json.loads((repo / "results/evaluate_nmt/metrics.json").read_text())
    assert set(metrics["smoke"]) == set(VARIANTS)
    assert set(metrics["smoke"]["softmax"]["bleu"]) == {"mean", "seed0"}
    speed = json.loads((repo / "results/speed/metrics.json").read_text())
    assert set(speed) == set(VARIANTS) and speed["softmax"]["train_ratio_to_softmax"] == 1.0
    assert "inference_relative_spread" in speed["softmax"]
    rounds = json.loads((repo / "results/speed/rounds.json").read_text())
    assert {row["variant"] for row in rounds["rows"]} == set(VARIANTS)
    assert rounds["fused_kernels"] is fused.available()  # CPU: the kernels, where they build
    for row in rounds["rows"]:  # the spread over the rounds; too few rounds to know it: noisy
        assert len(row["ratio_to_softmax_each_round"]["train"]) == rounds["rounds"]
        assert len(row["train_ratio_quartiles"]) == 2
        assert row["inference_noisy"] is True or rounds["rounds"] >= MIN_ROUNDS_FOR_SPREAD


def test_head_analysis_outputs(repro: tuple[Path, str, str]) -> None:
    repo, _, _ = repro
    heads = json.loads((repo / "results/analyze_heads/heads.json").read_text())
    assert sorted(heads) == sorted(f"smoke/{v}/seed0" for v in VARIANTS)
    softmax = heads["smoke/softmax/seed0"]["mean_density"]
    assert softmax and all(value == 1.0 for value in softmax.values())
    assert all(0 < value <= 1 for value in heads["smoke/sparsemax/seed0"]["mean_density"].values())
    assert all(0 <= js <= 1 for js in heads["smoke/entmax15/seed0"]["js"].values())
    roles = heads["smoke/softmax/seed0"]["roles"]
    assert heads["smoke/softmax/seed0"]["source_language"] == "en"
    assert set(roles) == {"positional_prev", "positional_next", "bpe_merge", "interrogation"}
    # The first 20 validation sentences hold wh-questions, and BPE splits words: all measurable.
    for role in roles.values():
        assert role["measurable"] and role["matched"] > 0
        assert role["count"] == len(role["heads"])
    assert set(heads["smoke/entmax_alpha/seed0"]["alpha"]) == {
        "encoder.self",
        "decoder.self",
        "decoder.context",
    }
    figures = repo / "reports/figures/heads/smoke/seed0"
    assert (figures / "js_per_layer.png").stat().st_size > 0
    assert (figures / "alpha_trajectories_encoder_self.png").stat().st_size > 0
    alpha = (repo / "results/train_nmt/alpha.csv").read_text().splitlines()
    assert alpha[0] == "step,facet,series,run,alpha"
    assert {row.split(",")[1] for row in alpha[1:]} == {
        "encoder.self.layer0",
        "decoder.self.layer0",
        "decoder.context.layer0",
    }


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
    # the report opens with every claim's verdict; one seed decides no comparison
    claims = json.loads((repo / "results/claims/claims.json").read_text())
    assert index.index("## The papers' claims") < index.index("## Tables")
    counted = len(claims["claims"]) + len(claims["out_of_scope"])
    assert counted == sum(claims["counts"].values()) and len(claims["claims"]) >= 15
    verdicts = {claim["id"]: claim["status"] for claim in claims["claims"]}
    assert verdicts["ast_entmax_bleu"] == verdicts["ape_beats_mt"] == "not measurable"
    assert (repo / "reports/figures/claims/alpha_histograms.png").stat().st_size > 0


def test_ape_chain(repro: tuple[Path, str, str]) -> None:
    repo, _, _ = repro
    sizes = {"train": 30, "valid": 10, "test": 10}
    for split, size in sizes.items():
        lines = [
            (repo / f"data/ape/real/{split}.{side}").read_text().splitlines()
            for side in ("src", "mt", "pe")
        ]
        assert [len(side) for side in lines] == [size] * 3
    synthetic = (repo / "data/ape/synthetic/train.pe").read_text().splitlines()
    assert 0 < len(synthetic) <= 30
    summary = json.loads((repo / "results/synthetic_ape/summary.json").read_text())
    assert set(summary["sets"]) == {"real", "synthetic"}
    assert summary["sets"]["real"]["test"]["triplets"] == 10
    assert (repo / "reports/figures/ape/ter_real.png").stat().st_size > 0
    assert (repo / "models/bert/model/config.json").exists()
    trained = json.loads((repo / "results/train_ape/summary.json").read_text())
    systems = [
        "transformer_decoder",
        "bert_decoder",
        "ca_init_sa",
        "sa_tied_encoder",
        "ca_tied_sa",
        "ff_tied_encoder",
        "scratch",
        "dual_source",
    ]
    keys = [f"low_resource/{s}/seed0" for s in systems] + [
        f"augmented/{s}/seed0" for s in ("sa_tied_encoder", "dual_source")
    ]
    assert sorted(trained) == sorted(keys)
    assert (
        trained["augmented/sa_tied_encoder/seed0"]["train_examples"]
        > trained["low_resource/sa_tied_encoder/seed0"]["train_examples"]
    )
    scores = json.loads((repo / "results/evaluate_ape/scores.json").read_text())
    assert sorted(scores["cells"]) == sorted(keys) and set(scores["do_nothing"]) == {
        "valid",
        "test",
    }
    assert (
        "case:mixed" in scores["signatures"]["ter"]
        and "tok:none" in scores["signatures"]["tokenized_bleu"]
    )
    for key in keys:
        assert set(scores["cells"][key]) == {"valid", "test"}
        hypotheses = (repo / f"results/evaluate_ape/cells/{key}/test.txt").read_text().splitlines()
        assert len(hypotheses) == 10
    tables = (repo / "reports/tables.md").read_text()
    assert "thesis Table 3.1" in tables and "thesis Table 3.2" in tables and "Do nothing" in tables


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
    assert {"synthetic_ape", "pretrain_bert", "train_ape", "evaluate_ape"} <= set(parents)
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


def test_one_mlflow_row_per_model_carries_its_params_curves_scores_and_source(
    repro: tuple[Path, str, str],
) -> None:
    """Sorting the runs table by BLEU shows the α curves, the speed and the commit on that row."""
    repo, uri, _ = repro
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("learnable-sparsity")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    training = client.search_runs(
        [experiment.experiment_id], "tags.stage = 'train_nmt' and attributes.status = 'FINISHED'"
    )
    cells = {r.data.tags["cell"]: r for r in training if "cell" in r.data.tags}
    assert sorted(cells) == sorted(f"smoke/{v}/seed0" for v in VARIANTS)
    for found in cells.values():
        metrics, tags = found.data.metrics, found.data.tags
        assert {"test/bleu", "test/chrf", "speed/train_ratio_to_softmax", "loss"} <= set(metrics)
        assert tags["mlflow.source.git.commit"] == commit
        assert found.data.params["profile"] == "ci" and found.data.params["cell.variant"]
        (dataset,) = found.inputs.dataset_inputs
        assert dataset.dataset.name == "data/corpora/smoke"
        assert "model/weights.pt" in {
            a.path for a in client.list_artifacts(found.info.run_id, "model")
        }
        assert found.info.artifact_uri.startswith(
            Path(uri.removeprefix("sqlite:///")).parent.as_uri()
        )
    alpha = cells["smoke/entmax_alpha/seed0"].info.run_id
    assert len(client.get_metric_history(alpha, "alpha/encoder.self.layer0/head0")) > 1
    ape = client.search_runs(
        [experiment.experiment_id], "tags.stage = 'train_ape' and attributes.status = 'FINISHED'"
    )
    assert ape and all("test/ter" in r.data.metrics for r in ape if "cell" in r.data.tags)


def test_the_mlflow_ui_opens_on_the_runs_table(
    repro: tuple[Path, str, str],
    tmp_path_factory: pytest.TempPathFactory,
    browse: Callable[[str, Path], str],
) -> None:
    """`python -m pipelines.commands.ui` on the e2e store, in a real browser: the experiment opens
    on its runs table (not MLflow 3's GenAI view), and the training runs sorted by BLEU show a row
    per cell with BLEU. Screenshots: $LEARNABLE_SPARSITY_SCREENSHOTS or a temporary folder."""
    repo, uri, _ = repro
    shots = Path(os.environ.get("LEARNABLE_SPARSITY_SCREENSHOTS") or tmp_path_factory.mktemp("ui"))
    shots.mkdir(parents=True, exist_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = environment(repo, uri)
    ui = subprocess.Popen(
        [sys.executable, "-m", "pipelines.commands.ui", "--port", str(port)],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = ui.stdout.readline()
        while line and "http://" not in line:
            line = ui.stdout.readline()
        address = line[line.index("http://") :].strip()
        assert address.endswith("?workflowType=machine_learning"), address
        runs_table = browse(address, shots / "runs.png")
        # The classic runs table, not the GenAI overview (Overview, Sessions, Detect Issues).
        assert ">Runs<" in runs_table and "Run Name" in runs_table
        assert "Sessions" not in runs_table and "Overview" not in runs_table
        for stage in ("train_nmt", "evaluate_nmt", "analyze_heads", "train_ape"):
            assert f">{stage}<" in runs_table, stage
        query = urllib.parse.urlencode(
            {
                "searchFilter": "tags.stage = 'train_nmt'",
                "orderByKey": "metrics.`test/bleu`",
                "orderByAsc": "false",
            }
        )
        by_bleu = browse(f"{address}&{query}", shots / "by_bleu.png")
        for variant in VARIANTS:
            assert f"smoke/{variant}/seed0" in by_bleu, variant
    finally:
        ui.terminate()
        ui.wait(timeout=30)


def test_second_repro_is_a_no_op(repro: tuple[Path, str, str]) -> None:
    _, _, second = repro
    assert "Data and pipelines are up to date" in second


def test_changing_an_imported_file_makes_its_stages_stale(repro: tuple[Path, str, str]) -> None:
    repo, uri, _ = repro
    env = environment(repo, uri)
    batching = repo / "learnable_sparsity/nmt/batching.py"
    original = batching.read_text()
    try:
        batching.write_text(original + "\n# an edit\n")
        status = run(["dvc", "status"], repo, env)
    finally:
        batching.write_text(original)
    stale = {line.rstrip(":") for line in status.splitlines() if line and not line[0].isspace()}
    # claims imports the head analysis, which imports the NMT batching; tables reads NMT cell
    # keys through learnable_sparsity/nmt/cells.py, and DVC deps are whole sub-packages
    assert stale == {
        "train_nmt",
        "evaluate_nmt",
        "analyze_heads",
        "speed",
        "synthetic_ape",  # translates with the NMT models
        "train_ape",  # trained and decoded by the NMT loop and beam search
        "evaluate_ape",
        "claims",
        "tables",
    }
    assert "Data and pipelines are up to date" in run(["dvc", "status"], repo, env)


# Stages whose outputs hold measured time: the speed table and the benchmark (and the claims and
# tables stages, which report the speed ratios). Every other output is a function of code, data
# and settings.
TIMED = {"speed", "benchmark_normalizers", "claims", "tables"}
# evaluate_nmt reads the speed numbers only to log them on the MLflow training runs.
TIMED_DEPS = ("results/speed/",)


def locked(repo: Path) -> dict:
    """dvc.lock's entries of the stages whose outputs must not depend on the run (less their
    dependencies on measured times)."""
    stages = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    return {
        name: {
            **stage,
            "deps": [d for d in stage.get("deps", []) if not d["path"].startswith(TIMED_DEPS)],
        }
        for name, stage in stages.items()
        if name not in TIMED
    }


# What `dvc repro train_nmt` runs: the killed copy's stages.
RAN = ("corpora", "bpe", "train_nmt")


def test_a_killed_repro_resumes_and_matches_an_uninterrupted_one(
    repro: tuple[Path, str, str], interrupted: tuple[Path, str, list[str]]
) -> None:
    repo, _, _ = repro
    killed_repo, killed_uri, cut = interrupted
    assert cut, "the kill came after every cell had finished: nothing was interrupted"
    # Same code, data and settings: byte-identical outputs, although cells were cut and resumed.
    # (The copy's dvc.lock holds the project's entries of the stages it did not run.)
    resumed, uninterrupted = locked(killed_repo), locked(repo)
    assert {name: resumed[name] for name in RAN} == {name: uninterrupted[name] for name in RAN}
    client = MlflowClient(killed_uri)
    experiment = client.get_experiment_by_name("learnable-sparsity").experiment_id
    runs = client.search_runs([experiment], max_results=1000)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    killed = [r for r in runs if r.info.status == "KILLED"]
    assert any(
        r.info.run_name == "train_nmt" and "is gone" in r.data.tags["end_reason"] for r in killed
    )
    cells = {
        r.data.tags["cell"]: r
        for r in runs
        if r.data.tags.get("stage") == "train_nmt" and "cell" in r.data.tags
    }
    for key in cut:  # one MLflow run per cell, continued after the kill
        assert (
            cells[key].info.status == "FINISHED" and cells[key].data.tags.get("resumed") == "true"
        )
        steps = [m.step for m in client.get_metric_history(cells[key].info.run_id, "loss")]
        assert set(steps) == {4, 8, 12}


def test_a_rerun_under_other_kernels_is_compared_with_the_committed_outputs(
    repro: tuple[Path, str, str], tmp_path: Path
) -> None:
    """What `make repro` ends with, on the ci profile under two kernel settings: a copy's native
    outputs committed, the semi-supervised VAE rerun with pinned kernels (make repro's
    PORTABLE_KERNELS) and the claims judged again; the comparison lists exactly the files git
    sees changed, each JSON's largest move as recomputed here, and the claims whose verdicts
    moved."""
    repo, _, _ = repro
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy, symlinks=True)
    env = environment(copy, f"sqlite:///{tmp_path / 'mlflow.db'}")
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid"]
    run([*git, "add", "-A"], copy, env)
    run([*git, "commit", "-qm", "native outputs"], copy, env)
    pinned = env | load_script("tools/kernel_settings.py").PORTABLE
    run(["dvc", "repro", "-f", "-s", "train_lvm@ssvae"], copy, pinned)
    run(["dvc", "repro", "claims"], copy, pinned)
    printed = run([sys.executable, "-m", "pipelines.commands.compare_outputs"], copy, env)
    report = json.loads((copy / "results" / "comparison.json").read_text())
    changed = run(["git", "diff", "--name-only", "HEAD", "--", "results", "reports", "dvc.lock"],
                  copy, env).split()  # fmt: skip
    assert sorted(entry["path"] for entry in report["files"]) == sorted(changed)
    assert f"{len(changed)} output file(s) differ" in printed
    for entry in report["files"]:
        if entry["kind"] != "json" or not entry["moved"]:
            continue
        before = json.loads(run(["git", "show", f"HEAD:{entry['path']}"], copy, env))
        after = json.loads((copy / entry["path"]).read_text())
        old = dict(compare_outputs.numbers_of(before))
        new = dict(compare_outputs.numbers_of(after))
        largest = max(abs(new[k] - old[k]) for k in old.keys() & new.keys())
        assert entry["max_abs"] == largest, entry["path"]
    claims = "results/claims/claims.json"
    old = {c["id"]: c["status"] for c in json.loads(run(["git", "show", f"HEAD:{claims}"],
                                                        copy, env))["claims"]}  # fmt: skip
    new = {c["id"]: c["status"] for c in json.loads((copy / claims).read_text())["claims"]}
    moved = {m["claim"] for m in report["moved_verdicts"] if m["before"] != m["after"]}
    assert moved == {claim for claim in old if old[claim] != new.get(claim)}


def test_changed_settings_code_and_inputs_rerun_what_depends_on_them(
    repro: tuple[Path, str, str],
) -> None:
    repo, uri, _ = repro
    env = environment(repo, uri)
    params = repo / "params.yaml"
    original = params.read_text()
    data = yaml.safe_load(original)
    # One method's learning rate: only its cells of the bit-vector VAE retrain.
    data["lvm"]["bitvector_vae"]["lr"]["gumbel"] = 0.004
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    log = run(["dvc", "repro", "train_lvm@bitvector_vae"], repo, env)
    assert "train_lvm/bitvector_vae: 1 cells to run, 2 reused" in log
    # A data transform of the images (a code file the cells import): every SSVAE cell retrains.
    images = repo / "learnable_sparsity/data/images.py"
    images.write_text(images.read_text() + "\n# an edit of the binarisation's module\n")
    log = run(["dvc", "repro", "train_lvm@ssvae"], repo, env)
    assert "train_lvm/ssvae: 3 cells to run, 0 reused" in log
    # A measurement rerun, then its settings back: `dvc repro --dry` must not claim that DVC's
    # run cache restores it (a speed measurement is not cached), and the stage does run.
    data["speed"]["rounds"] = 2
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    run(["dvc", "repro", "-s", "speed"], repo, env)
    params.write_text(original)
    dry = run(["dvc", "repro", "--dry", "-s", "speed"], repo, env)
    assert "Running stage 'speed'" in dry and "cached" not in dry
    # A file of the user's own data: the corpora stage is stale.
    (repo / "data/external/my.src").write_text("a line\n")
    status = run(["dvc", "status", "corpora"], repo, env)
    assert "corpora:" in status and "data/external" in status
