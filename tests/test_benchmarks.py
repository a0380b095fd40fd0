"""The benchmark scripts run end to end at a tiny size and write their JSON (they must not rot)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from learnable_sparsity.timing import NOISY_RELATIVE_SPREAD
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("script", "arguments", "expected_rows"),
    [
        ("marginalization.py", ["--dims", "6", "--batch", "3", "--repeats", "1"], 3 + 7),
    ],
)
def test_benchmark_writes_its_table(
    script: str, arguments: list[str], expected_rows: int, tmp_path: Path
) -> None:
    out = tmp_path / "result.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *arguments, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    payload = json.loads(out.read_text())
    assert len(payload["results"]) == expected_rows
    assert payload["torch"] and payload["threads"] >= 1
    assert "|" in completed.stdout


QUANTITIES = ("forward", "backward", "forward_backward")


def test_normalizer_rows_hold_per_round_ratios_spread_and_the_noisy_flag(tmp_path: Path) -> None:
    out = tmp_path / "normalizers.json"
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "pipelines.stages.report.benchmark_normalizers"),
            *("--lengths", "8", "--rounds", "3", "--repeats", "1", "--threads", "1"),
            *("--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr  # noisy or not, the output is written
    payload = json.loads(out.read_text())
    assert payload["torch"] and payload["threads"] == 1 and len(payload["results"]) == 13
    rows = {row["function"]: row for row in payload["results"]}
    for row in rows.values():
        assert row["key_length"] == 8 and row["rounds"] == 3
        for key in ("max_abs_error_vs_fp64", "eager_mean_iterations", "noisy"):
            assert key in row
        for quantity in QUANTITIES:
            ratios = row[f"{quantity}_ratio_each_round"]
            times = row[f"{quantity}_ms_each_round"]
            assert len(ratios) == len(times) == 3 and all(t > 0 for t in times)
            assert row[f"{quantity}_ratio"] == statistics.median(ratios)
            assert row[f"{quantity}_ms"] == statistics.median(times)
            q1, q3 = row[f"{quantity}_ratio_quartiles"]
            assert min(ratios) <= q1 <= row[f"{quantity}_ratio"] <= q3 <= max(ratios)
            assert row[f"{quantity}_ratio_range"] == [min(ratios), max(ratios)]
            assert row[f"{quantity}_noisy"] == (
                row[f"{quantity}_relative_spread"] > NOISY_RELATIVE_SPREAD
            )
        assert row["noisy"] == any(row[f"{q}_noisy"] for q in QUANTITIES)
    # ours twice: on the fused kernels and on the eager solvers, both exact
    eager = [name for name in rows if name.endswith("eager)")]
    assert len(eager) == 4
    for name in ["sparsemax", "entmax15", "entmax (learned α)", "topk_softmax (k=8)", *eager]:
        assert rows[name]["max_abs_error_vs_fp64"] <= 1e-5, name
    # each round's ratio divides by the softmax of the same round
    softmax = rows["torch.softmax"]
    assert softmax["forward_backward_ratio_each_round"] == [1.0, 1.0, 1.0]
    sparsemax = rows["sparsemax"]
    assert sparsemax["forward_ratio_each_round"] == pytest.approx(
        [
            s / b
            for s, b in zip(
                sparsemax["forward_ms_each_round"], softmax["forward_ms_each_round"], strict=True
            )
        ]
    )
    # the speed-up over entmax_bisect (50 it.), on our α-entmax rows only
    ours = rows["entmax (learned α)"]
    bisect = rows["entmax pkg bisect n_iter=50"]["forward_backward_ms_each_round"]
    speedups = [b / o for b, o in zip(bisect, ours["forward_backward_ms_each_round"], strict=True)]
    assert ours["speedup_vs_entmax_bisect_50_each_round"] == pytest.approx(speedups)
    assert ours["speedup_vs_entmax_bisect_50"] == pytest.approx(statistics.median(speedups))
    assert [name for name, row in rows.items() if "speedup_vs_entmax_bisect_50" in row] == [
        "entmax (learned α)"
    ]
    noisy = [row for row in rows.values() if row["noisy"]]
    assert ("ratio(s) are noisy" in completed.stderr) == bool(noisy)
    header, _rule, *lines = [line for line in completed.stdout.splitlines() if line.startswith("|")]
    assert "f+b/sm IQR" in header and "spread" in header and len(lines) == 13
    assert sum("NOISY" in line for line in lines) == len(noisy)


def test_the_gpu_page_is_generated_from_the_committed_run() -> None:
    """docs/gpu-benchmarks.md holds no number by hand: regenerating it changes nothing."""
    report = load_script("benchmarks/gpu/report.py")
    page = (ROOT / "docs/gpu-benchmarks.md").read_text()
    assert page == report.render(ROOT / "results/benchmarks"), "run benchmarks/gpu/report.py"


def test_the_footprint_probe_reads_an_environment() -> None:
    """``library_footprint.py`` runs its probe in the environments it makes (minutes); here the
    probe reads this one: torch's closure, what lies beyond it, and a distribution's own bytes."""
    completed = subprocess.run(
        [sys.executable, str(ROOT / "tools/footprint_probe.py"), "learnable-sparsity"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    found = json.loads(completed.stdout)
    assert {"torch", "learnable-sparsity", "mlflow"} <= set(found["distributions"])
    assert "mlflow" in found["beyond_torch"] and "torch" not in found["beyond_torch"]
    assert "filelock" not in found["beyond_torch"]  # torch requires it
    assert 0 < found["own_bytes"] < found["torch_closure_bytes"]


def test_the_mutation_count_reads_mutmuts_results(tmp_path: Path) -> None:
    """``mutation.py`` runs mutmut for minutes; here its count reads results laid out as mutmut
    leaves them: per file ``mutants/<path>.meta``, each mutant's exit code."""
    mutation = load_script("tools/mutation.py")
    meta = tmp_path / "learnable_sparsity/claims/checks.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {
        "m.x_f__mutmut_1": 1,
        "m.x_f__mutmut_2": 0,
        "m.x_g__mutmut_1": 36,
        "m.x_g__mutmut_2": None,
    }
    meta.write_text(json.dumps({"exit_code_by_key": codes}))
    outcomes = {"1": "killed", "0": "survived", "36": "timeout", "None": "not checked"}
    assert mutation.summarize(tmp_path, outcomes) == {
        "learnable_sparsity/claims/checks.py": {
            "mutants": 4,
            "killed": 1,
            "survived": 1,
            "timeout": 1,
            "other": {"not checked": 1},
            "survivors": ["m.x_f__mutmut_2"],
        }
    }


def test_the_prewarm_expects_adasplash_s_bf16_compile_failure_only() -> None:
    """The H100 run's prewarm failures (results/benchmarks/gpu_run.log) are all AdaSplash's bf16
    ``triton_entmax`` compile error, which ``prewarm.py`` now reports as expected; the same
    error of another task, or another error of that task, is not."""
    prewarm = load_script("benchmarks/gpu/prewarm.py")
    failures = [
        line.split("] worker ", 1)[1].split(": ", 1)[1].split(": FAILED ", 1)
        for line in (ROOT / "results/benchmarks/gpu_run.log").read_text().splitlines()
        if "prewarm] worker" in line and ": FAILED " in line
    ]
    assert len(failures) == 16
    for task, error in failures:
        assert prewarm.expected_failure(task, error), task
        assert prewarm.expected_to_fail(task)
    task, error = failures[0]
    assert prewarm.expected_failure(task.replace("bfloat16", "float32"), error) is None
    assert prewarm.expected_failure(task, "OutOfResources: shared memory") is None
    assert prewarm.expected_to_fail("ours entmax d=1024 bfloat16") is None
