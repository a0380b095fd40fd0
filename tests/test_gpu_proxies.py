"""``benchmarks/gpu_proxies.py`` end to end (``--quick``, ~1 min on 2 cores): its JSON, and each
change of issues 37 and 44 no worse after than before by the proxies that do not depend on
timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("triton", reason="the compiled proxies need Triton (a test-only dependency)")


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("proxies") / "gpu_proxies.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_proxies.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_driver_writes_every_section_before_and_after(proxies: dict[str, Any]) -> None:
    assert proxies["baseline"] and proxies["commit"] and proxies["quick"] is True
    assert proxies["environment"]["torch"] and proxies["environment"]["triton"]
    scripts = sorted((ROOT / "benchmarks" / "gpu").glob("proxy_*.py"))
    assert set(proxies["sections"]) == {s.stem.removeprefix("proxy_") for s in scripts}
    for name, section in proxies["sections"].items():
        assert set(section) == {"before", "after"}, name
        for side, result in section.items():
            assert "error" not in result, (name, side, result.get("error"))


def test_the_normalizer_kernels_are_no_worse_after(proxies: dict[str, Any]) -> None:
    before = proxies["sections"]["normalizers"]["before"]
    after = proxies["sections"]["normalizers"]["after"]
    old, new = before["compiled"]["entmax_f32/d=1024"], after["compiled"]["entmax_f32/d=1024"]
    assert new["registers"] <= old["registers"] and new["spill_bytes"] <= old["spill_bytes"]
    assert new["loop_instructions_per_element"] <= old["loop_instructions_per_element"]
    assert new["f64_ptx_lines"] == 0, "the float32 kernel carries no float64 solve (item 5)"
    for call, measured in after["host"]["cuda_path"].items():
        baseline = before["host"]["cuda_path"][call]
        assert measured["host_reads"] <= baseline["host_reads"], call
        assert measured["cast_kernels"] <= baseline["cast_kernels"], call
        assert measured["host_reads"] == 0, f"{call}: a wait for the GPU per call (item 4)"
        assert measured["cast_kernels"] == 0, f"{call}: cast kernels around the kernel (item 6)"
    for key, passes in after["passes"].items():
        assert passes["max"] <= before["passes"][key]["max"], key


def test_the_attention_kernels_are_no_worse_after(proxies: dict[str, Any]) -> None:
    """--quick compiles the causal forward: no more spills than before, and the launch order
    of causal query tiles (item 8) brings the modelled causal makespan to half the non-causal
    one at L = 16,384, where the first-to-last order left it at 0.79."""
    before = proxies["sections"]["attention"]["before"]
    after = proxies["sections"]["attention"]["after"]
    old, new = before["compiled"]["forward/causal=True"], after["compiled"]["forward/causal=True"]
    assert new["spill_bytes"] <= old["spill_bytes"]
    assert new["loop_sass_instructions"] <= old["loop_sass_instructions"]
    assert after["causal_schedule"]["causal_tiles_last_first"]
    assert after["causal_schedule"]["L=16384"]["ratio"] == pytest.approx(0.5, abs=0.02)
    assert before["causal_schedule"]["L=16384"]["ratio"] > 0.75
    assert after["masked_tiles"]["share"] < 0.01 < before["masked_tiles"]["share"]


def test_the_float32_attention_kernels_do_not_spill(proxies: dict[str, Any]) -> None:
    """--quick compiles the causal forward for float32 Q/K/V at head size 64 too: the tree's
    launch for float32 (fused_attention.launch) compiles without register spills, where the
    64 × 64 tiles on 4 warps of the bf16 launch spilled (31 KB of stores per thread)."""
    before = proxies["sections"]["attention"]["before"]
    after = proxies["sections"]["attention"]["after"]
    assert after["launch"]["fp32"] != after["launch"]["bf16"]
    assert after["compiled"]["fp32/forward/causal=True"]["spill_bytes"] == 0
    assert after["compiled"]["forward/causal=True"]["spill_bytes"] == 0
    assert before["compiled"]["fp32/forward/causal=True"]["spill_bytes"] > 10_000
