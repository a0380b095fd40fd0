"""The claims of ``claims.yaml`` as data: each claim, its check and its pre-registered thresholds.

A threshold is a number a check compares with (a margin, a bound, a length). Each one carries the
publication's value it derives from, its source and the reason for the derivation, and its
``history``: every earlier value, with the date it was replaced and why. Thresholds are fixed
before a run; one moved after seeing results stays honest only through that history, which the
report shows beside the verdict.

A claim of the seed documents that no check covers is listed under ``out_of_scope`` with the
reason; the report counts and shows them, so that a claim is never silently left out.

Every claim, checked or out of scope, has a ``title``: the claim in a few plain words (at most
:data:`TITLE_LENGTH` characters, one line), its row in the matrix of verdicts per run.
"""

from __future__ import annotations

import datetime
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from learnable_sparsity.errors import LearnableSparsityError

WORKS = ("AST", "EST", "SparseMarg", "APE")
TITLE_LENGTH = 70  # the most characters a claim's title may have
_OUT_OF_SCOPE_KEYS = {"id", "title", "work", "source", "text", "reason"}
_THRESHOLD_KEYS = {"value", "unit", "publication", "source", "reason", "history"}
_HISTORY_KEYS = {"value", "until", "why"}


@dataclass(frozen=True)
class Change:
    """An earlier value of a threshold: ``value`` held until ``until`` (a date), replaced
    because ``why``."""

    value: float
    until: datetime.date
    why: str


@dataclass(frozen=True)
class Threshold:
    """A pre-registered number a check compares with, and where it comes from."""

    value: float
    unit: str
    publication: str
    source: str
    reason: str
    history: tuple[Change, ...] = ()

    def describe(self, name: str) -> str:
        """``name = value unit (source)``, with the earlier values, for the report."""
        text = f"{name} = {self.value:g}{' ' + self.unit if self.unit else ''} ({self.source})"
        earlier = "; ".join(f"{c.value:g} until {c.until.isoformat()}" for c in self.history)
        return f"{text}; was {earlier}" if earlier else text


@dataclass(frozen=True)
class Claim:
    """One qualitative claim of a paper and how it is tested: ``check`` (a check of
    :data:`learnable_sparsity.claims.catalog.CHECKS`) called with ``args`` and the thresholds'
    values."""

    id: str
    title: str
    work: str
    source: str
    text: str
    check: str
    args: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, Threshold] = field(default_factory=dict)

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of the check: ``args`` and every threshold's value."""
        return {**self.args, **{name: t.value for name, t in self.thresholds.items()}}


@dataclass(frozen=True)
class OutOfScope:
    """A claim of the seed documents that no check tests, and why."""

    id: str
    title: str
    work: str
    source: str
    text: str
    reason: str


def _require(entry: Mapping[str, Any], keys: set[str], where: str) -> None:
    absent = sorted(key for key in keys if not entry.get(key))
    if absent:
        raise LearnableSparsityError(f"claims.yaml: {where} needs {', '.join(absent)}")


def _require_title(entry: Mapping[str, Any], where: str) -> None:
    title = entry["title"]
    if not isinstance(title, str) or "\n" in title or len(title) > TITLE_LENGTH:
        raise LearnableSparsityError(
            f"claims.yaml: {where} needs a title of one line and at most {TITLE_LENGTH} "
            f"characters: {title!r}"
        )


def _date(value: Any, where: str) -> datetime.date:
    if isinstance(value, datetime.date):
        return value
    try:
        return datetime.date.fromisoformat(str(value))
    except ValueError:
        raise LearnableSparsityError(
            f"claims.yaml: {where} is not a date (YYYY-MM-DD): {value!r}"
        ) from None


def _threshold(entry: Any, where: str) -> Threshold:
    if not isinstance(entry, Mapping):
        raise LearnableSparsityError(f"claims.yaml: {where} must be a mapping")
    unknown = sorted(set(entry) - _THRESHOLD_KEYS)
    if unknown:
        raise LearnableSparsityError(f"claims.yaml: {where} has unknown keys {unknown}")
    _require(entry, {"publication", "source", "reason"}, where)
    if not isinstance(entry.get("value"), int | float) or isinstance(entry["value"], bool):
        raise LearnableSparsityError(f"claims.yaml: {where}.value must be a number")
    history = []
    for i, change in enumerate(entry.get("history") or ()):
        at = f"{where}.history[{i}]"
        if not isinstance(change, Mapping) or set(change) != _HISTORY_KEYS:
            raise LearnableSparsityError(f"claims.yaml: {at} needs exactly {sorted(_HISTORY_KEYS)}")
        history.append(Change(float(change["value"]), _date(change["until"], at), change["why"]))
    dates = [change.until for change in history]
    if dates != sorted(dates):
        raise LearnableSparsityError(f"claims.yaml: {where}.history must be oldest first")
    return Threshold(
        float(entry["value"]),
        entry.get("unit", ""),
        entry["publication"],
        entry["source"],
        entry["reason"],
        tuple(history),
    )


def _claim(entry: Mapping[str, Any], checks: Mapping[str, Callable[..., Any]]) -> Claim:
    where = f"claim {entry.get('id')!r}"
    _require(entry, {"id", "title", "work", "source", "text", "check"}, where)
    _require_title(entry, where)
    if entry["work"] not in WORKS:
        raise LearnableSparsityError(
            f"claims.yaml: {where} names an unknown work {entry['work']!r}"
        )
    if entry["check"] not in checks:
        raise LearnableSparsityError(
            f"claims.yaml: {where} names an unknown check {entry['check']!r}"
        )
    thresholds = {
        name: _threshold(spec, f"{where} threshold {name!r}")
        for name, spec in (entry.get("thresholds") or {}).items()
    }
    claim = Claim(
        entry["id"],
        entry["title"],
        entry["work"],
        entry["source"],
        entry["text"],
        entry["check"],
        dict(entry.get("args") or {}),
        thresholds,
    )
    overlap = sorted(set(claim.args) & set(thresholds))
    if overlap:
        raise LearnableSparsityError(f"claims.yaml: {where} gives {overlap} as args and thresholds")
    try:
        inspect.signature(checks[claim.check]).bind(None, **claim.arguments())
    except TypeError as error:
        raise LearnableSparsityError(
            f"claims.yaml: {where}: its args and thresholds do not fit check "
            f"{claim.check!r}: {error}"
        ) from None
    return claim


def parse_claims(
    text: str, checks: Mapping[str, Callable[..., Any]]
) -> tuple[tuple[Claim, ...], tuple[OutOfScope, ...]]:
    """The claims and the out-of-scope claims of a ``claims.yaml`` text, checked: a short title
    each, known works and checks, arguments that fit the check, every threshold sourced and
    reasoned, its history dated (oldest first), unique ids."""
    data = yaml.safe_load(text)
    claims = tuple(_claim(entry, checks) for entry in data["claims"])
    excluded = []
    for entry in data.get("out_of_scope") or ():
        where = f"out-of-scope claim {entry.get('id')!r}"
        _require(entry, _OUT_OF_SCOPE_KEYS, where)
        unknown = sorted(set(entry) - _OUT_OF_SCOPE_KEYS)
        if unknown:
            raise LearnableSparsityError(f"claims.yaml: {where} has unknown keys {unknown}")
        _require_title(entry, where)
        excluded.append(OutOfScope(**entry))
    seen: set[str] = set()
    for item in (*claims, *excluded):
        if item.id in seen:
            raise LearnableSparsityError(f"claims.yaml: claim id {item.id!r} appears twice")
        seen.add(item.id)
    return claims, tuple(excluded)


@dataclass(frozen=True)
class ThresholdChange:
    """A threshold whose value differs from the one a kept record was judged with:
    ``recorded`` then (None: the threshold did not exist), ``value`` now, and whether the
    threshold's history accounts for the change (the old value, replaced on or after the date
    the record was kept)."""

    claim: str
    name: str
    recorded: float | None
    value: float
    in_history: bool

    def describe(self) -> str:
        was = "no such threshold" if self.recorded is None else f"{self.recorded:g}"
        note = "" if self.in_history else " — NOT in the threshold's history"
        return f"{self.claim} {self.name}: {was} when the record was kept, {self.value:g} now{note}"


def threshold_changes(
    claims: tuple[Claim, ...],
    recorded: Mapping[str, Mapping[str, float]],
    kept_on: datetime.date,
) -> list[ThresholdChange]:
    """The thresholds of ``claims`` that differ from ``recorded`` (claim id → name → value, as
    a record kept on ``kept_on`` was judged with). A new claim or threshold is a change from
    None, which needs no history."""
    changes = []
    for claim in claims:
        for name, threshold in claim.thresholds.items():
            then = recorded.get(claim.id, {}).get(name)
            if then is not None and then == threshold.value:
                continue
            in_history = then is None or any(
                change.value == then and change.until >= kept_on for change in threshold.history
            )
            changes.append(ThresholdChange(claim.id, name, then, threshold.value, in_history))
    return changes
