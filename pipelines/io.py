"""Files the stages exchange: JSON written atomically, parallel corpora as line-aligned files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from components.data.atomic import atomic_write_text
from components.data.local import SPLITS, read_parallel

Pairs = list[tuple[str, str]]


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON at ``path``, written atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def write_corpus(directory: Path, splits: dict[str, Pairs]) -> dict[str, Any]:
    """``<split>.src`` / ``<split>.tgt`` files (one sentence per line) and their description."""
    files = {}
    for split in SPLITS:
        for side, index in (("src", 0), ("tgt", 1)):
            text = "".join(pair[index] + "\n" for pair in splits[split])
            atomic_write_text(directory / f"{split}.{side}", text)
            files[f"{split}.{side}"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return {"sizes": {split: len(splits[split]) for split in SPLITS}, "sha256": files}


def read_corpus(directory: Path) -> dict[str, Pairs]:
    """The splits written by :func:`write_corpus` (validated like a user's local corpus)."""
    return {
        split: read_parallel(directory / f"{split}.src", directory / f"{split}.tgt")
        for split in SPLITS
    }


def fingerprint(*parts: Any) -> str:
    """A short, stable digest of JSON-serialisable ``parts`` (settings, data digests)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def code_digest(paths: tuple[str, ...]) -> str:
    """Digest of the source files ``paths`` (relative to the project root): part of a grid
    cell's fingerprint, so that a change of the code it runs retrains the cell."""
    root = Path(__file__).resolve().parents[1]
    return fingerprint(*(hashlib.sha256((root / path).read_bytes()).hexdigest() for path in paths))
