"""claims.yaml as pre-registered data: the loader refuses a threshold without its source, reason
or dated history, and a kept record's thresholds are compared with today's; the results the
checks read survive their JSON form."""

from __future__ import annotations

import datetime
import math
import re

import pytest
import yaml

from learnable_sparsity.claims import (
    CHECKS,
    Results,
    checks,
    load_claims,
    results_from_json,
    results_to_json,
)
from learnable_sparsity.claims.preregistered import (
    parse_claims,
    parse_rules,
    rules_fixed_since,
    threshold_changes,
    thresholds_fixed_since,
)
from learnable_sparsity.errors import LearnableSparsityError
from tests.conftest import refused

CLAIM = {
    "id": "c",
    "title": "Top-k translates as well as softmax",
    "work": "EST",
    "source": "Table 4",
    "text": "top-k translates as well as softmax",
    "check": "bleu_at_least_as_good",
    "args": {"variants": ["topk"], "baseline": "softmax"},
    "thresholds": {
        "margin": {
            "value": 0.5,
            "unit": "BLEU",
            "publication": "31.1 vs 30.6",
            "source": "Table 1",
            "reason": "the largest published difference",
            "history": [{"value": 1.0, "until": "2026-11-26", "why": "unsourced"}],
        }
    },
}


def _parse(*claims: dict, out_of_scope: tuple[dict, ...] = ()) -> tuple:
    return parse_claims(
        yaml.safe_dump({"claims": list(claims), "out_of_scope": list(out_of_scope)}), CHECKS
    )


def _with_margin(**changes: object) -> dict:
    margin = {**CLAIM["thresholds"]["margin"], **changes}
    return {**CLAIM, "thresholds": {"margin": {k: v for k, v in margin.items() if v is not None}}}


def test_a_sourced_threshold_reaches_the_check_with_its_history() -> None:
    (claim,), excluded = _parse(CLAIM)
    assert excluded == ()
    assert claim.arguments() == {"variants": ["topk"], "baseline": "softmax", "margin": 0.5}
    (change,) = claim.thresholds["margin"].history
    assert change.value == 1.0 and change.until == datetime.date(2026, 11, 26)
    assert claim.thresholds["margin"].describe("margin") == (
        "margin = 0.5 BLEU (Table 1); was 1 BLEU until 2026-11-26"
    )


def test_a_history_entry_in_another_unit_and_name_is_shown_in_its_own() -> None:
    """An earlier value keeps the unit and the name it had: "1000 steps (as judged_after_steps)"
    beside today's target tokens, never "1000" read in the new unit."""
    earlier = {"value": 1.0, "unit": "BLEU points", "name": "old_margin", "commit": "abc"}
    (claim,), _ = _parse(_with_margin(history=[{**earlier, "until": "2026-11-26", "why": "x"}]))
    threshold = claim.thresholds["margin"]
    (change,) = threshold.history
    assert (change.unit, change.name, change.commit) == ("BLEU points", "old_margin", "abc")
    assert threshold.describe("margin").endswith(
        "was 1 BLEU points (as old_margin) until 2026-11-26"
    )
    kept_on = datetime.date(2026, 11, 25)
    (moved,) = threshold_changes((claim,), {"c": {"old_margin": 1.0}}, kept_on)
    assert (moved.recorded, moved.recorded_name, moved.recorded_unit) == (
        1.0,
        "old_margin",
        "BLEU points",
    )
    assert moved.in_history
    assert moved.describe() == (
        "c margin: 1 BLEU points (as old_margin) when the record was kept, 0.5 BLEU now"
    )
    (unaccounted,) = threshold_changes((claim,), {"c": {"old_margin": 2.0}}, kept_on)
    assert not unaccounted.in_history


def test_a_fixed_time_names_its_commit() -> None:
    (claim,), _ = _parse(_with_margin(fixed={"commit": "f00d", "at": "2026-11-27T10:00:00Z"}))
    fixed = claim.thresholds["margin"].fixed
    assert fixed is not None and fixed.commit == "f00d"
    assert fixed.at == datetime.datetime(2026, 11, 27, 10, tzinfo=datetime.UTC)
    assert "fixed 2026-11-27 (`f00d`)" in claim.thresholds["margin"].describe("margin")
    with pytest.raises(LearnableSparsityError, match="fixed needs exactly"):
        _parse(_with_margin(fixed={"commit": "f00d"}))


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (_with_margin(source=None), "threshold 'margin' needs source"),
        (_with_margin(reason=""), "threshold 'margin' needs reason"),
        (_with_margin(publication=None), "needs publication"),
        (_with_margin(value="half"), "margin'.value must be a number"),
        (_with_margin(limit=3), "unknown keys ['limit']"),
        (_with_margin(history=[{"value": 1.0, "until": "soon", "why": "x"}]), "not a date"),
        (
            _with_margin(history=[{"value": 1.0, "why": "x"}]),
            "history[0] needs ['until', 'value', 'why']",
        ),
        (
            _with_margin(
                history=[
                    {"value": 2.0, "until": "2026-12-01", "why": "x"},
                    {"value": 1.0, "until": "2026-11-01", "why": "y"},
                ]
            ),
            "oldest first",
        ),
        ({**CLAIM, "check": "bleu_better"}, "unknown check 'bleu_better'"),
        ({**CLAIM, "work": "GPT"}, "unknown work 'GPT'"),
        ({**CLAIM, "args": {"variants": ["topk"]}}, "do not fit check 'bleu_at_least_as_good'"),
        ({**CLAIM, "args": {**CLAIM["args"], "margin": 1}}, "as args and thresholds"),
        ({k: v for k, v in CLAIM.items() if k != "source"}, "claim 'c' needs source"),
        ({k: v for k, v in CLAIM.items() if k != "title"}, "claim 'c' needs title"),
        ({**CLAIM, "title": "x" * 71}, "claim 'c' needs a title of one line and at most 70"),
        ({**CLAIM, "title": "two\nlines"}, "claim 'c' needs a title of one line"),
    ],
)
def test_a_claim_without_what_it_needs_is_refused_naming_it(claim: dict, message: str) -> None:
    with pytest.raises(LearnableSparsityError, match=re.escape(message)):
        _parse(claim)


def test_out_of_scope_claims_need_a_title_and_a_reason_and_ids_are_unique() -> None:
    excluded = {
        "id": "x",
        "title": "k = 8 is best",
        "work": "EST",
        "source": "§5.2",
        "text": "k = 8 gives the best mean validation BLEU",
        "reason": "r",
    }
    _, (entry,) = _parse(CLAIM, out_of_scope=(excluded,))
    assert (entry.title, entry.reason) == ("k = 8 is best", "r")
    with pytest.raises(LearnableSparsityError, match="needs reason"):
        _parse(CLAIM, out_of_scope=({**excluded, "reason": ""},))
    with pytest.raises(LearnableSparsityError, match="out-of-scope claim 'x' needs title"):
        _parse(CLAIM, out_of_scope=({k: v for k, v in excluded.items() if k != "title"},))
    with pytest.raises(LearnableSparsityError, match="'x' needs a title of one line and at most"):
        _parse(CLAIM, out_of_scope=({**excluded, "title": "k" * 71},))
    with pytest.raises(LearnableSparsityError, match="'c' appears twice"):
        _parse(CLAIM, out_of_scope=({**excluded, "id": "c"},))


def test_a_threshold_moved_after_a_record_was_kept_needs_its_history() -> None:
    claims, _ = _parse(CLAIM)
    kept = datetime.date(2026, 11, 25)
    # kept with 1.0, changed to 0.5 on 2026-11-26 with the reason: accounted for
    (change,) = threshold_changes(claims, {"c": {"margin": 1.0}}, kept)
    assert (change.recorded, change.value, change.in_history) == (1.0, 0.5, True)
    # kept with 0.7: no history entry says 0.7 was replaced
    (change,) = threshold_changes(claims, {"c": {"margin": 0.7}}, kept)
    assert not change.in_history and "NOT in the threshold's history" in change.describe()
    # the history entry predates the record: the record was judged with 0.5 already
    (change,) = threshold_changes(claims, {"c": {"margin": 1.0}}, datetime.date(2026, 12, 1))
    assert not change.in_history
    assert threshold_changes(claims, {"c": {"margin": 0.5}}, kept) == []
    # a threshold the record did not have is new, not moved
    (change,) = threshold_changes(claims, {}, kept)
    assert change.recorded is None and change.in_history


def test_results_survive_their_json_form_and_an_older_record_names_what_it_lacks() -> None:
    results = Results(
        bleu={"smoke": {"softmax": [90.0, float("nan")]}},
        valid_nll={"smoke": {"softmax": [[(250, 1.5), (500, 1.2)]]}},
        alpha_trajectories=[[(20, [1.5, 1.6])]],
        missing={"ape": "no APE stage"},
    )
    data = results_to_json(results)
    assert data["bleu"]["smoke"]["softmax"][1] is None  # JSON has no NaN
    back = results_from_json(data, "r.json")
    assert back.valid_nll == {"smoke": {"softmax": [[[250, 1.5], [500, 1.2]]]}}
    assert back.missing == {"ape": "no APE stage"}
    older = {k: v for k, v in data.items() if k not in ("density", "lvm_calls")}
    back = results_from_json(older, "reports/evidence/results.json")
    assert "kept before it was recorded" in back.missing["density"]
    assert set(back.missing) == {"ape", "density", "lvm_calls"}
    with pytest.raises(LearnableSparsityError, match=re.escape("unknown result fields ['bleus']")):
        results_from_json({**data, "bleus": {}}, "r.json")
    with pytest.raises(LearnableSparsityError, match="results format 7"):
        results_from_json({**data, "format": 7}, "r.json")
    assert math.isnan(results.bleu["smoke"]["softmax"][1])  # the original is left as it was


def test_the_committed_claims_file_parses_with_every_check() -> None:
    claims = load_claims()
    assert {claim.check for claim in claims} == set(CHECKS)  # no check without a claim


RULE = {
    "value": 0.05,
    "unit": "level",
    "reason": "conventional",
    "fixed": {"commit": "b2e1f63", "at": "2026-11-24T01:06:01Z"},
}


def test_the_rules_are_read_from_claims_yaml_with_when_they_were_fixed() -> None:
    rules = checks.registry()
    assert rules["significance"].value == 0.05 == checks.rule("significance")
    assert rules["trend_window"].fixed.commit == "2d70ed8"
    assert checks.min_seeds() == 3
    with pytest.raises(LearnableSparsityError, match="no rule 'nonsense'"):
        checks.rule("nonsense")


def test_a_rule_can_be_overridden_for_a_verdict_and_is_restored() -> None:
    with checks.rules_overridden({"significance": 0.1}):
        assert checks.rule("significance") == 0.1
        with checks.rules_overridden({"min_seeds": 2}):
            assert (checks.rule("significance"), checks.min_seeds()) == (0.1, 2)
    assert checks.rule("significance") == 0.05
    with (
        pytest.raises(
            LearnableSparsityError, match=re.escape("no such rules in claims.yaml: ['x']")
        ),
        checks.rules_overridden({"x": 1.0}),
    ):
        pass


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (None, "needs a mapping `rules`"),
        ({"level": {**RULE, "extra": 1}}, "unknown keys ['extra']"),
        ({"level": {k: v for k, v in RULE.items() if k != "fixed"}}, "needs fixed"),
        ({"level": {**RULE, "value": [1]}}, "a number or a name"),
        ({"level": {**RULE, "fixed": {"commit": "x"}}}, "fixed needs exactly"),
        ({"level": {**RULE, "fixed": {"commit": "x", "at": "noon"}}}, "is not a time"),
    ],
)
def test_a_rule_without_what_it_needs_is_refused_naming_it(rules: object, message: str) -> None:
    with pytest.raises(LearnableSparsityError, match=re.escape(message)):
        parse_rules(yaml.safe_dump({"rules": rules}))


def test_a_named_rule_keeps_its_earlier_names_as_text() -> None:
    entry = {
        **RULE,
        "value": "paired",
        "history": [{"value": "Welch", "until": "2026-11-28", "why": "x"}],
    }
    (rule,) = parse_rules(yaml.safe_dump({"rules": {"pairing": entry}})).values()
    assert rule.value == "paired" and rule.history[0].value == "Welch"
    assert rule.history[0].describe("") == "Welch until 2026-11-28"


def test_a_threshold_without_history_or_unit_is_described_by_its_value_and_source() -> None:
    (claim,), _ = _parse(_with_margin(unit=None, history=None))
    margin = claim.thresholds["margin"]
    assert (margin.unit, margin.publication, margin.reason) == (
        "",
        "31.1 vs 30.6",
        "the largest published difference",
    )
    assert margin.describe("margin") == "margin = 0.5 (Table 1)"
    assert claim.work == "EST"
    # moved since a record was kept: no unit then or now, the same name
    (change,) = threshold_changes((claim,), {"c": {"margin": 1.0}}, datetime.date(2026, 11, 25))
    assert change.describe() == (
        "c margin: 1 when the record was kept, 0.5 now — NOT in the threshold's history"
    )


def test_a_fixed_time_is_read_in_its_zone_a_date_as_midnight_utc() -> None:
    def fixed_at(at: object) -> datetime.datetime:
        (claim,), _ = _parse(_with_margin(fixed={"commit": "f00d", "at": at}))
        return claim.thresholds["margin"].fixed.at

    assert fixed_at("2026-11-27T10:00:00+01:00") == datetime.datetime(
        2026, 11, 27, 10, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
    )
    assert fixed_at("2026-11-27T10:00:00+01:00").utcoffset() == datetime.timedelta(hours=1)
    assert fixed_at("2026-11-27T10:00:00") == datetime.datetime(
        2026, 11, 27, 10, tzinfo=datetime.UTC
    )
    assert fixed_at(datetime.date(2026, 11, 27)) == datetime.datetime(
        2026, 11, 27, tzinfo=datetime.UTC
    )
    naive = datetime.datetime(2026, 11, 27, 9, 30)
    assert fixed_at(naive) == datetime.datetime(2026, 11, 27, 9, 30, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (
            _with_margin(history=[{"value": 1.0, "until": "soon", "why": "x"}]),
            "claims.yaml: claim 'c' threshold 'margin'.history[0] is not a date (YYYY-MM-DD): "
            "'soon'",
        ),
        (
            _with_margin(history=[5]),
            "claims.yaml: claim 'c' threshold 'margin'.history[0] needs ['until', 'value', 'why']"
            " (and may have ['commit', 'name', 'unit'])",
        ),
        (
            _with_margin(fixed={"commit": "f00d"}),
            "claims.yaml: claim 'c' threshold 'margin'.fixed needs exactly ['at', 'commit']",
        ),
        (
            _with_margin(fixed={"commit": "f00d", "at": "noon"}),
            "claims.yaml: claim 'c' threshold 'margin'.fixed.at is not a time "
            "(YYYY-MM-DDTHH:MM:SSZ): 'noon'",
        ),
    ],
)
def test_a_threshold_refused_names_where_in_claims_yaml(claim: dict, message: str) -> None:
    with refused(message):
        _parse(claim)


def test_an_out_of_scope_claim_with_an_unknown_key_is_refused_naming_it() -> None:
    excluded = {"id": "x", "title": "t", "work": "EST", "source": "s", "text": "t", "reason": "r"}
    with pytest.raises(LearnableSparsityError, match=re.escape("has unknown keys ['extra']")):
        _parse(CLAIM, out_of_scope=({**excluded, "extra": 1},))


def test_a_rule_keeps_its_fields_numbers_as_floats_and_names_where_it_is_refused() -> None:
    entry = {**RULE, "value": 3, "history": [{"value": 2, "until": "2026-11-20", "why": "y"}]}
    (rule,) = parse_rules(yaml.safe_dump({"rules": {"seeds": entry}})).values()
    assert type(rule.value) is float and rule.value == 3.0
    assert (rule.unit, rule.reason, rule.fixed.commit) == ("level", "conventional", "b2e1f63")
    assert type(rule.history[0].value) is float and rule.history[0].why == "y"
    (unitless,) = parse_rules(
        yaml.safe_dump({"rules": {"seeds": {k: v for k, v in RULE.items() if k != "unit"}}})
    ).values()
    assert unitless.unit == ""
    refusals = {
        "claims.yaml: rule 'level' needs fixed": {k: v for k, v in RULE.items() if k != "fixed"},
        "claims.yaml: rule 'level'.fixed needs exactly ['at', 'commit']": {
            **RULE,
            "fixed": {"commit": "x"},
        },
        "claims.yaml: rule 'level'.history[0] is not a date (YYYY-MM-DD): 'soon'": {
            **RULE,
            "history": [{"value": 1, "until": "soon", "why": "x"}],
        },
    }
    for message, bad in refusals.items():
        with refused(message):
            parse_rules(yaml.safe_dump({"rules": {"level": bad}}))
    with pytest.raises(LearnableSparsityError, match=re.escape("needs a mapping `rules`")):
        parse_rules(yaml.safe_dump({"rules": {}}))


def test_a_threshold_change_is_found_under_todays_name_first_and_for_every_threshold() -> None:
    earlier = {"value": 1.0, "until": "2026-11-26", "why": "x", "name": "old_margin"}
    (claim,), _ = _parse(_with_margin(history=[earlier]))
    kept_on = datetime.date(2026, 11, 25)
    # a record that has both names was judged with today's: unchanged
    assert threshold_changes((claim,), {"c": {"margin": 0.5, "old_margin": 1.0}}, kept_on) == []
    # new: neither name in the record; it is named as today, in no unit then
    (new,) = threshold_changes((claim,), {"c": {"other": 1.0}}, kept_on)
    assert (new.recorded, new.recorded_name, new.recorded_unit) == (None, "margin", "")
    # two thresholds, the first unchanged: the second's change is still found
    two = {
        **CLAIM,
        "check": "two_thresholds",
        "args": {},
        "thresholds": {
            "margin": CLAIM["thresholds"]["margin"],
            "min_tokens": {**CLAIM["thresholds"]["margin"], "value": 2.0, "history": []},
        },
    }

    def two_thresholds(results: Results, margin: float, min_tokens: float) -> None: ...

    ((claim,), _) = parse_claims(
        yaml.safe_dump({"claims": [two]}), {"two_thresholds": two_thresholds}
    )
    (moved,) = threshold_changes((claim,), {"c": {"margin": 0.5, "min_tokens": 3.0}}, kept_on)
    assert (moved.name, moved.recorded, moved.value) == ("min_tokens", 3.0, 2.0)


def test_the_rules_and_thresholds_fixed_or_replaced_since_a_record_was_kept() -> None:
    kept = datetime.datetime(2026, 11, 25, 12, tzinfo=datetime.UTC)
    rules = parse_rules(
        yaml.safe_dump(
            {
                "rules": {
                    "level": {
                        **RULE,
                        "fixed": {"commit": "0123456789abc", "at": "2026-11-26T08:05:00Z"},
                        "history": [{"value": 0.1, "until": "2026-11-26", "why": "x"}],
                    },
                    "test": {**RULE, "value": "paired", "unit": ""},
                    "window": {**RULE, "fixed": {"commit": "c", "at": "2026-11-25T12:00:00Z"}},
                }
            }
        )
    )
    assert rules_fixed_since(rules, kept) == [
        "level = 0.05 fixed 2026-11-26 08:05 (`0123456789`); was 0.1 until 2026-11-26"
    ]
    earlier = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
    assert (
        rules_fixed_since(rules, earlier)[1] == "test = paired fixed 2026-11-24 01:06 (`b2e1f63`)"
    )
    # a threshold replaced on the day the record was kept, fixed at no recorded time
    (claim,), _ = _parse(_with_margin(history=[{"value": 1.0, "until": "2026-11-25", "why": "x"}]))
    assert thresholds_fixed_since(claim, kept) == ["margin = 0.5 BLEU; was 1 BLEU until 2026-11-25"]
    assert thresholds_fixed_since(claim, datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)) == []
    # fixed after the record, with no history
    fixed = {"commit": "f00d", "at": "2026-11-25T12:00:01Z"}
    (claim,), _ = _parse(_with_margin(history=None, fixed=fixed))
    assert thresholds_fixed_since(claim, kept) == [
        "margin = 0.5 BLEU fixed 2026-11-25 12:00 (`f00d`)"
    ]
    (claim,), _ = _parse(_with_margin(history=None, fixed={**fixed, "at": "2026-11-25T12:00:00Z"}))
    assert thresholds_fixed_since(claim, kept) == []
