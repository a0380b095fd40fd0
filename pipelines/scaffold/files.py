"""The files stages and cells read and write: atomic JSON, JSON read with an error naming the
stage to run, figures as PNG, content digests, an output folder cleared before it is rewritten."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from learnable_sparsity.errors import LearnableSparsityError, MissingInputError
from learnable_sparsity.files import atomic_write_text, sha256_of

_FIGURE_DPI = 110


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON at ``path``, written atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    """The JSON at ``path``; a missing or malformed file raises naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingInputError(f"{path} is missing: run the stage that writes it") from None
    except json.JSONDecodeError as error:
        raise LearnableSparsityError(f"{path} is not valid JSON: {error}") from None


def png(figure: Figure) -> bytes:
    """``figure`` rendered as PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=_FIGURE_DPI)
    return buffer.getvalue()


def file_digest(path: Path) -> str:
    """SHA-256 of the contents of ``path`` (an input of a cell); a missing file raises."""
    if not Path(path).is_file():
        raise MissingInputError(f"{path} is missing: run the stage that writes it")
    return sha256_of(path)


def clear(directory: Path) -> None:
    """Remove ``directory`` (a stage's output it rewrites in full) if it exists."""
    shutil.rmtree(directory, ignore_errors=True)
