"""The user's own parallel corpus: plain-text files, one sentence per line, validated.

A corpus is six files, a source and a target file for each of the splits ``train``, ``valid``
and ``test`` (a prepared corpus: ``<split>.src`` / ``<split>.tgt`` in one directory, written by
:func:`write_corpus`, read by :func:`read_corpus`); line *i* of a source file is translated by
line *i* of its target file. An automatic post-editing (APE) corpus holds triplets instead: a
source, a machine translation of it and its human post-edit per line, in ``<split>.src`` /
``<split>.mt`` / ``<split>.pe`` (:data:`TRIPLET_FIELDS`), with splits of its own (e.g. the test
sets of several years); :func:`write_corpus` writes it too and :func:`read_triplets` reads it.

Files are UTF-8 (an initial byte-order mark is dropped) with ``\\n`` line ends (a ``\\r``
before it is dropped too); a final line end is optional. Only ``\\n`` separates lines: other
Unicode line separators stay inside a sentence. Leading and trailing whitespace of each line is
removed.

Every problem is reported as a :class:`~learnable_sparsity.errors.LearnableSparsityError` naming the file:
a missing file, bytes that are not UTF-8 (with the line number), a file without any line, empty
lines (their line numbers, up to ten, and how many there are) and the files of one split with
different numbers of lines (every file and its count).
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from learnable_sparsity.files import atomic_writer
from learnable_sparsity.errors import LearnableSparsityError

SPLITS: tuple[str, ...] = ("train", "valid", "test")
# The file extensions of one split of a prepared corpus, one per field of its rows: a parallel
# corpus holds (source, target) pairs, an APE corpus (source, MT output, post-edit) triplets.
PAIR_FIELDS: tuple[str, ...] = ("src", "tgt")
TRIPLET_FIELDS: tuple[str, ...] = ("src", "mt", "pe")
# How many offending line numbers an error message lists.
MAX_REPORTED_LINES = 10
Pairs = list[tuple[str, str]]
Triplets = list[tuple[str, str, str]]
Rows = Sequence[tuple[str, ...]]  # pairs or triplets: one string per field


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


def check_aligned(files: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Raise, naming every file and its line count, unless the ``(name, lines)`` of line-aligned
    files all have the same number of lines."""
    if len({len(lines) for _, lines in files}) > 1:
        counts = ", ".join(f"{name} has {len(lines)} lines" for name, lines in files)
        raise LearnableSparsityError(f"line-aligned files differ in length: {counts}")


def pair_lines(
    source_lines: list[str], target_lines: list[str], source_name: str, target_name: str
) -> Pairs:
    """Zip line-aligned source and target lines; raise, naming both files, if their counts
    differ."""
    check_aligned([(source_name, source_lines), (target_name, target_lines)])
    return list(zip(source_lines, target_lines, strict=True))


def align_lines(files: Sequence[tuple[str, list[str]]]) -> list[tuple[str, ...]]:
    """Rows of the ``(name, lines)`` of any number of line-aligned files (one string per file);
    raise, naming every file, if their counts differ."""
    check_aligned(files)
    return list(zip(*(lines for _, lines in files), strict=True))


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


def write_corpus(
    directory: Path,
    splits: Mapping[str, Iterable[tuple[str, ...]]],
    fields: Sequence[str] = PAIR_FIELDS,
) -> dict[str, Any]:
    """A ``<split>.<field>`` file for every split and field (atomically) and their description:
    sizes and the SHA-256 of every file.

    ``fields`` names the files of a split, one per element of its rows: :data:`PAIR_FIELDS` for
    a parallel corpus, :data:`TRIPLET_FIELDS` for an APE corpus. Each split's rows are read
    once, in one pass, so they may stream (:func:`aligned_line_stream`).
    """
    digests, sizes = {}, {}
    for split, rows in splits.items():
        names = [f"{split}.{field}" for field in fields]
        hashes = [hashlib.sha256() for _ in fields]
        count = 0
        with contextlib.ExitStack() as files:
            handles = [files.enter_context(atomic_writer(directory / name)) for name in names]
            for row in rows:
                if len(row) != len(fields):
                    raise LearnableSparsityError(
                        f"{split}: every row must hold one string per field {list(fields)}"
                    )
                for text, handle, digest in zip(row, handles, hashes, strict=True):
                    line = (text + "\n").encode("utf-8")
                    handle.write(line)
                    digest.update(line)
                count += 1
        sizes[split] = count
        digests.update({name: h.hexdigest() for name, h in zip(names, hashes, strict=True)})
    return {"sizes": sizes, "sha256": digests}


def aligned_line_stream(files: Sequence[tuple[str, Path]]) -> Iterator[tuple[str, ...]]:
    """The rows of line-aligned text files read line by line, never whole (inputs of several
    GB): one stripped string per file of ``(name, path)``, decoded as :func:`decode_lines`
    decodes; raises, naming the file and line, on undecodable text or when one file ends first.
    """
    with contextlib.ExitStack() as opened:
        handles = [opened.enter_context(path.open("rb")) for _, path in files]
        for number, lines in enumerate(itertools.zip_longest(*handles), start=1):
            if any(line is None for line in lines):
                ended = [name for (name, _), line in zip(files, lines, strict=True) if line is None]
                raise LearnableSparsityError(
                    f"line-aligned files differ in length: {ended} end after {number - 1} lines, "
                    f"the others go on ({[name for name, _ in files]})"
                )
            yield tuple(
                _decode_line(line, name, number)
                for (name, _), line in zip(files, lines, strict=True)
            )


def _decode_line(line: bytes, name: str, number: int) -> str:
    if number == 1 and line.startswith(codecs.BOM_UTF8):
        line = line[len(codecs.BOM_UTF8) :]
    try:
        return line.decode("utf-8").strip()
    except UnicodeDecodeError as err:
        raise LearnableSparsityError(
            f"{name}: line {number} is not valid UTF-8 ({err.reason} at byte {err.start})"
        ) from None


def read_corpus(directory: Path, splits: tuple[str, ...] = SPLITS) -> dict[str, Pairs]:
    """The ``splits`` written by :func:`write_corpus` (validated like a user's local corpus)."""
    return {
        split: read_parallel(directory / f"{split}.src", directory / f"{split}.tgt")
        for split in splits
    }


def read_triplets(directory: Path, splits: Sequence[str]) -> dict[str, Triplets]:
    """The (source, MT, post-edit) triplets of the ``splits`` of an APE corpus written by
    :func:`write_corpus` (``<split>.src`` / ``.mt`` / ``.pe``), validated like
    :func:`read_corpus`."""
    result = {}
    for split in splits:
        paths = [directory / f"{split}.{field}" for field in TRIPLET_FIELDS]
        source, mt, post_edit = (read_lines(path) for path in paths)
        check_aligned(list(zip(map(str, paths), (source, mt, post_edit), strict=True)))
        result[split] = list(zip(source, mt, post_edit, strict=True))
    return result
