"""The user's own parallel corpus: plain-text files, one sentence per line, validated.

A corpus is six files, a source and a target file for each of the splits ``train``, ``valid``
and ``test`` (a prepared corpus: ``<split>.src`` / ``<split>.tgt`` in one directory, written by
:func:`write_corpus`, read by :func:`read_corpus`); line *i* of a source file is translated by
line *i* of its target file. Files are UTF-8 (an initial byte-order mark is dropped) with
``\\n`` line ends (a ``\\r`` before it is dropped too); a final line end is optional. Only
``\\n`` separates lines: other Unicode line separators stay inside a sentence. Leading and
trailing whitespace of each line is removed.

Every problem is reported as a :class:`~components.errors.LearnableSparsityError` naming the file:
a missing file, bytes that are not UTF-8 (with the line number), a file without any line, empty
lines (their line numbers, up to ten, and how many there are) and source/target files of one
split with different numbers of lines (both files and both counts).
"""

from __future__ import annotations

import codecs
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.data.atomic import atomic_write_text
from components.errors import LearnableSparsityError

SPLITS: tuple[str, ...] = ("train", "valid", "test")
# How many offending line numbers an error message lists.
MAX_REPORTED_LINES = 10
Pairs = list[tuple[str, str]]


def decode_lines(data: bytes, name: str) -> list[str]:
    """The stripped lines of UTF-8 ``data``; ``name`` (a path or archive member) is for errors.

    A final line end does not start another line, so ``b"a\\nb\\n"`` has two lines. Empty lines
    are kept (see :func:`check_no_empty_lines`).
    """
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise LearnableSparsityError(
            f"{name}: line {line} is not valid UTF-8 ({err.reason} at byte {err.start})"
        ) from None
    if text.endswith("\n"):
        text = text[:-1]
    return [line.strip() for line in text.split("\n")] if text else []


def check_no_empty_lines(lines: list[str], name: str) -> None:
    """Raise if any of ``lines`` is empty, listing the first line numbers (1-based)."""
    empty = [number for number, line in enumerate(lines, start=1) if not line]
    if empty:
        shown = ", ".join(map(str, empty[:MAX_REPORTED_LINES]))
        more = ", …" if len(empty) > MAX_REPORTED_LINES else ""
        raise LearnableSparsityError(
            f"{name}: {len(empty)} empty line(s), at line(s) {shown}{more}; every line must hold "
            "a sentence (remove the pair from both files)"
        )


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """The lines of a corpus file, validated: it exists, is UTF-8, and has no empty line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise LearnableSparsityError(f"corpus file {path} does not exist") from None
    except IsADirectoryError:
        raise LearnableSparsityError(f"corpus file {path} is a directory") from None
    lines = decode_lines(data, str(path))
    if not lines:
        raise LearnableSparsityError(f"corpus file {path} is empty")
    check_no_empty_lines(lines, str(path))
    return lines


def read_parallel(
    source: str | os.PathLike[str], target: str | os.PathLike[str]
) -> list[tuple[str, str]]:
    """(source, target) pairs of two line-aligned files, validated by :func:`read_lines`."""
    return pair_lines(read_lines(source), read_lines(target), str(source), str(target))


def pair_lines(
    source_lines: list[str], target_lines: list[str], source_name: str, target_name: str
) -> list[tuple[str, str]]:
    """Zip line-aligned source and target lines; raise, naming both files, if their counts
    differ."""
    if len(source_lines) != len(target_lines):
        raise LearnableSparsityError(
            f"parallel files differ in length: {source_name} has {len(source_lines)} lines, "
            f"{target_name} has {len(target_lines)}"
        )
    return list(zip(source_lines, target_lines, strict=True))


def load_local_corpus(
    files: Mapping[str, tuple[str | os.PathLike[str], str | os.PathLike[str]]],
) -> dict[str, list[tuple[str, str]]]:
    """Pairs per split from ``files = {split: (source path, target path)}``.

    ``files`` must name exactly the splits ``train``, ``valid`` and ``test``.
    """
    missing = [split for split in SPLITS if split not in files]
    unknown = [split for split in files if split not in SPLITS]
    if missing or unknown:
        raise LearnableSparsityError(
            f"local corpus needs the splits {list(SPLITS)}; missing {missing}, unknown {unknown}"
        )
    return {split: read_parallel(*files[split]) for split in SPLITS}


def write_corpus(directory: Path, splits: Mapping[str, Pairs]) -> dict[str, Any]:
    """``<split>.src`` / ``<split>.tgt`` files (atomically) and their description: sizes and
    the SHA-256 of every file."""
    digests = {}
    for split in SPLITS:
        for side, index in (("src", 0), ("tgt", 1)):
            text = "".join(pair[index] + "\n" for pair in splits[split])
            atomic_write_text(directory / f"{split}.{side}", text)
            digests[f"{split}.{side}"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return {"sizes": {split: len(splits[split]) for split in SPLITS}, "sha256": digests}


def read_corpus(directory: Path, splits: tuple[str, ...] = SPLITS) -> dict[str, Pairs]:
    """The ``splits`` written by :func:`write_corpus` (validated like a user's local corpus)."""
    return {
        split: read_parallel(directory / f"{split}.src", directory / f"{split}.tgt")
        for split in splits
    }
