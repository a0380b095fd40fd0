"""Bible translations in the SWORD module format, read without libsword, aligned verse by verse.

Two public-domain translations with the same verse numbering make a parallel corpus whose
sentences are natural language (Zipfian words, irregular morphology, questions marked as each
language marks them), the material the attention analyses need and the generated corpus lacks.
:data:`MODULES` names the modules this reader knows, with their language and the Debian package
(``sword-text-*``) that ships each: on Debian or Ubuntu ``apt install`` puts them under
:data:`SYSTEM_LIBRARY`; elsewhere :func:`install_modules` downloads the same packages from the
Debian archive (SHA-256 digests from the archive's index) and unpacks them into a cache.

**The zText format** (``ModDrv=zText``, ``CompressType=ZIP``). A library holds
``mods.d/<module>.conf`` (``key=value`` lines under ``[<module>]``; ``DataPath`` is relative to
the library) and, per testament ``ot`` / ``nt``, three files in ``DataPath``:

* ``<t>.bzs`` — per compressed block, three little-endian ``uint32``: offset in ``.bzz``,
  compressed size, uncompressed size;
* ``<t>.bzv`` — per verse slot, ``uint32`` block, ``uint32`` offset in the uncompressed block,
  ``uint16`` size (0: an empty slot);
* ``<t>.bzz`` — the zlib-compressed blocks.

The slots follow the module's versification: two testament headers, then per book a heading
slot, and per chapter a heading slot (verse 0) followed by its verses. Rather than carry the
versification tables, the reader takes each chapter's book and number from the OSIS milestone
that ``osis2mod`` writes into its heading slot (``<chapter osisID="Gen.1" sID="Gen.1"/>``): a
chapter's verses are the slots after its heading, up to the next heading, less the next book's
heading slot when the next chapter opens another book. A chapter number that does not follow
its predecessor's (a heading slot without its milestone) is refused rather than misnumbered.

**Plain text** (:func:`osis_text`): notes (footnotes, cross references) and the editors'
section titles go; canonical titles stay (the psalm superscriptions, which one translation tags
as titles and the other prints as the start of verse 1); every other tag goes, its text stays
(Strong's ``<w>`` words, ``<q>`` quotations, ``<divineName>``; a translator's addition,
``<transChange>``, is kept apart from the words it touches); entities are decoded and whitespace
collapsed.
"""

from __future__ import annotations

import hashlib
import html
import io
import logging
import random
import re
import struct
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from learnable_sparsity.files import atomic_write_bytes
from learnable_sparsity.data.fetch import download
from learnable_sparsity.errors import LearnableSparsityError

_log = logging.getLogger(__name__)

SYSTEM_LIBRARY = Path("/usr/share/sword")  # where Debian's sword-text-* packages install
TESTAMENTS = ("ot", "nt")
BLOCK_ENTRY = struct.Struct("<III")  # .bzs: offset, compressed size, uncompressed size
VERSE_ENTRY = struct.Struct("<IIH")  # .bzv: block, offset in the block, size
# What this reader decodes; a module declaring anything else is refused by name.
SUPPORTED = {"ModDrv": "zText", "CompressType": "ZIP", "SourceType": "OSIS", "Encoding": "UTF-8"}


@dataclass(frozen=True)
class DebianPackage:
    """A Debian archive file: its URL and the SHA-256 that the archive's index publishes."""

    url: str
    sha256: str


@dataclass(frozen=True)
class Module:
    """A known module: the language of its text (ISO 639-1) and the package that ships it."""

    lang: str
    package: DebianPackage


DEBIAN_POOL = "https://deb.debian.org/debian/pool/main/s"
MODULES: dict[str, Module] = {
    # World English Bible (2020 stable text, with the deuterocanon; versification NRSVA).
    "engWEB2015eb": Module(
        "en",
        DebianPackage(
            f"{DEBIAN_POOL}/sword-text-web/sword-text-web_426.0-1_all.deb",
            "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",
        ),
    ),
    # Reina-Valera 1909 (versification KJV).
    "spaRV1909eb": Module(
        "es",
        DebianPackage(
            f"{DEBIAN_POOL}/sword-text-sparv/sword-text-sparv_2.60-1_all.deb",
            "5c87f9b2bc97457e8a872f5bae7ea7ce59cb3de1dcee73e4d4740451863694cf",
        ),
    ),
}


class VerseKey(NamedTuple):
    """A verse: OSIS book abbreviation (``Gen``, ``Matt``), chapter, verse."""

    book: str
    chapter: int
    verse: int


def install_command(names: list[str]) -> str:
    """The command that installs the Debian packages of the modules ``names``."""
    packages = sorted({Path(MODULES[name].package.url).name.split("_")[0] for name in names})
    return "sudo apt install " + " ".join(packages)


def missing_modules(library: Path, names: list[str]) -> list[str]:
    """The modules of ``names`` that ``library`` has no conf file for."""
    present = set()
    for path in (library / "mods.d").glob("*.conf"):
        text = path.read_text(encoding="utf-8", errors="replace")
        present.update(match.lower() for match in re.findall(r"^\[([^\]]+)\]", text, re.M))
    return [name for name in names if name.lower() not in present]


def module_library(names: list[str], library: Path | None, cache: Path) -> Path:
    """The library to read the modules ``names`` from: ``library`` if given, else the system's
    when it holds them all, else their Debian packages unpacked into ``cache``
    (:func:`install_modules`, downloading what is not cached)."""
    if library is not None:
        missing = missing_modules(library, names)
        if missing:
            raise LearnableSparsityError(
                f"SWORD library {library} lacks the module(s) {missing}; on Debian or Ubuntu "
                f"`{install_command(missing)}` installs them into {SYSTEM_LIBRARY}"
            )
        return library
    if not missing_modules(SYSTEM_LIBRARY, names):
        return SYSTEM_LIBRARY
    return install_modules(names, cache)


# --------------------------------------------------------------------------- reading a module


def read_conf(library: Path, name: str) -> dict[str, str]:
    """The ``key=value`` entries under ``[<name>]`` in ``library``/mods.d (the first value of a
    repeated key; ``#`` lines are comments), checked against :data:`SUPPORTED`."""
    header = f"[{name.lower()}]"
    for path in sorted((library / "mods.d").glob("*.conf")):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        sections = [number for number, line in enumerate(lines) if line.startswith("[")]
        if sections and lines[sections[0]].strip().lower() == header:
            lines = lines[sections[0] :]
            break
    else:
        raise LearnableSparsityError(
            f"SWORD module {name} is not in {library}/mods.d; on Debian or Ubuntu: "
            f"{install_command([name]) if name in MODULES else 'install its package'}"
        )
    conf: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            conf.setdefault(key.strip(), value.strip())
    for key, value in SUPPORTED.items():
        if conf.get(key, value).upper() != value.upper():
            raise LearnableSparsityError(
                f"{path}: {key}={conf[key]}; this reader decodes {key}={value} only"
            )
    if "DataPath" not in conf:
        raise LearnableSparsityError(f"{path}: no DataPath entry")
    return conf


def _slots(directory: Path, testament: str) -> Iterator[str]:
    """The text (OSIS markup) of every verse slot of one testament, "" for an empty slot."""
    try:
        index = (directory / f"{testament}.bzs").read_bytes()
        verses = (directory / f"{testament}.bzv").read_bytes()
        data = (directory / f"{testament}.bzz").read_bytes()
    except FileNotFoundError:
        return  # a module of one testament only
    blocks = list(BLOCK_ENTRY.iter_unpack(index))
    unpacked: dict[int, bytes] = {}
    for block, offset, size in VERSE_ENTRY.iter_unpack(verses[: len(verses) // 10 * 10]):
        if size == 0:
            yield ""
            continue
        if block not in unpacked:
            start, length, _ = blocks[block]
            unpacked = {block: zlib.decompress(data[start : start + length])}
        yield unpacked[block][offset : offset + size].decode("utf-8", errors="replace")


CHAPTER_MILESTONE = re.compile(r'<chapter\b[^>]*\bosisID="([^"]+)\.(\d+)"[^>]*\bsID=')


def _data_directory(library: Path, conf: dict[str, str]) -> Path:
    return library / conf["DataPath"].removeprefix("./")


def module_fingerprint(library: Path, name: str) -> dict[str, str]:
    """What identifies the text of module ``name`` in ``library``: its conf's ``Version`` and
    the SHA-256 of its data files (each one's name and bytes, in name order). A library outside
    the project (the system's) is no DVC dependency; a corpus records this to notice a change."""
    conf = read_conf(library, name)
    digest = hashlib.sha256()
    directory = _data_directory(library, conf)
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes())
    return {"version": conf.get("Version", "unknown"), "sha256": digest.hexdigest()}


def read_module(library: Path, name: str) -> dict[VerseKey, str]:
    """Every verse of module ``name`` in ``library`` (OSIS markup, empty slots included), in
    the module's order."""
    directory = _data_directory(library, read_conf(library, name))
    verses: dict[VerseKey, str] = {}
    for testament in TESTAMENTS:
        slots = list(_slots(directory, testament))
        headings = [
            (position, match[1], int(match[2]))
            for position, text in enumerate(slots)
            if (match := CHAPTER_MILESTONE.search(text))
        ]
        for number, (position, book, chapter) in enumerate(headings):
            following = headings[number + 1] if number + 1 < len(headings) else None
            if following is None:
                end = len(slots)
            elif following[1] == book:
                if following[2] != chapter + 1:
                    raise LearnableSparsityError(
                        f"SWORD module {name}: {book} chapter {following[2]} follows chapter "
                        f"{chapter} (a chapter heading without its milestone); cannot number "
                        "its verses"
                    )
                end = following[0]
            else:
                end = following[0] - 1  # the next book's heading slot
            for verse, slot in enumerate(slots[position + 1 : end], start=1):
                verses[VerseKey(book, chapter, verse)] = slot
    if not verses:
        raise LearnableSparsityError(f"SWORD module {name} in {library}: no chapter milestones")
    return verses


# --------------------------------------------------------------------------- plain text

_NOTE = re.compile(r"<note\b[^>]*/>|<note\b.*?</note>", re.S)
_TITLE = re.compile(r"<title\b(?P<attributes>[^>]*)>(?P<text>.*?)</title>", re.S)
_TAG = re.compile(r"<[^>]*>")
# The Reina-Valera module writes a translator's added words (``transChange``, italics in print)
# against their neighbours in 385 verses: "Porque</w><transChange>pasados</transChange><w>aún"
# needs spaces; an added enclitic pronoun belongs to its verb ("sáca<transChange>lo": sácalo).
_ENCLITICS = "me|te|se|lo|la|le|los|las|les|nos|os"
_GLUED_ADDITION = re.compile(
    rf"(?<=\w)(?:</w>)?<transChange\b[^>]*>(?!(?:{_ENCLITICS})</transChange>)"
    r"|</transChange>(?=(?:<w\b[^>]*>)?\w)"
)
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([,.;:!?])")


def _canonical_title(match: re.Match[str]) -> str:
    return f" {match['text']} " if 'canonical="true"' in match["attributes"] else " "


def osis_text(markup: str) -> str:
    """The plain text of one verse's OSIS markup (see the module docstring)."""
    text = _NOTE.sub(" ", markup)  # a space: a note may sit between two words
    text = _TITLE.sub(_canonical_title, text)
    text = _GLUED_ADDITION.sub(lambda match: f" {match[0]} ", text)
    text = html.unescape(_TAG.sub("", text))
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", " ".join(text.split()))


def aligned_verses(
    source: dict[VerseKey, str], target: dict[VerseKey, str]
) -> list[tuple[VerseKey, str, str]]:
    """(verse, source text, target text) for every verse both modules hold with text, in the
    source module's order."""
    rows = []
    for key, markup in source.items():
        if key in target:
            pair = osis_text(markup), osis_text(target[key])
            if all(pair):
                rows.append((key, *pair))
    return rows


def split_by_chapter(
    rows: list[tuple[VerseKey, str, str]], sizes: dict[str, int], seed: int
) -> dict[str, list[tuple[str, str]]]:
    """The (source, target) pairs of ``rows`` cut into ``train`` and the splits of ``sizes``.

    The chapters, shuffled with ``random.Random(seed)``, fill the splits of ``sizes`` in their
    order, whole chapters at a time, until each holds at least its size; ``train`` gets the
    remaining chapters. Whole chapters keep a test verse's neighbours (often the same sentence
    continued) out of training. Every split keeps the books' order.
    """
    chapters = list(dict.fromkeys((key.book, key.chapter) for key, _, _ in rows))
    random.Random(seed).shuffle(chapters)
    verses: dict[tuple[str, int], int] = {}
    for key, _, _ in rows:
        verses[key.book, key.chapter] = verses.get((key.book, key.chapter), 0) + 1
    assigned: dict[tuple[str, int], str] = {}
    remaining = iter(chapters)
    for split, size in sizes.items():
        held = 0
        while held < size:
            chapter = next(remaining, None)
            if chapter is None:
                raise LearnableSparsityError(
                    f"the aligned verses ({len(rows)}) cannot fill the splits {sizes} and leave "
                    "any for train"
                )
            assigned[chapter] = split
            held += verses[chapter]
    splits: dict[str, list[tuple[str, str]]] = {"train": [], **{split: [] for split in sizes}}
    for key, source, target in rows:
        splits[assigned.get((key.book, key.chapter), "train")].append((source, target))
    if not splits["train"]:
        raise LearnableSparsityError(f"the splits {sizes} leave no aligned verse for train")
    return splits


# --------------------------------------------------------------------------- the packages


def _deb_member(deb: bytes, prefix: str) -> bytes:
    """The member of a Debian package (an ``ar`` archive) whose name starts with ``prefix``."""
    magic = b"!<arch>\n"
    if not deb.startswith(magic):
        raise LearnableSparsityError("not a Debian package (no ar archive header)")
    position = len(magic)
    while position + 60 <= len(deb):
        header = deb[position : position + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        if name.startswith(prefix):
            return deb[position + 60 : position + 60 + size]
        position += 60 + size + size % 2  # members are padded to an even offset
    raise LearnableSparsityError(f"Debian package without a {prefix}* member")


def install_modules(names: list[str], cache: Path) -> Path:
    """A library holding the modules ``names``: each one's Debian package downloaded into
    ``cache`` (resumed, checked against its SHA-256) and its ``usr/share/sword`` unpacked into
    ``cache/sword``. Returns that library."""
    library = cache / "sword"
    for name in names:
        package = MODULES[name].package
        deb = download(package.url, cache / Path(package.url).name, package.sha256)
        with tarfile.open(fileobj=io.BytesIO(_deb_member(deb.read_bytes(), "data.tar"))) as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts  # "./usr/…" reads ("usr", …)
                if member.isfile() and parts[:3] == ("usr", "share", "sword") and ".." not in parts:
                    extracted = tar.extractfile(member)
                    assert extracted is not None  # a regular file
                    atomic_write_bytes(library.joinpath(*parts[3:]), extracted.read())
        _log.info("SWORD module %s unpacked from %s into %s", name, deb.name, library)
    return library
