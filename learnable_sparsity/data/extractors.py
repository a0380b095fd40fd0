"""Extractors: turn the downloaded files of a corpus into rows per split.

An :class:`Extractor` maps the downloaded files of a corpus (by file name) to the rows of each
split: (source, target) pairs for a parallel corpus, (source, MT, post-edit) triplets for an
automatic post-editing corpus. Four layouts cover the corpora of
:mod:`learnable_sparsity.data.registry`:

* :class:`ParquetTranslations` — Hugging Face translation parquet files (shards concatenated),
  read with ``pyarrow`` (installed with MLflow);
* :class:`TextFiles` — line-aligned plain-text source/target files, loose or inside an archive;
* :class:`Wit3Archive` — an IWSLT release from WIT3: ``train.tags`` transcripts and XML
  ``<seg>`` dev/test documents;
* :class:`AlignedMembers` — line-aligned plain-text files, one per field (e.g. ``.src``,
  ``.mt``, ``.pe``), inside one or more archives, a split possibly concatenated from several
  releases (the WMT APE data).

:func:`read_members` reads members of a zip (``zipfile``) or tar(.gz) (``tarfile``) archive by
path suffix, looking into archives inside the archive too (a repository's "all files of the item"
zip holds the published archives), each wanted file given as one suffix or as alternatives (the
names a release used) that must match exactly one file; the log names the file each matched.
Text is kept as published apart from stripping whitespace at line ends and decoding XML entities
in WIT3 ``<seg>`` elements: no tokenization, truecasing or length filter. Undecodable text,
line-aligned files of different lengths, a file that is neither a zip nor a tar archive, an
archive member that is missing or ambiguous and a parquet file without the language fields raise
a :class:`~learnable_sparsity.errors.LearnableSparsityError` naming the file.
"""

from __future__ import annotations

import html
import io
import itertools
import logging
import re
import shutil
import tarfile
import zipfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Protocol, TypeVar

from learnable_sparsity.files import atomic_writer
from learnable_sparsity.data.local import (
    Pairs,
    Rows,
    align_lines,
    aligned_line_stream,
    decode_lines,
    pair_lines,
)
from learnable_sparsity.errors import LearnableSparsityError

_log = logging.getLogger(__name__)

# Members with these endings are archives themselves, searched like the outer one.
NESTED_ARCHIVES = (".zip", ".tar", ".tar.gz", ".tgz")
# How many of an archive's file names an error about a missing member lists.
LISTED_NAMES = 30
# Bytes per read when a member is copied out of its archive (copy_members).
COPY_CHUNK = 1 << 20

# A wanted member: one path suffix, or alternative suffixes of which exactly one file must match.
Wanted = str | tuple[str, ...]


def _member_matches(name: str, suffix: str) -> bool:
    return name == suffix or name.endswith("/" + suffix)


# opens a member of an archive for reading, as a binary stream
Opener = Callable[[], IO[bytes]]
T = TypeVar("T")


def _files(archive: Path | io.BytesIO, prefix: str = "") -> Iterator[tuple[str, Opener]]:
    """(path, open) of every file of a zip or tar(.gz), an archive inside it searched as a folder
    of its name (``all.zip`` holding ``TrainDev.zip`` holding ``train.src``: ``TrainDev.zip/
    train.src``; an inner archive is read into memory). ``open`` is valid until the next file is
    produced."""

    def entry(name: str, opener: Opener) -> Iterator[tuple[str, Opener]]:
        if name.lower().endswith(NESTED_ARCHIVES):
            with opener() as inner:
                yield from _files(io.BytesIO(inner.read()), f"{prefix}{name}/")
        else:
            yield f"{prefix}{name}", opener

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zipped:
            for info in zipped.infolist():
                if not info.is_dir():
                    yield from entry(info.filename, lambda info=info: zipped.open(info))
    elif tarfile.is_tarfile(archive):
        if isinstance(archive, io.BytesIO):
            archive.seek(0)  # is_tarfile read its head
        source = {"name": archive} if isinstance(archive, Path) else {"fileobj": archive}
        with tarfile.open(mode="r:*", **source) as tarred:
            for member in tarred:  # one pass: a compressed tar cannot seek back cheaply
                if member.isfile():
                    yield from entry(member.name, lambda member=member: tarred.extractfile(member))
    else:
        where = prefix.rstrip("/") or archive
        raise LearnableSparsityError(f"{where} is neither a zip nor a tar archive")


def read_members(archive: Path, wanted: Collection[Wanted]) -> dict[Wanted, bytes]:
    """Bytes of the members of a zip or tar(.gz) ``archive`` whose paths end with each suffix
    (see :func:`find_members`)."""
    return {key: data for key, (_, data) in find_members(archive, wanted).items()}


def find_members(archive: Path, wanted: Collection[Wanted]) -> dict[Wanted, tuple[str, bytes]]:
    """The path and bytes of the members of a zip or tar(.gz) ``archive`` whose paths end with
    each suffix.

    A suffix is a path relative to any folder of the archive or of an archive inside it
    (``data/tok/kyoto-dev.en`` matches ``kftt-data-1.0/data/tok/kyoto-dev.en``); a tuple of
    suffixes gives the names different releases used. Each wanted member must match exactly one
    file; the log names the file each one matched, and a missing one's error lists the archive's
    files.
    """

    def read(_: str, opener: Opener) -> bytes:
        with opener() as stream:
            return stream.read()

    return _matching_members(archive, wanted, read)


def copy_members(
    archive: Path, wanted: Collection[Wanted], directory: Path
) -> dict[Wanted, tuple[str, Path]]:
    """The path of each member of ``archive`` matched as :func:`find_members` matches them and
    the file it was copied to in ``directory`` (streamed a MiB at a time, atomically), for
    members too large to hold in memory."""

    def copy(name: str, opener: Opener) -> Path:
        target = directory / f"{len(copied)}-{PurePosixPath(name).name}"
        with opener() as stream, atomic_writer(target) as handle:
            shutil.copyfileobj(stream, handle, COPY_CHUNK)
        copied.append(target)
        return target

    copied: list[Path] = []
    return _matching_members(archive, wanted, copy)


def _matching_members(
    archive: Path, wanted: Collection[Wanted], take: Callable[[str, Opener], T]
) -> dict[Wanted, tuple[str, T]]:
    """The path of the one member matching each wanted suffix (or alternatives) and what
    ``take(path, open)`` made of it; a missing or ambiguous member raises, naming the archive's
    files."""
    found: dict[Wanted, list[tuple[str, T]]] = {key: [] for key in wanted}
    names: list[str] = []
    for name, opener in _files(archive):
        names.append(name)
        for key, matches in found.items():
            suffixes = (key,) if isinstance(key, str) else key
            if any(_member_matches(name, suffix) for suffix in suffixes):
                matches.append((name, take(name, opener)))
    members: dict[Wanted, tuple[str, T]] = {}
    for key, matches in found.items():
        described = repr(key) if isinstance(key, str) else " or ".join(map(repr, key))
        if not matches:
            listed = ", ".join(names[:LISTED_NAMES]) + (" ..." if len(names) > LISTED_NAMES else "")
            raise LearnableSparsityError(
                f"{archive} holds no file ending in {described}; its {len(names)} files: {listed}"
            )
        if len(matches) > 1:
            raise LearnableSparsityError(
                f"{archive} must hold exactly one file ending in {described}, found "
                f"{[name for name, _ in matches]}"
            )
        _log.info("%s: %s is %s", archive.name, described, matches[0][0])
        members[key] = matches[0]
    return members


class Extractor(Protocol):
    """Turns the downloaded files of a corpus into rows (pairs or triplets) per split."""

    def extract(
        self, files: Mapping[str, Path], source_lang: str, target_lang: str
    ) -> Mapping[str, Rows | Iterable[tuple[str, ...]]]:
        """``files`` maps each :class:`~learnable_sparsity.data.registry.RemoteFile` name to its
        downloaded path; a split's rows are a sequence, or an iterable to read once where the
        extractor streams them."""
        ...


@dataclass(frozen=True)
class ParquetTranslations:
    """Hugging Face translation parquet files: a ``translation`` struct column with one string
    field per language. ``splits`` maps each split to its files (shards, in order)."""

    splits: Mapping[str, tuple[str, ...]]

    def extract(
        self, files: Mapping[str, Path], source_lang: str, target_lang: str
    ) -> dict[str, Pairs]:
        """Pairs of every split, shards concatenated."""
        return {
            split: [
                pair
                for name in names
                for pair in _read_parquet(files[name], source_lang, target_lang)
            ]
            for split, names in self.splits.items()
        }


def _read_parquet(path: Path, source_lang: str, target_lang: str) -> Pairs:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise LearnableSparsityError(f"reading {path} needs pyarrow: pip install pyarrow") from None
    try:
        column = pq.read_table(path, columns=["translation"]).column("translation").combine_chunks()
        sides = [column.field(lang).to_pylist() for lang in (source_lang, target_lang)]
    except (OSError, KeyError, ValueError) as err:  # pyarrow's errors derive from these
        raise LearnableSparsityError(
            f"{path} has no translation column with fields {source_lang!r} and "
            f"{target_lang!r}: {err}"
        ) from None
    return [((s or "").strip(), (t or "").strip()) for s, t in zip(*sides, strict=True)]


@dataclass(frozen=True)
class TextFiles:
    """Line-aligned plain-text files, loose downloads or members of ``archive``.

    ``splits`` maps each split to its (source, target) file: a :class:`RemoteFile` name, or a
    path suffix inside ``archive`` (see :func:`read_members`).
    """

    splits: Mapping[str, tuple[str, str]]
    archive: str | None = None

    def extract(
        self, files: Mapping[str, Path], source_lang: str, target_lang: str
    ) -> dict[str, Pairs]:
        """Pairs of every split."""
        names = [name for pair in self.splits.values() for name in pair]
        if self.archive is None:
            contents = {name: files[name].read_bytes() for name in names}
            label = {name: str(files[name]) for name in names}
        else:
            contents = read_members(files[self.archive], names)
            label = {name: f"{files[self.archive]}:{name}" for name in names}
        return {
            split: pair_lines(
                decode_lines(contents[source], label[source]),
                decode_lines(contents[target], label[target]),
                label[source],
                label[target],
            )
            for split, (source, target) in self.splits.items()
        }


@dataclass(frozen=True)
class Member:
    """A text file inside a downloaded archive: the archive's
    :class:`~learnable_sparsity.data.registry.RemoteFile` name and the member's path suffix, or the
    alternative suffixes of the names releases used (see :func:`read_members`)."""

    archive: str
    path: Wanted


@dataclass(frozen=True)
class AlignedMembers:
    """Line-aligned plain-text files inside downloaded zip or tar archives, one file per field
    (e.g. source, MT output and post-edit of an APE corpus).

    ``splits`` maps each split to its parts, concatenated in order (e.g. the training sets of two
    releases), each part naming one :class:`Member` per field. The member names describe the
    published archives, so they are data of the registry entry rather than code. With
    ``streamed`` (a corpus of several GB) the members are copied out of their archive into
    ``<archive>.members/`` beside it and each split's rows are read from there line by line, in
    one pass (:func:`~learnable_sparsity.data.local.aligned_line_stream`), never held in memory whole.
    """

    splits: Mapping[str, tuple[tuple[Member, ...], ...]]
    streamed: bool = False

    def extract(
        self, files: Mapping[str, Path], source_lang: str, target_lang: str
    ) -> dict[str, Rows | Iterable[tuple[str, ...]]]:
        """Rows of every split, one string per field (the languages are not needed: the members
        name the fields); an iterable read once where ``streamed``."""
        wanted: dict[str, dict[Wanted, None]] = {}  # in the order given (errors name the first)
        for parts in self.splits.values():
            for part in parts:
                for member in part:
                    wanted.setdefault(member.archive, {})[member.path] = None
        if self.streamed:
            copies = {
                Member(archive, path): found
                for archive, paths in wanted.items()
                for path, found in copy_members(
                    files[archive],
                    paths,
                    files[archive].with_name(f"{files[archive].name}.members"),
                ).items()
            }
            return {
                split: itertools.chain.from_iterable(
                    aligned_line_stream(
                        [(f"{files[m.archive]}:{copies[m][0]}", copies[m][1]) for m in part]
                    )
                    for part in parts
                )
                for split, parts in self.splits.items()
            }
        contents = {
            Member(archive, path): found
            for archive, paths in wanted.items()
            for path, found in find_members(files[archive], paths).items()
        }

        def rows(part: Sequence[Member]) -> Rows:
            labelled = [
                (f"{files[member.archive]}:{contents[member][0]}", contents[member][1])
                for member in part
            ]
            return align_lines([(label, decode_lines(data, label)) for label, data in labelled])

        return {
            split: [row for part in parts for row in rows(part)]
            for split, parts in self.splits.items()
        }


_SEGMENT = re.compile(r"<seg id=\"?\d+\"?>(.*?)</seg>")
_TITLE_OR_DESCRIPTION = re.compile(r"<(title|description)>(.*)</\1>")


@dataclass(frozen=True)
class Wit3Archive:
    """An IWSLT release from WIT3: ``train.tags.<pair>.<lang>`` (TED transcripts, one sentence per
    line, with XML-like metadata lines) and ``<doc>.<pair>.<lang>.xml`` files of ``<seg>``
    elements for the dev and test sets.

    Training lines starting with ``<`` are metadata and dropped, except that with
    ``keep_title_description`` the text of ``<title>`` and ``<description>`` lines is kept as
    a sentence (fairseq's IWSLT14 preparation). The validation set is the concatenation of
    ``valid_docs`` or, with ``valid_every = n``, every n-th training pair (taken out of train).
    """

    archive: str
    pair: str  # language pair as named in the archive, e.g. "de-en"
    test_docs: tuple[str, ...]
    valid_docs: tuple[str, ...] = ()
    valid_every: int | None = None
    keep_title_description: bool = False

    def extract(
        self, files: Mapping[str, Path], source_lang: str, target_lang: str
    ) -> dict[str, Pairs]:
        """Pairs of train, valid and test."""
        langs = (source_lang, target_lang)
        train_names = [f"train.tags.{self.pair}.{lang}" for lang in langs]
        doc_names = {
            doc: [f"{doc}.{self.pair}.{lang}.xml" for lang in langs]
            for doc in (*self.valid_docs, *self.test_docs)
        }
        archive = files[self.archive]
        members = read_members(
            archive, [*train_names, *(n for names in doc_names.values() for n in names)]
        )

        def paired(names: list[str], parse: Callable[[list[str]], list[str]]) -> Pairs:
            source, target = (f"{archive}:{name}" for name in names)
            return pair_lines(
                parse(decode_lines(members[names[0]], source)),
                parse(decode_lines(members[names[1]], target)),
                source,
                target,
            )

        def docs(selected: tuple[str, ...]) -> Pairs:
            return [pair for doc in selected for pair in paired(doc_names[doc], _segments)]

        train = paired(train_names, self._training_lines)
        if self.valid_every is not None:
            n = self.valid_every
            valid = train[n - 1 :: n]
            train = [pair for i, pair in enumerate(train, start=1) if i % n]
        else:
            valid = docs(self.valid_docs)
        return {"train": train, "valid": valid, "test": docs(self.test_docs)}

    def _training_lines(self, raw: list[str]) -> list[str]:
        kept = []
        for line in raw:
            if not line.startswith("<"):
                kept.append(line)
            elif self.keep_title_description and (match := _TITLE_OR_DESCRIPTION.fullmatch(line)):
                kept.append(match.group(2).strip())
        return kept


def _segments(raw: list[str]) -> list[str]:
    return [html.unescape(m.group(1)).strip() for line in raw for m in _SEGMENT.finditer(line)]
