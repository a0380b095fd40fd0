"""Real corpora: a registry of sources and a resumable, verified downloader.

:data:`CORPORA` names every corpus of the reproduced papers, with its language pair, the files to
fetch, how the train/valid/test pairs are extracted from them and the published split sizes
(train / valid / test pairs):

* ``iwslt17_de_en`` (de→en): IWSLT 2017 TED talks, the WIT3 zip kept by Hugging Face
  (``IWSLT/iwslt2017``); train ``train.tags``, valid dev2010, test tst2010–tst2015 (the Hugging
  Face splits); 206,112 / 888 / 8,079.
* ``kftt_ja_en`` (ja→en): Kyoto Free Translation Task 1.0 tarball (phontron.com), tokenized
  files; train the cleaned ``kyoto-train.cln`` (≤ 40 words), valid dev, test test;
  329,882 / 1,166 / 1,160.
* ``wmt16_ro_en`` (ro→en): WMT 2016, Hugging Face ``wmt/wmt16`` parquet; valid newsdev2016, test
  newstest2016; 610,320 / 1,999 / 1,999.
* ``wmt14_en_de`` (en→de): WMT 2014, Hugging Face ``wmt/wmt14`` parquet (3 train shards); valid
  newstest2013, test newstest2014; 4,508,785 / 3,000 / 3,003.
* ``iwslt14_de_en`` (de→en): IWSLT 2014 TED talks, fairseq's WIT3 tarball, fairseq's split
  (``prepare-iwslt14.sh``): every 23rd training pair is valid, test dev2010 + TEDX dev2012 +
  tst2010–tst2012; – / – / 6,750.
* ``iwslt15_en_vi`` (en→vi): IWSLT 2015 as prepared by Stanford NLP (tokenized files); valid
  tst2012, test tst2013; 133,317 / 1,553 / 1,268.

Text is kept as published apart from stripping whitespace at line ends and decoding XML entities
in IWSLT dev/test segments (no tokenization, truecasing or length filter is added), so
``iwslt14_de_en`` differs from fairseq's Moses-tokenized, lowercased, length-cleaned version in its
train/valid sizes (fairseq: 160,239 / 7,283); its test set has the same 6,750 segments. A split size
that differs from the published one is logged as a warning; pairs with an empty side are dropped
(and counted in the log) after that check.

:func:`download` fetches one URL with the standard library only: a partial ``<file>.part`` is
resumed with an HTTP ``Range`` request (interrupted transfers are retried that way), progress is
a tqdm bar, the finished file is checked against its SHA-256 and renamed into place atomically,
and a file already in the cache is verified and reused without any request. No registry entry
pins a digest yet (they could not be computed offline; the Hugging Face ``main`` revisions can
also move): instead the first successful download records its digest in ``<file>.sha256`` beside
it, and every later use or re-download of that file is verified against the record. A mismatch
moves the bad file to ``<file>.corrupt`` and raises a ``LearnableSparsityError`` naming the file
and both digests; an unreachable host raises one naming the URL and pointing to the ``local``
corpus source (:mod:`components.data.local`).

Parquet files are read with ``pyarrow`` (installed with MLflow); archives with ``zipfile`` and
``tarfile``.
"""

from __future__ import annotations

import hashlib
import html
import http.client
import logging
import os
import re
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from components.data.atomic import atomic_write_text
from components.data.local import SPLITS, decode_lines, pair_lines
from components.errors import LearnableSparsityError

Pairs = list[tuple[str, str]]

CHUNK_SIZE = 1 << 16
DEFAULT_TIMEOUT = 60.0  # seconds without data before a connection counts as lost
DEFAULT_ATTEMPTS = 3  # transfers of one file (each resuming the previous one)
USER_AGENT = "learnable-sparsity-corpus-downloader/0.1"
_SHA256 = re.compile(r"[0-9a-f]{64}")

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- downloading


class _InterruptedError(Exception):
    """A transfer stopped before its end; the ``.part`` file holds what arrived."""


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def sha256_of(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _recorded_digest(record: Path) -> str | None:
    if not record.is_file():
        return None
    digest = record.read_text().strip().lower()
    if not _SHA256.fullmatch(digest):
        raise LearnableSparsityError(
            f"{record} does not hold a SHA-256 digest ({digest!r}); delete it to re-record"
        )
    return digest


def _quarantine(path: Path, final: Path) -> Path:
    bad = _sibling(final, ".corrupt")
    os.replace(path, bad)
    return bad


def _transfer(url: str, part: Path, *, progress: bool, timeout: float) -> None:
    """Fetch ``url`` into ``part``, resuming what it already holds; raise _InterruptedError on a
    transfer cut short and LearnableSparsityError when the server cannot be used."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        response = urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        )
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # nothing left to send: start over to be sure
            part.unlink()
            raise _InterruptedError(f"server refused to resume {part} at byte {offset}") from None
        raise LearnableSparsityError(
            f"download of {url} failed: HTTP {err.code} {err.reason}"
        ) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", err)
        raise LearnableSparsityError(
            f"cannot reach {url} ({reason}). Without network access, fetch the files elsewhere "
            "and use the `local` corpus source with plain-text parallel files"
        ) from None
    with response:
        resumed = offset > 0 and response.status == 206
        if resumed and not response.headers.get("Content-Range", "").startswith(f"bytes {offset}-"):
            raise LearnableSparsityError(
                f"download of {url}: the server answered the range request for byte {offset} "
                f"with Content-Range {response.headers.get('Content-Range')!r}"
            )
        if not resumed:
            offset = 0  # the server sends the whole file
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None else None
        received = 0
        with (
            open(part, "ab" if resumed else "wb") as out,
            tqdm(
                total=total,
                initial=offset,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=part.name.removesuffix(".part"),
                disable=not progress,
            ) as bar,
        ):
            try:
                while chunk := response.read(CHUNK_SIZE):
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as err:
                raise _InterruptedError(
                    f"transfer of {url} broke after byte {offset + received}: {err}"
                ) from None
    if length is not None and received < int(length):
        raise _InterruptedError(
            f"connection to {url} closed after byte {offset + received} of {total}"
        )


def download(
    url: str,
    dest: str | os.PathLike[str],
    sha256: str | None = None,
    *,
    progress: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    attempts: int = DEFAULT_ATTEMPTS,
) -> Path:
    """Download ``url`` to ``dest`` (the cache entry) unless a verified copy is there already.

    The expected digest is ``sha256`` if given, else the one recorded in ``<dest>.sha256`` by an
    earlier download, else none (the digest of this download is then recorded). A transfer cut
    short is resumed from ``<dest>.part`` with an HTTP Range request, up to ``attempts`` transfers
    in all; after that the partial file stays for the next call to resume. Returns ``dest``.
    """
    dest = Path(dest)
    if sha256 is not None and not _SHA256.fullmatch(sha256.lower()):
        raise LearnableSparsityError(
            f"sha256 for {dest.name} is not a hex SHA-256 digest: {sha256!r}"
        )
    record = _sibling(dest, ".sha256")
    expected = sha256.lower() if sha256 is not None else _recorded_digest(record)
    if dest.is_file():
        actual = sha256_of(dest)
        if expected in (None, actual):
            if expected is None:
                atomic_write_text(record, actual + "\n")
            return dest
        bad = _quarantine(dest, dest)
        _log.warning(
            "cached %s has sha256 %s, expected %s: moved to %s, downloading again",
            dest,
            actual,
            expected,
            bad,
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = _sibling(dest, ".part")
    for attempt in range(1, attempts + 1):
        try:
            _transfer(url, part, progress=progress, timeout=timeout)
            break
        except _InterruptedError as err:
            _log.warning("%s (attempt %d of %d)", err, attempt, attempts)
    else:
        size = part.stat().st_size if part.exists() else 0
        raise LearnableSparsityError(
            f"download of {url} was interrupted {attempts} times; {part} keeps the first {size} "
            "bytes and the next call resumes from there"
        )
    actual = sha256_of(part)
    if expected is not None and actual != expected:
        bad = _quarantine(part, dest)
        origin = "given" if sha256 is not None else f"recorded in {record} by an earlier download"
        raise LearnableSparsityError(
            f"{dest.name} downloaded from {url} has sha256 {actual}, expected {expected} "
            f"({origin}); the file was moved to {bad}. If the source changed on purpose, delete "
            f"{record} and download again"
        )
    os.replace(part, dest)
    atomic_write_text(record, actual + "\n")
    return dest


# --------------------------------------------------------------------------- extraction


def _member_matches(name: str, suffix: str) -> bool:
    return name == suffix or name.endswith("/" + suffix)


def read_members(archive: Path, suffixes: Collection[str]) -> dict[str, bytes]:
    """Bytes of the members of a zip or tar(.gz) ``archive`` whose paths end with each suffix.

    A suffix is a path relative to any folder of the archive (``data/tok/kyoto-dev.en`` matches
    ``kftt-data-1.0/data/tok/kyoto-dev.en``); each must match exactly one file.
    """
    found: dict[str, list[tuple[str, bytes]]] = {suffix: [] for suffix in suffixes}

    def offer(name: str, read: Callable[[], bytes]) -> None:
        for suffix in found:
            if _member_matches(name, suffix):
                found[suffix].append((name, read()))

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zipped:
            for info in zipped.infolist():
                if not info.is_dir():
                    offer(info.filename, lambda info=info: zipped.read(info))
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive, "r:*") as tarred:
            for member in tarred:  # one pass: a compressed tar cannot seek back cheaply
                if member.isfile():
                    offer(member.name, lambda member=member: tarred.extractfile(member).read())
    else:
        raise LearnableSparsityError(f"{archive} is neither a zip nor a tar archive")
    members: dict[str, bytes] = {}
    for suffix, matches in found.items():
        if len(matches) != 1:
            names = [name for name, _ in matches]
            raise LearnableSparsityError(
                f"{archive} must hold exactly one file ending in {suffix!r}, found {names}"
            )
        members[suffix] = matches[0][1]
    return members


class Extractor(Protocol):
    """Turns the downloaded files of a corpus into (source, target) pairs per split."""

    def extract(
        self, files: Mapping[str, Path], source_lang: str, target_lang: str
    ) -> dict[str, Pairs]:
        """``files`` maps each :class:`RemoteFile` name to its downloaded path."""
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


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class RemoteFile:
    """One file of a corpus: its name in the cache, its URL and, if pinned, its SHA-256."""

    name: str
    url: str
    sha256: str | None = None


@dataclass(frozen=True)
class CorpusSpec:
    """A downloadable parallel corpus translated from ``source_lang`` into ``target_lang``.

    ``expected_sizes`` holds the published number of pairs per split (None where unknown).
    """

    name: str
    source_lang: str
    target_lang: str
    files: tuple[RemoteFile, ...]
    extractor: Extractor
    expected_sizes: Mapping[str, int | None] = field(default_factory=dict)
    description: str = ""


_HF = "https://huggingface.co/datasets"
_STANFORD_IWSLT15 = "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi"


def _hf_parquet(
    repo: str, config: str, shards: Mapping[str, int]
) -> tuple[tuple[RemoteFile, ...], ParquetTranslations]:
    """Files and extractor of a Hugging Face parquet conversion.

    Its files are ``<config>/<split>-NNNNN-of-MMMMM.parquet``, ``shards`` giving MMMMM per split.
    """
    hf_split = {"train": "train", "valid": "validation", "test": "test"}
    names = {
        split: tuple(f"{hf_split[split]}-{i:05d}-of-{count:05d}.parquet" for i in range(count))
        for split, count in shards.items()
    }
    files = tuple(
        RemoteFile(name, f"{_HF}/{repo}/resolve/main/{config}/{name}")
        for split_names in names.values()
        for name in split_names
    )
    return files, ParquetTranslations(names)


def _registry() -> dict[str, CorpusSpec]:
    wmt16_files, wmt16_extractor = _hf_parquet(
        "wmt/wmt16", "ro-en", {"train": 1, "valid": 1, "test": 1}
    )
    wmt14_files, wmt14_extractor = _hf_parquet(
        "wmt/wmt14", "de-en", {"train": 3, "valid": 1, "test": 1}
    )
    specs = [
        CorpusSpec(
            "iwslt17_de_en",
            "de",
            "en",
            (
                RemoteFile(
                    "de-en.zip",
                    f"{_HF}/IWSLT/iwslt2017/resolve/main/data/2017-01-trnted/texts/de/en/de-en.zip",
                ),
            ),
            Wit3Archive(
                "de-en.zip",
                "de-en",
                test_docs=tuple(f"IWSLT17.TED.tst{year}" for year in range(2010, 2016)),
                valid_docs=("IWSLT17.TED.dev2010",),
            ),
            {"train": 206_112, "valid": 888, "test": 8_079},
            "IWSLT 2017 TED talks; valid dev2010, test tst2010-2015 (the Hugging Face splits)",
        ),
        CorpusSpec(
            "kftt_ja_en",
            "ja",
            "en",
            (
                RemoteFile(
                    "kftt-data-1.0.tar.gz",
                    "http://www.phontron.com/kftt/download/kftt-data-1.0.tar.gz",
                ),
            ),
            TextFiles(
                {
                    split: (f"data/tok/kyoto-{name}.ja", f"data/tok/kyoto-{name}.en")
                    for split, name in (("train", "train.cln"), ("valid", "dev"), ("test", "test"))
                },
                archive="kftt-data-1.0.tar.gz",
            ),
            {"train": 329_882, "valid": 1_166, "test": 1_160},
            "Kyoto Free Translation Task 1.0, tokenized; cleaned train (<= 40 words), dev, test",
        ),
        CorpusSpec(
            "wmt16_ro_en",
            "ro",
            "en",
            wmt16_files,
            wmt16_extractor,
            {"train": 610_320, "valid": 1_999, "test": 1_999},
            "WMT 2016 ro-en; valid newsdev2016, test newstest2016",
        ),
        CorpusSpec(
            "wmt14_en_de",
            "en",
            "de",
            wmt14_files,
            wmt14_extractor,
            {"train": 4_508_785, "valid": 3_000, "test": 3_003},
            "WMT 2014 en-de; valid newstest2013, test newstest2014",
        ),
        CorpusSpec(
            "iwslt14_de_en",
            "de",
            "en",
            (
                RemoteFile(
                    "de-en.tgz", "https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
                ),
            ),
            Wit3Archive(
                "de-en.tgz",
                "de-en",
                test_docs=(
                    "IWSLT14.TED.dev2010",
                    "IWSLT14.TEDX.dev2012",
                    "IWSLT14.TED.tst2010",
                    "IWSLT14.TED.tst2011",
                    "IWSLT14.TED.tst2012",
                ),
                valid_every=23,
                keep_title_description=True,
            ),
            {"train": None, "valid": None, "test": 6_750},
            "IWSLT 2014 TED talks with fairseq's split (prepare-iwslt14.sh), untokenized",
        ),
        CorpusSpec(
            "iwslt15_en_vi",
            "en",
            "vi",
            tuple(
                RemoteFile(f"{name}.{lang}", f"{_STANFORD_IWSLT15}/{name}.{lang}")
                for name in ("train", "tst2012", "tst2013")
                for lang in ("en", "vi")
            ),
            TextFiles(
                {
                    "train": ("train.en", "train.vi"),
                    "valid": ("tst2012.en", "tst2012.vi"),
                    "test": ("tst2013.en", "tst2013.vi"),
                }
            ),
            {"train": 133_317, "valid": 1_553, "test": 1_268},
            "IWSLT 2015 TED talks (Stanford NLP's tokenized files); valid tst2012, test tst2013",
        ),
    ]
    return {spec.name: spec for spec in specs}


CORPORA: dict[str, CorpusSpec] = _registry()


def fetch_corpus(
    corpus: str | CorpusSpec,
    cache_dir: str | os.PathLike[str],
    *,
    progress: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Pairs]:
    """Download (or reuse from ``cache_dir/<name>/``) and extract a corpus of :data:`CORPORA`.

    Returns the (source, target) pairs of ``train``, ``valid`` and ``test``.
    """
    if isinstance(corpus, str):
        if corpus not in CORPORA:
            raise LearnableSparsityError(f"unknown corpus {corpus!r}; known: {sorted(CORPORA)}")
        corpus = CORPORA[corpus]
    root = Path(cache_dir) / corpus.name
    files = {
        remote.name: download(
            remote.url, root / remote.name, remote.sha256, progress=progress, timeout=timeout
        )
        for remote in corpus.files
    }
    splits = corpus.extractor.extract(files, corpus.source_lang, corpus.target_lang)
    result: dict[str, Pairs] = {}
    for split in SPLITS:
        pairs = splits[split]
        expected = corpus.expected_sizes.get(split)
        if expected is not None and len(pairs) != expected:
            _log.warning(
                "%s %s has %d pairs, the published size is %d",
                corpus.name,
                split,
                len(pairs),
                expected,
            )
        result[split] = [(s, t) for s, t in pairs if s and t]
        if len(result[split]) < len(pairs):
            _log.warning(
                "%s %s: dropped %d pairs with an empty side",
                corpus.name,
                split,
                len(pairs) - len(result[split]),
            )
    return result
