"""profiles/paper.yaml against docs/paper-settings.md: the table that gives every value its source.

A row whose first cell is one backticked key (`lvm.ssvae.steps`) states the profile's value in its
second cell: a backticked YAML value that must equal the profile's, or "no key" where the profile
must not set it (the publication's setting has no key yet, or the smoke default applies). Every
value the profile sets must have a row (its own key or a key above it) or be listed as
operational, so that neither file can change without the other.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "paper-settings.md"
PROFILE = ROOT / "profiles" / "paper.yaml"
OPERATIONAL = "## Operational, not from a publication"

_KEY_CELL = re.compile(r"^`([A-Za-z0-9_.]+)`$")
_VALUE_CELL = re.compile(r"^`([^`]*)`$")
_MISSING = object()


def rows(markdown: str) -> list[tuple[str, str]]:
    """(key, profile-value cell) of every table row whose first cell is one backticked key."""
    found = []
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and (key := _KEY_CELL.match(cells[0])):
            found.append((key.group(1), cells[1]))
    return found


def operational_patterns(markdown: str) -> list[str]:
    """The backticked keys (``*`` allowed) of the section listing the profile's operational keys."""
    section = markdown.split(OPERATIONAL, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"`([A-Za-z0-9_.*]+)`", section)


def lookup(tree: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def leaves(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict):
        return [prefix]
    return [leaf for key, value in tree.items() for leaf in leaves(value, f"{prefix}{key}.")]


def covers(key: str, leaf: str) -> bool:
    return leaf == key or leaf.startswith(key + ".")


def mismatches(table: str, profile: dict[str, Any]) -> list[str]:
    """Each row whose profile-value cell disagrees with the profile, in words."""
    wrong = []
    for key, cell in rows(table):
        value = lookup(profile, key)
        if cell.startswith("no key"):
            if value is not _MISSING:
                wrong.append(f"{key}: the table says no key, the profile sets {value!r}")
            continue
        literal = _VALUE_CELL.match(cell)
        if literal is None:
            wrong.append(f"{key}: the profile value {cell!r} is neither `yaml` nor 'no key'")
        elif value is _MISSING:
            wrong.append(f"{key}: the table says {cell}, the profile has no such key")
        elif yaml.safe_load(literal.group(1)) != value:
            wrong.append(f"{key}: the table says {cell}, the profile {value!r}")
    return wrong


def unsourced(table: str, profile: dict[str, Any]) -> list[str]:
    """The profile's values with neither a row (their key or one above) nor an operational entry."""
    keys = [key for key, _ in rows(table)]
    patterns = [p for pattern in operational_patterns(table) for p in (pattern, pattern + ".*")]
    return [
        leaf
        for leaf in (leaf.rstrip(".") for leaf in leaves(profile))
        if not any(covers(key, leaf) for key in keys)
        and not any(fnmatch.fnmatchcase(leaf, pattern) for pattern in patterns)
    ]


@pytest.fixture(scope="module")
def table() -> str:
    return TABLE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def profile() -> dict[str, Any]:
    return yaml.safe_load(PROFILE.read_text(encoding="utf-8"))


def test_the_table_has_rows_and_no_key_twice(table: str) -> None:
    keys = [key for key, _ in rows(table)]
    assert len(keys) > 50
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_every_row_states_the_profiles_value(table: str, profile: dict[str, Any]) -> None:
    assert not (wrong := mismatches(table, profile)), "\n".join(wrong)


def test_every_value_of_the_profile_has_a_row_or_is_operational(
    table: str, profile: dict[str, Any]
) -> None:
    missing = unsourced(table, profile)
    assert not missing, f"profiles/paper.yaml keys without a row in {TABLE.name}: {missing}"


def test_a_changed_value_or_a_new_key_is_caught(table: str, profile: dict[str, Any]) -> None:
    """Neither check is vacuous: a profile value changed or added without its row fails them."""
    changed = {
        **profile,
        "lvm": {**profile["lvm"], "ssvae": {**profile["lvm"]["ssvae"], "steps": 1}},
    }
    assert mismatches(table, changed) == ["lvm.ssvae.steps: the table says `148700`, the profile 1"]
    added = {**profile, "bpe": {**profile["bpe"], "character_coverage": 0.99}}
    assert unsourced(table, added) == ["bpe.character_coverage"]
    set_where_the_table_says_none = {
        **profile,
        "nmt": {**profile["nmt"], "train": {**profile["nmt"]["train"], "label_smoothing": 0.2}},
    }
    assert mismatches(table, set_where_the_table_says_none) == [
        "nmt.train.label_smoothing: the table says no key, the profile sets 0.2"
    ]
