"""A writer of small SWORD zText modules, in the byte format of Debian's ``sword-text-*``
packages, for the reader's tests (and a Debian package around them for the download path)."""

from __future__ import annotations

import io
import struct
import tarfile
import zlib
from pathlib import Path

IMPORTER = '<milestone type="x-importer" subType="x-osis2mod" n="$Rev: 3769 $"/>'


def book(osis_id: str) -> str:
    """A book's heading slot as osis2mod writes it."""
    return f'<div canonical="true" osisID="{osis_id}" sID="g{osis_id}" type="book"/> '


def chapter(osis_id: str, number: int) -> str:
    """A chapter's heading slot (verse 0) with the milestone the reader numbers verses by."""
    return f'<div sID="p" type="x-p"/><chapter n="{number}" osisID="{osis_id}.{number}" sID="x"/>'


def slots_of(books: dict[str, list[list[str]]]) -> list[str]:
    """The slots of one testament: two headers, then per book its heading and per chapter its
    heading and verses."""
    slots = ["", IMPORTER]
    for osis_id, chapters in books.items():
        slots.append(book(osis_id))
        for number, verses in enumerate(chapters, start=1):
            slots += [chapter(osis_id, number), *verses]
    return slots


def write_module(
    library: Path,
    name: str,
    testaments: dict[str, list[str]],
    *,
    block_slots: int = 4,
    conf: dict[str, str] | None = None,
) -> None:
    """Module ``name`` in ``library``: ``mods.d/<name>.conf`` and per testament the .bzs/.bzv/.bzz
    files, ``block_slots`` slots per compressed block; ``conf`` adds or overrides entries."""
    data_path = f"./modules/texts/ztext/{name.lower()}/"
    entries = {
        "DataPath": data_path,
        "ModDrv": "zText",
        "SourceType": "OSIS",
        "Encoding": "UTF-8",
        "CompressType": "ZIP",
        "BlockType": "BOOK",
        **(conf or {}),
    }
    lines = [f"# {name}: a test module", f"[{name}]"]
    lines += [f"{key}={value}" for key, value in entries.items()]
    (library / "mods.d").mkdir(parents=True, exist_ok=True)
    (library / "mods.d" / f"{name.lower()}.conf").write_text("\n".join(lines) + "\n")
    directory = library / data_path
    directory.mkdir(parents=True, exist_ok=True)
    for key, slots in testaments.items():
        bzs, bzv, bzz = bytearray(), bytearray(), bytearray()
        for first in range(0, len(slots), block_slots):
            block, texts = bytearray(), slots[first : first + block_slots]
            for text in texts:
                encoded = text.encode()
                offset = len(block)
                block += encoded
                bzv += struct.pack("<IIH", len(bzs) // 12, offset if encoded else 0, len(encoded))
            packed = zlib.compress(bytes(block))
            bzs += struct.pack("<III", len(bzz), len(packed), len(block))
            bzz += packed
        for suffix, content in (("bzs", bzs), ("bzv", bzv), ("bzz", bzz)):
            (directory / f"{key}.{suffix}").write_bytes(bytes(content))


def debian_package(library: Path) -> bytes:
    """A Debian package (ar archive: debian-binary, control.tar.xz, data.tar.xz) that installs
    ``library`` as ``./usr/share/sword``."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        tar.add(library, arcname="./usr/share/sword")
    control = io.BytesIO()
    with tarfile.open(fileobj=control, mode="w:xz"):
        pass
    archive = bytearray(b"!<arch>\n")
    members = {"debian-binary": b"2.0\n", "control.tar.xz": control.getvalue()}
    for member, content in {**members, "data.tar.xz": data.getvalue()}.items():
        header = f"{member:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(content):<10}`\n"
        archive += header.encode() + content + b"\n" * (len(content) % 2)
    return bytes(archive)
