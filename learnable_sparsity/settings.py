r"""Settings: every params section is a frozen dataclass, validated where it is defined.

A section of ``params.yaml`` (``nmt.model``, ``nmt.train``, ``lvm.ssvae``, …) is a frozen,
keyword-only subclass of :class:`Settings` owned by the component that uses it. A field states
its type by its annotation and its range with :func:`setting`; constructing the dataclass checks
both and then calls :meth:`Settings.validate` for constraints that tie fields together. So a
settings object that exists is valid, wherever it was made.

:func:`build` makes one from a plain mapping — a params section, or the ``dataclasses.asdict``
payload a Ray task receives — converting what YAML and JSON produce (lists → tuples, ints →
floats, YAML 1.1's float spellings such as ``1e-3`` that arrive as strings → floats, mappings →
nested settings). Every error is a :class:`SettingsError` that names the full key::

    nmt.train.peak_lr must be a number > 0, got -0.001
    nmt.model has unknown keys ['heads']; known: ['attention_dropout', 'd_ff', …]

Supported annotations: ``int``, ``float``, ``bool``, ``str``, ``None``, ``Literal[...]``,
``tuple[X, ...]``, ``dict[str, X]``, nested ``Settings`` subclasses and unions of these
(``X | None``). ``bool`` is never accepted as a number, and floats must be finite.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from learnable_sparsity.errors import LearnableSparsityError

S = TypeVar("S", bound="Settings")

_BOUNDS = (("at_least", ">="), ("above", ">"), ("at_most", "<="), ("below", "<"))


class SettingsError(LearnableSparsityError):
    """A setting is missing, unknown, of the wrong type or out of range; ``key`` names it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key} {problem}" if key else problem)
        self.key, self.problem = key, problem

    def within(self, prefix: str) -> SettingsError:
        """The same error with ``prefix`` (the key of the enclosing section) in front."""
        return SettingsError(_join(prefix, self.key), self.problem)


def setting(
    default: Any = dataclasses.MISSING,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    distinct: bool = False,
    derived: bool = False,
) -> Any:
    """A settings field with a range: the bounds apply to a number, or to every element of a
    tuple / value of a dict. ``distinct``: a tuple's elements must differ (a grid axis).
    ``derived``: not read from params but set by the code that knows it (e.g. a vocabulary
    size); :func:`build` refuses it as a params key."""
    metadata = {
        "at_least": at_least,
        "above": above,
        "at_most": at_most,
        "below": below,
        "distinct": distinct,
        "derived": derived,
    }
    if isinstance(default, list | dict | set):
        raise TypeError("settings defaults must be immutable (a tuple, not a list)")
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Base class of the settings dataclasses: checks types and ranges on construction.

    Subclasses are declared ``@dataclass(frozen=True, kw_only=True)`` and may override
    :meth:`validate` for constraints between fields.
    """

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for field in dataclasses.fields(self):
            _check(field.name, getattr(self, field.name), hints[field.name], field.metadata)
        self.validate()

    def validate(self) -> None:
        """Constraints between fields; raise ``SettingsError(field, problem)``."""


def build(cls: type[S], data: Any, where: str = "", **derived: Any) -> S:
    """``cls`` from the mapping ``data`` (plus the ``derived`` fields), errors keyed by ``where``.

    Unknown keys, missing fields, wrong types and out-of-range values raise
    :class:`SettingsError` naming the full key, e.g. ``where.field``.
    """
    if not isinstance(data, Mapping):
        raise SettingsError(where, f"must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    accepted = sorted(name for name, f in fields.items() if not f.metadata.get("derived"))
    unknown = sorted(str(key) for key in data if key not in accepted)
    if unknown:
        raise SettingsError(where, f"has unknown keys {unknown}; known: {accepted}")
    missing = [
        name
        for name, f in fields.items()
        if name not in data
        and name not in derived
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise SettingsError(_join(where, missing[0]), "is missing")
    hints = _hints(cls)
    values = {
        name: _convert(value, hints[name], _join(where, name)) for name, value in data.items()
    }
    try:
        return cls(**values, **derived)
    except SettingsError as error:
        raise error.within(where) from None


def build_tagged(
    classes: Mapping[str, type[Settings]], data: Any, where: str, tag: str = "source"
) -> Settings:
    """The settings of a section whose ``tag`` key picks its class (e.g. a corpus entry with
    ``source: local``), built from ``data``; an unknown or missing tag names the key."""
    chosen = data.get(tag) if isinstance(data, Mapping) else None
    if chosen not in classes:
        raise SettingsError(_join(where, tag), f"must be one of {list(classes)}, got {chosen!r}")
    return build(classes[chosen], data, where)


def params_of(settings: Settings) -> dict[str, Any]:
    """``settings`` in the form :func:`build` reads back: plain JSON data (tuples as lists,
    nested settings as mappings), without the derived fields."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(settings):
        if field.metadata.get("derived"):
            continue
        value = getattr(settings, field.name)
        out[field.name] = params_of(value) if isinstance(value, Settings) else _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix and key else prefix or key


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _arms(annotation: Any) -> tuple[Any, ...] | None:
    """The members of a union annotation, or None for any other annotation."""
    if get_origin(annotation) in (Union, types.UnionType):
        return get_args(annotation)
    return None


def _convert(value: Any, annotation: Any, key: str) -> Any:
    """``value`` as YAML/JSON gave it, turned into what ``annotation`` asks for where that is
    unambiguous; anything else is left for the type check to report."""
    arms = _arms(annotation)
    if arms is not None:
        if value is None:
            return None
        real = [arm for arm in arms if arm is not type(None)]
        return _convert(value, real[0], key) if len(real) == 1 else value
    origin = get_origin(annotation)
    if annotation is float and not isinstance(value, bool):
        if isinstance(value, int):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
            except ValueError:
                return value
    if origin is tuple and isinstance(value, list | tuple):
        element = get_args(annotation)[0]
        return tuple(_convert(v, element, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict and isinstance(value, Mapping):
        element = get_args(annotation)[1]
        return {k: _convert(v, element, _join(key, str(k))) for k, v in value.items()}
    is_settings = isinstance(annotation, type) and issubclass(annotation, Settings)
    if is_settings and isinstance(value, Mapping):
        return build(annotation, value, key)
    return value


def _describe(annotation: Any) -> str:
    """A reader's name for what ``annotation`` accepts."""
    arms = _arms(annotation)
    if arms is not None:
        return " or ".join(_describe(arm) for arm in arms)
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(annotation))
    if origin is tuple:
        return f"a list of {_plural(get_args(annotation)[0])}"
    if origin is dict:
        return f"a mapping of names to {_plural(get_args(annotation)[1])}"
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a text"}
    if annotation is type(None):
        return "null"
    if annotation in names:
        return names[annotation]
    return f"a mapping ({annotation.__name__})"


def _plural(annotation: Any) -> str:
    words = {int: "integers", float: "numbers", bool: "booleans", str: "texts"}
    return words.get(annotation, _describe(annotation))


def _is_instance(value: Any, annotation: Any) -> bool:
    arms = _arms(annotation)
    if arms is not None:
        return any(_is_instance(value, arm) for arm in arms)
    origin = get_origin(annotation)
    if origin is Literal:
        return value in get_args(annotation)
    if origin is tuple:
        element = get_args(annotation)[0]
        return isinstance(value, tuple) and all(_is_instance(v, element) for v in value)
    if origin is dict:
        key_type, element = get_args(annotation)
        return isinstance(value, Mapping) and all(
            isinstance(k, key_type) and _is_instance(v, element) for k, v in value.items()
        )
    if annotation is type(None):
        return value is None
    if annotation in (int, float) and isinstance(value, bool):
        return False
    if annotation is float:
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, annotation)


def _numbers(value: Any) -> list[tuple[str, Any]]:
    """(suffix, number) of every number that a range applies to inside ``value``."""
    if isinstance(value, tuple):
        return [(f"[{i}]", v) for i, v in enumerate(value) if _is_number(v)]
    if isinstance(value, Mapping):
        return [(f".{k}", v) for k, v in value.items() if _is_number(v)]
    return [("", value)] if _is_number(value) else []


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check(name: str, value: Any, annotation: Any, metadata: Mapping[str, Any]) -> None:
    """Raise :class:`SettingsError` unless ``value`` fits ``annotation`` and the bounds."""
    if not _is_instance(value, annotation):
        raise SettingsError(name, f"must be {_describe(annotation)}, got {value!r}")
    bounds = [(symbol, metadata.get(key)) for key, symbol in _BOUNDS]
    bounds = [(symbol, limit) for symbol, limit in bounds if limit is not None]
    for suffix, number in _numbers(value):
        for symbol, limit in bounds:
            inside = {
                ">=": number >= limit,
                ">": number > limit,
                "<=": number <= limit,
                "<": number < limit,
            }[symbol]
            if not inside:
                expected = " and ".join(f"{s} {v:g}" for s, v in bounds)
                raise SettingsError(f"{name}{suffix}", f"must be {expected}, got {number!r}")
    if metadata.get("distinct") and isinstance(value, tuple) and len(set(value)) < len(value):
        repeated = sorted({v for v in value if value.count(v) > 1}, key=str)
        raise SettingsError(name, f"lists {repeated} more than once: grid entries must differ")
