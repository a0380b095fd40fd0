"""Atomic writes: a writer that fails leaves nothing; one killed mid-write leaves a temporary
file that remove_partial_writes finds (and nothing else it finds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from learnable_sparsity.data.atomic import atomic_write_text, atomic_writer, remove_partial_writes

KILLED_WRITER = """
import os, sys
from learnable_sparsity.data.atomic import atomic_writer
with atomic_writer(sys.argv[1]) as handle:
    handle.write(b"half")
    handle.flush()
    os._exit(9)  # as SIGKILL would: no clean-up runs
"""


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = atomic_write_text(tmp_path / "a.json", "old")
    with pytest.raises(RuntimeError), atomic_writer(target) as handle:
        handle.write(b"new")
        raise RuntimeError("disk full")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_the_leftovers_of_a_killed_writer_are_found_and_removed(tmp_path: Path) -> None:
    (tmp_path / "cell").mkdir()
    kept = [atomic_write_text(tmp_path / "cell" / "last.pt", "whole"), tmp_path / "notes.tmp"]
    kept[1].write_text("a user's file, not a partial write")
    root = Path(__file__).resolve().parents[2]
    for target in (tmp_path / "cell" / "last.pt", tmp_path / "cell" / "deep" / "step4.pt"):
        result = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(target)], cwd=root)
        assert result.returncode == 9
    partial = remove_partial_writes(tmp_path)
    assert sorted(p.parent.name for p in partial) == ["cell", "deep"]
    assert all(p.name.startswith((".last.pt.", ".step4.pt.")) for p in partial)
    assert not any(p.exists() for p in partial) and all(p.exists() for p in kept)
    assert kept[0].read_text() == "whole"
