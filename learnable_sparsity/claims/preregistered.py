"""The claims of ``claims.yaml`` as data: each claim, its check and its pre-registered thresholds.

A threshold is a number a check compares with (a margin, a bound, a length). Each one carries the
publication's value it derives from, its source and the reason for the derivation, and its
``history``: every earlier value, with the date it was replaced and why. Thresholds are fixed
before a run; one moved after seeing results stays honest only through that history, which the
report shows beside the verdict.

Every threshold, and every rule of the statistics (a level, a window), carries the commit and
time it was ``fixed`` at; an earlier value in its history names the unit it was in (when that
differed) and the name it had (when renamed). The rules live in ``claims.yaml``'s ``rules``
(:func:`parse_rules`) and the checks read them through
:func:`learnable_sparsity.claims.checks.rule`: no gate constant is written in code.

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

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    import yaml

WORKS = ("AST", "EST", "SparseMarg", "APE")
TITLE_LENGTH = 70  # the most characters a claim's title may have
_OUT_OF_SCOPE_KEYS = {"id", "title", "work", "source", "text", "reason"}
_THRESHOLD_KEYS = {"value", "unit", "publication", "source", "reason", "history", "fixed"}
_RULE_KEYS = {"value", "unit", "reason", "fixed", "history"}
_HISTORY_KEYS = {"value", "until", "why"}
_HISTORY_OPTIONAL = {"unit", "name", "commit"}
_FIXED_KEYS = {"commit", "at"}


@dataclass(frozen=True)
class Change:
    """An earlier value of a threshold or rule: ``value`` (in ``unit``, under ``name``, where
    these differed from today's; "" otherwise) held until ``until`` (a date or a time), replaced
    because ``why`` (by ``commit``, where the history names it)."""

    value: float | str
    until: datetime.date
    why: str
    unit: str = ""
    name: str = ""
    commit: str = ""

    def describe(self, unit: str) -> str:
        """``value unit`` (this entry's unit, else ``unit``) ``until …``, with its earlier name."""
        shown = f"{self.value:g}" if isinstance(self.value, float) else str(self.value)
        in_unit = self.unit or unit
        named = f" (as {self.name})" if self.name else ""
        return f"{shown}{' ' + in_unit if in_unit else ''}{named} until {self.until.isoformat()}"


@dataclass(frozen=True)
class Fixed:
    """When a value was fixed: the ``commit`` that set it and its time ``at`` (UTC)."""

    commit: str
    at: datetime.datetime


@dataclass(frozen=True)
class Threshold:
    """A pre-registered number a check compares with, and where it comes from."""

    value: float
    unit: str
    publication: str
    source: str
    reason: str
    history: tuple[Change, ...] = ()
    fixed: Fixed | None = None

    def describe(self, name: str) -> str:
        """``name = value unit (source)``, with when it was fixed and the earlier values (each
        in its own unit), for the report."""
        text = f"{name} = {self.value:g}{' ' + self.unit if self.unit else ''} ({self.source})"
        if self.fixed:
            text += f", fixed {self.fixed.at:%Y-%m-%d} (`{self.fixed.commit[:10]}`)"
        earlier = "; ".join(change.describe(self.unit) for change in self.history)
        return f"{text}; was {earlier}" if earlier else text


@dataclass(frozen=True)
class Rule:
    """A rule of the statistics every check shares (a level, a window, the test a kind of claim
    gets): its ``value`` (a number, or the name of a test), ``unit``, ``reason``, when it was
    ``fixed`` and its ``history``."""

    value: float | str
    unit: str
    reason: str
    fixed: Fixed
    history: tuple[Change, ...] = ()


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


def _time(value: Any, where: str) -> datetime.datetime:
    """A time (UTC when it names no zone) or a date (its midnight, UTC)."""
    if isinstance(value, datetime.datetime):
        moment = value
    elif isinstance(value, datetime.date):
        moment = datetime.datetime.combine(value, datetime.time())
    else:
        try:
            moment = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise LearnableSparsityError(
                f"claims.yaml: {where} is not a time (YYYY-MM-DDTHH:MM:SSZ): {value!r}"
            ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def _fixed(entry: Any, where: str) -> Fixed:
    if not isinstance(entry, Mapping) or set(entry) != _FIXED_KEYS:
        raise LearnableSparsityError(
            f"claims.yaml: {where}.fixed needs exactly {sorted(_FIXED_KEYS)}"
        )
    return Fixed(str(entry["commit"]), _time(entry["at"], f"{where}.fixed.at"))


def _history(entries: Any, where: str, numeric: bool = True) -> tuple[Change, ...]:
    history = []
    for i, change in enumerate(entries or ()):
        at = f"{where}.history[{i}]"
        keys = set(change) if isinstance(change, Mapping) else set()
        if not keys >= _HISTORY_KEYS or keys - _HISTORY_KEYS - _HISTORY_OPTIONAL:
            raise LearnableSparsityError(
                f"claims.yaml: {at} needs {sorted(_HISTORY_KEYS)} (and may have "
                f"{sorted(_HISTORY_OPTIONAL)})"
            )
        extra = {key: str(change[key]) for key in _HISTORY_OPTIONAL & keys}
        history.append(
            Change(
                float(change["value"]) if numeric else str(change["value"]),
                _date(change["until"], at),
                change["why"],
                **extra,
            )
        )
    dates = [change.until for change in history]
    if dates != sorted(dates):
        raise LearnableSparsityError(f"claims.yaml: {where}.history must be oldest first")
    return tuple(history)


def _threshold(entry: Any, where: str) -> Threshold:
    if not isinstance(entry, Mapping):
        raise LearnableSparsityError(f"claims.yaml: {where} must be a mapping")
    unknown = sorted(set(entry) - _THRESHOLD_KEYS)
    if unknown:
        raise LearnableSparsityError(f"claims.yaml: {where} has unknown keys {unknown}")
    _require(entry, {"publication", "source", "reason"}, where)
    if not isinstance(entry.get("value"), int | float) or isinstance(entry["value"], bool):
        raise LearnableSparsityError(f"claims.yaml: {where}.value must be a number")
    return Threshold(
        float(entry["value"]),
        entry.get("unit", ""),
        entry["publication"],
        entry["source"],
        entry["reason"],
        _history(entry.get("history"), where),
        _fixed(entry["fixed"], where) if "fixed" in entry else None,
    )


def _rule(entry: Any, where: str) -> Rule:
    if not isinstance(entry, Mapping):
        raise LearnableSparsityError(f"claims.yaml: {where} must be a mapping")
    unknown = sorted(set(entry) - _RULE_KEYS)
    if unknown:
        raise LearnableSparsityError(f"claims.yaml: {where} has unknown keys {unknown}")
    _require(entry, {"value", "reason", "fixed"}, where)
    value = entry["value"]
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if not numeric and not isinstance(value, str):
        raise LearnableSparsityError(f"claims.yaml: {where}.value must be a number or a name")
    return Rule(
        float(value) if numeric else value,
        entry.get("unit", ""),
        entry["reason"],
        _fixed(entry["fixed"], where),
        _history(entry.get("history"), where, numeric=numeric),
    )


def parse_rules(text: str) -> dict[str, Rule]:
    """The ``rules`` of a ``claims.yaml`` text, checked: each a value with its reason, the commit
    and time it was fixed, its history dated (oldest first)."""
    data = yaml.safe_load(text)
    rules = data.get("rules")
    if not isinstance(rules, Mapping) or not rules:
        raise LearnableSparsityError("claims.yaml: needs a mapping `rules` (the statistics' rules)")
    return {name: _rule(entry, f"rule {name!r}") for name, entry in rules.items()}


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
    ``recorded`` then (under ``recorded_name`` and in ``recorded_unit``; None: the threshold did
    not exist under this name or an earlier one), ``value`` now (in ``unit``), and whether the
    threshold's history accounts for the change (the old value, replaced on or after the date
    the record was kept)."""

    claim: str
    name: str
    recorded: float | None
    value: float
    in_history: bool
    recorded_name: str = ""
    recorded_unit: str = ""
    unit: str = ""

    def describe(self) -> str:
        if self.recorded is None:
            was = "no such threshold"
        else:
            unit = f" {self.recorded_unit}" if self.recorded_unit else ""
            named = f" (as {self.recorded_name})" if self.recorded_name != self.name else ""
            was = f"{self.recorded:g}{unit}{named}"
        now = f"{self.value:g}{' ' + self.unit if self.unit else ''}"
        note = "" if self.in_history else " — NOT in the threshold's history"
        return f"{self.claim} {self.name}: {was} when the record was kept, {now} now{note}"


def threshold_changes(
    claims: tuple[Claim, ...],
    recorded: Mapping[str, Mapping[str, float]],
    kept_on: datetime.date,
) -> list[ThresholdChange]:
    """The thresholds of ``claims`` that differ from ``recorded`` (claim id → name → value, as
    a record kept on ``kept_on`` was judged with), found under their name or a name their
    history gives them earlier (in that entry's unit). A new claim or threshold is a change
    from None, which needs no history."""
    changes = []
    for claim in claims:
        kept = recorded.get(claim.id, {})
        for name, threshold in claim.thresholds.items():
            earlier_names = [c.name for c in threshold.history if c.name and c.name in kept]
            then_name = name if name in kept else next(iter(earlier_names), name)
            then = kept.get(then_name)
            if then is not None and then == threshold.value and then_name == name:
                continue
            entries = [
                c
                for c in threshold.history
                if c.value == then and c.until >= kept_on and (c.name or name) == then_name
            ]
            in_history = then is None or bool(entries)
            unit = entries[0].unit if entries and entries[0].unit else threshold.unit
            changes.append(
                ThresholdChange(
                    claim.id,
                    name,
                    then,
                    threshold.value,
                    in_history,
                    then_name,
                    unit if then is not None else "",
                    threshold.unit,
                )
            )
    return changes


def _moved(value: float | str, unit: str, fixed: Fixed | None, history: tuple[Change, ...]) -> str:
    shown = f"{value:g}" if isinstance(value, float) else value
    when = f" fixed {fixed.at:%Y-%m-%d %H:%M} (`{fixed.commit[:10]}`)" if fixed else ""
    was = f"; was {history[-1].describe(unit)}" if history else ""
    return f"{shown}{' ' + unit if unit else ''}{when}{was}"


def rules_fixed_since(rules: Mapping[str, Rule], since: datetime.datetime) -> list[str]:
    """The rules of ``rules`` fixed after ``since`` (every claim's verdict may hang on them), each
    as ``name = value unit fixed <time> (<commit>); was <the entry it replaced>``."""
    return [
        f"{name} = {_moved(rule.value, '', rule.fixed, rule.history)}"
        for name, rule in rules.items()
        if rule.fixed.at > since
    ]


def thresholds_fixed_since(claim: Claim, since: datetime.datetime) -> list[str]:
    """The thresholds of ``claim`` fixed after ``since`` or replaced since (a history entry held
    until on or after its date), each as ``name = value unit fixed …; was …``."""
    return [
        f"{name} = {_moved(t.value, t.unit, t.fixed, t.history)}"
        for name, t in claim.thresholds.items()
        if (t.fixed and t.fixed.at > since) or any(c.until >= since.date() for c in t.history)
    ]
