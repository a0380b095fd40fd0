"""The pieces of tools/kernel_settings.py (the pipeline under several CPU-kernel settings: minutes,
so not run here; its results are reports/measurements/kernel_settings/): which settings gave the
same bytes, which files differ, and that every setting it runs is one the docs describe."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
kernel_settings = load_script("tools/kernel_settings.py")


def run(setting: str, **files: str) -> dict:
    return {"setting": setting, "outputs": {"dvc.lock": "lock", **files}}


def test_settings_are_grouped_by_identical_bytes_and_the_differing_files_named() -> None:
    runs = [
        run("native", **{"results/a.json": "1"}),
        run("portable", **{"results/a.json": "2"}),
        run("portable_on_avx2_machine", **{"results/a.json": "2"}),
        run("avx2_machine", **{"results/a.json": "3", "results/b.json": "4"}),
        run("native", **{"results/a.json": "1"}),
    ]
    assert kernel_settings.identical_groups(runs) == [
        ["avx2_machine"],
        ["native", "native"],
        ["portable", "portable_on_avx2_machine"],
    ]
    assert kernel_settings.differing_files(runs, "native", "avx2_machine") == [
        "results/a.json",
        "results/b.json",
    ]
    assert kernel_settings.differing_files(runs, "portable", "portable_on_avx2_machine") == []


def test_the_portable_settings_are_make_repros() -> None:
    makefile = (ROOT / "Makefile").read_text()
    pinned = " ".join(f"{key}={value}" for key, value in kernel_settings.PORTABLE.items())
    assert f"PORTABLE_KERNELS := {pinned}\n" in makefile
    assert "KERNEL_ENV := $(if $(filter portable,$(KERNELS)),$(PORTABLE_KERNELS))" in makefile
    on_avx2 = kernel_settings.SETTINGS["portable_on_avx2_machine"]
    assert on_avx2["ATEN_CPU_CAPABILITY"] == "default"  # the pin wins over the machine's
    assert on_avx2["ONEDNN_MAX_CPU_ISA"] == "SSE41"  # a cap below the machine's: the pin's
