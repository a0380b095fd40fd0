"""The benchmark scripts run end to end at a tiny size and write their JSON (they must not rot)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("script", "arguments", "expected_rows"),
    [
        ("normalizers.py", ["--lengths", "16", "--repeats", "1"], 9),
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
