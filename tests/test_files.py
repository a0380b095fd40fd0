"""The library's file I/O. Atomic writes: a writer that fails leaves nothing; one killed mid-write
leaves a temporary file that remove_partial_writes finds (and nothing else it finds). Torch files
load as plain data only: a tampered file that would run code is refused."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.files import (
    atomic_write_text,
    atomic_writer,
    load_file,
    remove_partial_writes,
)

KILLED_WRITER = """
import os, sys
from learnable_sparsity.files import atomic_writer
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


def test_a_full_disk_is_named_in_the_first_line(tmp_path: Path) -> None:
    """Issue 38: after a full disk the path appeared only deep in the traceback; the error a
    failed cell shows first now says which directory has no space left."""
    target = atomic_write_text(tmp_path / "last.pt", "old")
    with pytest.raises(LearnableSparsityError) as raised, atomic_writer(target) as handle:
        handle.write(b"new")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    first = str(raised.value).splitlines()[0]
    assert first.startswith(f"no space left on {tmp_path} (writing last.pt)")
    assert isinstance(raised.value.__cause__, OSError)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_the_leftovers_of_a_killed_writer_are_found_and_removed(tmp_path: Path) -> None:
    (tmp_path / "cell").mkdir()
    kept = [atomic_write_text(tmp_path / "cell" / "last.pt", "whole"), tmp_path / "notes.tmp"]
    kept[1].write_text("a user's file, not a partial write")
    root = Path(__file__).resolve().parents[1]
    for target in (tmp_path / "cell" / "last.pt", tmp_path / "cell" / "deep" / "step4.pt"):
        result = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(target)], cwd=root)
        assert result.returncode == 9
    partial = remove_partial_writes(tmp_path)
    assert sorted(p.parent.name for p in partial) == ["cell", "deep"]
    assert all(p.name.startswith((".last.pt.", ".step4.pt.")) for p in partial)
    assert not any(p.exists() for p in partial) and all(p.exists() for p in kept)
    assert kept[0].read_text() == "whole"


def _touch(path: Path) -> None:
    path.touch()


class _TouchOnLoad:
    """Unpickled, it creates a file: what a tampered checkpoint could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (_touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    tampered = tmp_path / "last.pt"
    torch.save({"model": {"w": torch.ones(2)}, "step": 3, "x": _TouchOnLoad(marker)}, tampered)
    refused = r"last\.pt refused: it holds (tests\.)?test_files\._touch, not plain data"
    with pytest.raises(LearnableSparsityError, match=refused):
        load_file(tampered)
    assert not marker.exists()
    # the same file, loaded the unsafe way, does run it: the test's premise
    torch.load(tampered, weights_only=False)
    assert marker.exists()
