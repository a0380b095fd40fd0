"""The GPU record of the AST grid, rehearsed on the CPU: ``pipelines/commands/ast_grid.py`` at a
tiny size (the device command with ``--device cpu``): its preflight, the probe and the length chosen
by the profile's rule, the cells, a cut at the deadline; its output kept as a record
(``python -m pipelines.commands.record <name> --from-gpu``) with an MLflow run per cell, and the
record judged by stage ``rejudge``'s code. About 2 minutes on 2 cores."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from pipelines.commands.record import keep_gpu
from pipelines.scaffold import layout
from pipelines.scaffold.files import write_json
from pipelines.stages.report import rejudge

ROOT = Path(__file__).resolve().parents[2]
GRID = {
    "ladder": [300, 10**8],
    "safety": 1.25,
    "parallel": 3,
    "probe_warmup": 1,
    "probe_s": 2,
    "eval_reserve_s": 30,
    "margin_s": 5,
    "preflight_s": 60,
    "validations": 3,
    "checkpoints": 2,
}
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
    "gpu_grid": GRID,
}
# A planted preflight: pytest's -k selects it as the device's bf16 and resume tests.
PREFLIGHT = """
def test_nmt_step_in_bf16_matches_float32_cpu():
    assert {ok}

def test_nmt_training_resumes_cpu():
    pass
"""


@pytest.fixture(scope="module")
def ast_grid():
    return importlib.import_module("pipelines.commands.ast_grid")


def test_the_length_rule_reads_throughput_and_seconds_only(ast_grid) -> None:
    rule = inspect.signature(ast_grid.choose_length).parameters
    assert list(rule) == ["rates", "seconds", "waves", "ladder", "safety"]
    ladder = [1_640_000, 4_100_000, 8_200_000, 12_300_000, 16_400_000]
    # the slowest cell decides: 50K tokens/s, 380 s: 12.3M × 1.25 / 50K = 307.5 s fits, 16.4M not
    chosen = ast_grid.choose_length({"a": 50_000, "b": 90_000}, 380, 1, ladder, 1.25)
    assert chosen["rung"] == 12_300_000 and chosen["fits"] and chosen["slowest_cell"] == "a"
    assert chosen["seconds_needed"] == pytest.approx(307.5)
    # two waves of cells take twice the time
    assert ast_grid.choose_length({"a": 50_000}, 380, 2, ladder, 1.25)["rung"] == 4_100_000
    # nothing fits: the smallest rung, flagged
    tight = ast_grid.choose_length({"a": 1_000}, 100, 1, ladder, 1.25)
    assert tight["rung"] == 1_640_000 and not tight["fits"]


def test_decisions_record_the_rules_inputs_and_cells_run_seed_major(ast_grid, tmp_path) -> None:
    for key, rate in (("c/softmax/seed0", 900.0), ("c/entmax15/seed0", 600.0)):
        (tmp_path / key).mkdir(parents=True)
        (tmp_path / key / ast_grid.PROBE).write_text(json.dumps({"target_tokens_per_s": rate}))
    grid = {**GRID, "ladder": [1000, 10_000, 100_000]}
    times = {"stop_training": time.time() + 100}
    keys = ["c/softmax/seed0", "c/entmax15/seed0"]
    assert ast_grid.decide(tmp_path, keys, [*keys, "c/entmax_alpha/seed0"], grid, {}, times) is None
    plan = ast_grid.decide(tmp_path, keys, keys, grid, {"c": 150.0}, times)
    assert set(plan["inputs"]) == {"rates", "seconds", "waves"}
    assert plan["inputs"]["rates"] == {"c/softmax/seed0": 900.0, "c/entmax15/seed0": 600.0}
    assert plan["decision"]["rung"] == 10_000  # 10K × 1.25 / 600 = 21 s ≤ ~100 s; 100K not
    assert plan["train"] == {"max_steps": 67, "validate_every": 22, "checkpoint_every": 34}
    nmt = {"corpora": ["c"], "variants": ["softmax", "entmax_alpha"], "seeds": [0, 1]}
    assert ast_grid.cell_keys(nmt) == [
        "c/softmax/seed0",
        "c/entmax_alpha/seed0",
        "c/softmax/seed1",
        "c/entmax_alpha/seed1",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ladder": [10, 5]}, "gpu_grid.ladder must be increasing"),
        ({"safety": 0.5}, "gpu_grid.safety must be a float >= 1.0"),
        ({"probe_s": "20"}, "gpu_grid.probe_s must be a float"),
        ({"typo": 1}, "gpu_grid has unknown keys ['typo']"),
    ],
)
def test_bad_grid_settings_are_refused_naming_the_key(
    tmp_path: Path, change: dict, message: str
) -> None:
    done = _grid(tmp_path, {**TINY, "gpu_grid": {**GRID, **change}}, "--prepare")
    assert done.returncode != 0 and message in done.stderr


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
    command = [sys.executable, "-m", "pipelines.commands.ast_grid", "--profile", "tiny"]
    command += ["--profiles", str(profiles), "--data", str(tmp_path / "data"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=ROOT)


def _run(tmp_path: Path, profile: dict, limit_s: int, preflight_passes: bool) -> dict:
    """--prepare, then the device command on the CPU with a planted preflight."""
    assert _grid(tmp_path, profile, "--prepare").returncode == 0
    planted = tmp_path / "preflight_test.py"
    planted.write_text(PREFLIGHT.format(ok=preflight_passes))
    args = ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--device", "cpu"]
    args += ["--limit-s", str(limit_s), "--preflight", str(planted)]
    done = _grid(tmp_path, profile, *args)
    grid = json.loads((tmp_path / "out" / "grid.json").read_text())
    return {"done": done, "grid": grid}


def test_the_rehearsed_grid_is_kept_logged_and_judged(
    ast_grid, tmp_path: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path, TINY, limit_s=300, preflight_passes=True)
    assert run["done"].returncode == 0, run["done"].stderr[-3000:]
    grid, out = run["grid"], tmp_path / "out"
    assert grid["kernels"]["passed"] and grid["kernels"]["kernels"] == "fused"
    assert (out / "preflight.xml").is_file() and (out / "log.txt").is_file()
    length = grid["length"]
    assert length["decision"] == ast_grid.choose_length(**length["inputs"], **length["rule"])
    assert length["decision"]["rung"] == 300 and length["decision"]["fits"]
    assert set(length["inputs"]["rates"]) == set(grid["cells"])  # every cell probed at once
    assert grid["environment"]["device"] == "cpu"
    assert {cell["status"] for cell in grid["cells"].values()} == {"finished"}
    assert not any(cell["short"] for cell in grid["cells"].values())
    assert all(cell["target_tokens"] >= 300 for cell in grid["cells"].values())

    monkeypatch.chdir(tmp_path)
    folder, runs = keep_gpu("tiny-gpu", out, tracking=("gpu-record", mlflow_uri))
    assert folder == layout.record("tiny-gpu") and runs == 3
    meta = json.loads((folder / layout.RECORD_META).read_text())
    assert meta["length"]["decision"]["rung"] == 300
    assert meta["kernels"] == "fused"
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
    steps = length["train"]["max_steps"]
    history = client.get_metric_history(alpha.info.run_id, "valid_nll")
    every = length["train"]["validate_every"]
    assert [point.step for point in history] == [*range(every, steps, every), steps]
    assert "test/bleu" in alpha.data.metrics

    rejudge.main(_Files(), "tiny-gpu")
    verdicts = json.loads((folder / layout.RECORD_CLAIMS).read_text())
    by_id = {claim["id"]: claim for claim in verdicts["claims"]}
    turn = by_id["ast_dense_then_sparse"]
    assert turn["status"] == "not measurable"
    assert "entmax_alpha trained" in turn["evidence"]
    assert "speed stage" in by_id["est_topk_speed"]["evidence"]


def test_a_cut_returns_every_variant_flagged_with_its_log(tmp_path: Path) -> None:
    """A length that cannot fit (10⁸ target tokens) and a short call: every cell stops at the
    training deadline, is decoded and analysed, and is flagged; the failed preflight's rule ran
    the eager normalizers."""
    profile = {**TINY, "gpu_grid": {**GRID, "ladder": [10**8], "eval_reserve_s": 40}}
    # the cells' start (3 processes importing torch on 2 shared cores) and probes fit in the
    # 105 s before training must stop, with room for a loaded machine
    run = _run(tmp_path, profile, limit_s=150, preflight_passes=False)
    grid = run["grid"]
    assert not grid["kernels"]["passed"] and grid["kernels"]["kernels"] == "eager"
    assert not grid["length"]["decision"]["fits"]
    cells = grid["cells"]
    assert {key.split("/")[1] for key in cells} == {"softmax", "entmax15", "entmax_alpha"}
    for cell in cells.values():
        assert cell["status"] == "finished" and cell["short"], cell
        stopped = cell["summary"]["stopped_early"]
        assert cell["summary"]["steps"] < stopped["planned_steps"]
    with tarfile.open(tmp_path / "out" / "grid.tar.gz") as tar:
        names = set(tar.getnames())
    assert {f"cells/{key}/log.txt" for key in cells} <= names
    assert run["done"].returncode == 0, run["done"].stderr[-3000:]
