"""The library's file I/O: atomic writes, file digests, torch files saved canonically and loaded as
plain data only.

* **Atomic writes.** Readers see the old file or the complete new one, never a partial one
  (temporary file beside the target + rename); a full disk is named in the error's first line.
* **Digests.** :func:`sha256_of` is the digest of a file used throughout (pinned downloads, the
  inputs the pipelines record).
* **Torch files** (checkpoints, stored datasets). :func:`save_atomic` writes a canonical form, so
  equal states give equal bytes; :func:`load_file` unpickles plain data only (a file that names
  another Python object is refused: these files travel, and unpickling can run code).

torch is imported by the two torch functions only: the writers and the digest stay light for the
torch-free stages and modules that use them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import pickle
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from learnable_sparsity.errors import LearnableSparsityError

if TYPE_CHECKING:
    import torch

# A disk or a quota that is full.
_FULL = (errno.ENOSPC, errno.EDQUOT)
# The temporary files are ".<name>.<random><PARTIAL_SUFFIX>": removed by the writer when it fails,
# left behind only when its process is killed (see remove_partial_writes).
PARTIAL_SUFFIX = ".tmp"
_DIGEST_BLOCK = 1 << 20  # bytes read at a time: a file of any size is hashed in bounded memory
# The opening of torch's paragraphs around a refused file (weights_only advice, documentation).
_TORCH_ADVICE = ("Weights only load failed", "Check the documentation of torch.load")


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


def sha256_of(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_DIGEST_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` through a temporary file and a rename, in a canonical
    form: equal states give equal bytes."""
    import torch

    buffer = io.BytesIO()
    torch.save(_canonical(obj), buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_file(
    path: Path, map_location: str | torch.device = "cpu", *, what: str = "checkpoint"
) -> Any:
    """``torch.load`` of a file this project wrote (``what``: a checkpoint, a dataset), as plain
    data only (``weights_only``: tensors, numbers, strings, containers — all a checkpoint or a
    dataset holds). Checkpoints travel (a DVC remote, MLflow artifacts, a colleague's folder),
    and unpickling anything else can run code: a file naming another Python object is refused,
    naming it. An unreadable file raises naming it."""
    import torch

    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise LearnableSparsityError(f"{what} {path} does not exist") from None
    except pickle.UnpicklingError as error:
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)", str(error))
        if found:
            raise LearnableSparsityError(
                f"{what} {path} refused: it holds {found[1]}, not plain data (tensors, numbers, "
                "strings, containers), and loading it could run code"
            ) from None
        detail = re.search(r"WeightsUnpickler error: (.+)", str(error))
        # torch's own paragraphs advise weights_only=False, which would run the file's code
        ours = [
            part.strip()
            for part in str(error).split("\n\n")
            if part.strip() and not part.strip().startswith(_TORCH_ADVICE)
        ]
        reason = detail[1].strip() if detail else (ours or ["not plain data"])[0]
        raise LearnableSparsityError(f"{what} {path} cannot be read: {reason}") from None
    except Exception as error:
        raise LearnableSparsityError(f"{what} {path} cannot be read: {error}") from None


def _canonical(obj: Any) -> Any:
    """``obj`` rebuilt so that pickle writes it the same way whatever objects it shared: every
    string interned (shared), every dict, list and tuple a fresh copy (not shared). An
    uninterrupted run holds shared literals where a resumed one holds copies loaded from its
    checkpoint, so the same state would otherwise be written as different bytes."""
    if type(obj) is str:
        return sys.intern(obj)
    if isinstance(obj, dict):
        copy = type(obj)((_canonical(k), _canonical(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):  # a module's state dict carries its version metadata
            copy._metadata = _canonical(obj._metadata)
        return copy
    if type(obj) in (list, tuple):
        return type(obj)(_canonical(value) for value in obj)
    return obj
