"""Reading ``params.yaml``: dotted keys, typed look-ups and errors that name the key at fault."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from components.errors import LearnableSparsityError

PARAMS_FILE = Path("params.yaml")
T = TypeVar("T")


class Params:
    """A params mapping that remembers where it came from, for error messages."""

    def __init__(self, data: Mapping[str, Any], source: str, prefix: str = "") -> None:
        self.data, self.source, self.prefix = data, source, prefix

    def _where(self, key: str) -> str:
        return f"{self.source}: {self.prefix}{key}"

    def get(self, key: str, kind: type | tuple[type, ...] = object) -> Any:
        """The value at dotted ``key`` (e.g. ``nmt.train.max_steps``), checked to be a ``kind``."""
        node: Any = self.data
        walked = []
        for part in key.split("."):
            walked.append(part)
            if not isinstance(node, Mapping) or part not in node:
                raise LearnableSparsityError(f"{self._where('.'.join(walked))} is missing")
            node = node[part]
        expected = kind if isinstance(kind, tuple) else (kind,)
        wrong_bool = isinstance(node, bool) and bool not in expected and int in expected
        if not isinstance(node, kind) or wrong_bool:
            names = " or ".join(k.__name__ for k in expected)
            raise LearnableSparsityError(f"{self._where(key)} must be {names}, got {node!r}")
        return node

    def section(self, key: str) -> Params:
        """The mapping at ``key`` as a ``Params`` whose errors name the full key."""
        return Params(self.get(key, Mapping), self.source, f"{self.prefix}{key}.")

    def build(self, key: str, cls: type[T], **extra: Any) -> T:
        """Construct dataclass ``cls`` from the mapping at ``key`` (plus ``extra`` fields).

        Unknown keys, missing fields and the dataclass's own validation errors are reported
        with the full key.
        """
        values = dict(self.get(key, Mapping))
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        if unknown:
            known = sorted(fields - set(extra))
            raise LearnableSparsityError(
                f"{self._where(key)} has unknown keys {unknown}; known: {known}"
            )
        try:
            return cls(**values, **extra)
        except TypeError as error:
            raise LearnableSparsityError(f"{self._where(key)}: {error}") from None
        except LearnableSparsityError as error:
            raise LearnableSparsityError(f"{self._where(key)}: {error}") from None


def load_params(path: Path = PARAMS_FILE) -> Params:
    """Parse ``path`` (YAML); a missing or malformed file raises an error naming it."""
    if not path.exists():
        raise LearnableSparsityError(f"params file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise LearnableSparsityError(f"params file {path} is not valid YAML: {error}") from None
    if not isinstance(data, Mapping):
        raise LearnableSparsityError(f"params file {path} must hold a mapping at the top level")
    return Params(data, str(path))


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overlay``'s values; nested mappings are merged key by key."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
