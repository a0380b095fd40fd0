"""The GPU record of the AST grid, rehearsed on the CPU: ``benchmarks/gpu/ast_grid.py`` at a tiny
size (the device command with ``--device cpu``), its output kept as a record
(``python -m pipelines.record <name> --from-gpu``) with an MLflow run per cell, and the record
judged by stage ``rejudge``'s code. About 40 s on 2 cores (three cells, two at a time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from pipelines import rejudge
from pipelines.record import keep_gpu
from pipelines.scaffold import layout
from pipelines.scaffold.files import write_json

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "ast_grid.py"
TINY = {
    "corpora": {
        "smoke": {
            "source": "generated",
            "sizes": {"train": 600, "valid": 30, "test": 30, "heldout": 10},
            "seed": 0,
        }
    },
    "bpe": {"vocab_size": 200},
    "nmt": {
        "corpora": ["smoke"],
        "variants": ["softmax", "entmax15", "entmax_alpha"],
        "seeds": [0],
        "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "enc_layers": 1, "dec_layers": 1},
        "train": {
            "max_steps": 12,
            "max_tokens": 400,
            "warmup": 4,
            "log_every": 2,
            "validate_every": 4,
            "checkpoint_every": 4,
        },
        "decode": {"batch_sentences": 30, "beam_size": 2},
    },
    "analysis": {"max_sentences": 20},
    "gpu_grid": {"target_tokens": 1000, "parallel": 2},
}


class _Files:
    """The part of a Stage that rejudge uses: its outputs, without an MLflow run."""

    def write_json(self, path: Path, data: object, artifact: str | None = None) -> None:
        write_json(path, data)

    def write_text(self, path: Path, text: str, artifact: str | None = None) -> None:
        path.write_text(text, encoding="utf-8")


def _grid(tmp_path: Path, profile: dict, *args: str) -> subprocess.CompletedProcess:
    profiles = tmp_path / "profiles"
    profiles.mkdir(exist_ok=True)
    (profiles / "tiny.yaml").write_text(yaml.safe_dump(profile))
    command = [sys.executable, str(SCRIPT), "--profile", "tiny", "--profiles", str(profiles)]
    command += ["--data", str(tmp_path / "data"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_the_prepared_length_must_reach_the_preregistered_one(tmp_path: Path) -> None:
    profile = {**TINY, "gpu_grid": {"target_tokens": 10**9, "parallel": 1}}
    done = _grid(tmp_path, profile, "--prepare")
    assert done.returncode != 0
    assert "fewer than the pre-registered gpu_grid.target_tokens 1000000000" in done.stderr


def test_the_rehearsed_grid_is_kept_logged_and_judged(
    tmp_path: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _grid(tmp_path, TINY, "--prepare").returncode == 0
    out = tmp_path / "out"
    args = ("--out", str(out), "--work", str(tmp_path / "work"), "--device", "cpu")
    done = _grid(tmp_path, TINY, *args, "--budget-s", "240")
    assert done.returncode == 0, done.stderr[-3000:]
    grid = json.loads((out / "grid.json").read_text())
    assert grid["length"]["preregistered_target_tokens"] == 1000
    assert grid["environment"]["device"] == "cpu"
    assert {cell["status"] for cell in grid["cells"].values()} == {"finished"}
    assert all(cell["target_tokens"] >= 1000 for cell in grid["cells"].values())

    monkeypatch.chdir(tmp_path)
    folder, runs = keep_gpu("tiny-gpu", out, tracking=("gpu-record", mlflow_uri))
    assert folder == layout.record("tiny-gpu") and runs == 3
    meta = json.loads((folder / layout.RECORD_META).read_text())
    assert meta["length"]["preregistered_target_tokens"] == 1000
    assert meta["environment"]["device"] == "cpu" and meta["profile"] == "tiny"
    assert "ast_entmax_bleu" in meta["thresholds"]
    index = (folder / "index.md").read_text()
    assert "| smoke/entmax_alpha/seed0 | finished |" in index
    assert (folder / "figures" / "smoke" / "seed0" / "alpha_histograms.png").is_file()

    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("gpu-record")
    logged = client.search_runs([experiment.experiment_id], "tags.record = 'tiny-gpu'")
    cells = {run.data.tags["cell"]: run for run in logged if "cell" in run.data.tags}
    assert sorted(cells) == sorted(grid["cells"])
    alpha = cells["smoke/entmax_alpha/seed0"]
    history = client.get_metric_history(alpha.info.run_id, "valid_nll")
    assert [point.step for point in history] == [4, 8, 12]
    assert "test/bleu" in alpha.data.metrics

    rejudge.main(_Files(), "tiny-gpu")
    verdicts = json.loads((folder / layout.RECORD_CLAIMS).read_text())
    by_id = {claim["id"]: claim for claim in verdicts["claims"]}
    turn = by_id["ast_dense_then_sparse"]
    assert turn["status"] == "not measurable"
    assert "entmax_alpha trained" in turn["evidence"]
    assert "speed stage" in by_id["est_topk_speed"]["evidence"]
