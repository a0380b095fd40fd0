"""Atomic file writes: readers see the old file or the complete new one, never a partial one."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from learnable_sparsity.errors import LearnableSparsityError

# A disk or a quota that is full.
_FULL = (errno.ENOSPC, errno.EDQUOT)
# The temporary files are ".<name>.<random><PARTIAL_SUFFIX>": removed by the writer when it fails,
# left behind only when its process is killed (see remove_partial_writes).
PARTIAL_SUFFIX = ".tmp"


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary handle on a temporary file beside ``path``, renamed onto ``path`` when the block
    ends without an error (removed otherwise): a file written piece by piece, still atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX)
    try:
        # mkstemp creates 0600 files; give the result the permissions of an ordinary new file.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in _FULL:
            # The first line a user reads (a failed grid cell shows it above the cell's
            # settings) names the disk that is full, not only the traceback's last frame.
            raise LearnableSparsityError(
                f"no space left on {path.parent} (writing {path.name}): {error.strerror}; free "
                "space there (or move it elsewhere) and rerun: the write before it is intact"
            ) from error
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it onto ``path``."""
    with atomic_writer(path) as handle:
        handle.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def remove_partial_writes(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files that writers killed mid-write left under ``directory`` (and
    return them). Call it only while no writer can be at work there (e.g. under the lock of the
    directory's owner): a resumed run must leave the same files as one never interrupted."""
    partial = sorted(Path(directory).rglob(f".*{PARTIAL_SUFFIX}"))
    for path in partial:
        path.unlink(missing_ok=True)
    return partial
