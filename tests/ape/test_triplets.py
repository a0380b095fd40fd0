"""Synthetic APE triplets: k folds, the unseen-source check, filtering and the TER summary."""

from __future__ import annotations

import io
import json

import pytest

from learnable_sparsity.ape.triplets import (
    DROP_REASONS,
    TER_EDGES,
    FilterSettings,
    Triplet,
    cut_real_set,
    filter_triplets,
    kfold,
    repeated_sources,
    seen_sources,
    ter_histogram,
    ter_summary,
    unseen_check,
)
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import SettingsError, build

KEEP_ALL = FilterSettings(max_length_ratio=3.0, max_unchanged_share=1.0)


@pytest.mark.parametrize(("n", "k"), [(10, 3), (7, 7), (100, 4), (5, 2)])
def test_kfold_partitions_into_balanced_sorted_folds(n: int, k: int) -> None:
    folds = kfold(n, k, seed=0)
    assert len(folds) == k
    assert sorted(i for fold in folds for i in fold) == list(range(n))
    assert max(map(len, folds)) - min(map(len, folds)) <= 1
    assert all(fold == sorted(fold) for fold in folds)


def test_kfold_is_deterministic_and_random() -> None:
    assert kfold(50, 3, seed=1) == kfold(50, 3, seed=1)
    assert kfold(50, 3, seed=1) != kfold(50, 3, seed=2)
    assert kfold(50, 3, seed=1)[0] != list(range(17))  # shuffled, not contiguous blocks


def test_kfold_refuses_too_few_or_too_many_folds() -> None:
    with pytest.raises(LearnableSparsityError, match="k >= 2"):
        kfold(10, 1, seed=0)
    with pytest.raises(LearnableSparsityError, match=r"cannot split 3 .* k=4"):
        kfold(3, 4, seed=0)


def test_unseen_check_refuses_seen_sources_naming_count_and_example() -> None:
    training = ["ein Haus .", "der Hund bellt .", "  die Katze schläft .  "]
    to_translate = ["ein Haus .", "neu hier .", "die Katze schläft .", "ein Haus ."]
    with pytest.raises(LearnableSparsityError) as refusal:
        unseen_check(to_translate, training, what="fold 2")
    message = str(refusal.value)
    assert message.startswith("fold 2: 3 of 4 source sentences")
    assert "'ein Haus .'" in message and "'die Katze schläft .'" in message


def test_unseen_check_quotes_at_most_three_examples() -> None:
    sentences = [f"satz {i}" for i in range(10)]
    with pytest.raises(LearnableSparsityError, match="10 of 10") as refusal:
        unseen_check(sentences, sentences, what="held-out")
    assert "satz 2" in str(refusal.value) and "satz 3" not in str(refusal.value)


def test_unseen_check_passes_on_disjoint_sources_and_ignores_empty_lines() -> None:
    unseen_check(["a b", "c d", ""], ["a b c", "", "d"], what="held-out")


def test_seen_and_repeated_sources_are_found_by_position() -> None:
    training = ["ein Haus .", "", "  die Katze schläft .  "]
    sources = ["ein Haus .", "neu hier .", " die Katze schläft .", "", "neu hier ."]
    assert seen_sources(sources, training) == [0, 2]  # stripped; empty lines never seen
    assert repeated_sources(sources) == [4]
    assert repeated_sources(["a", "", "", "a "]) == [3]


def test_filter_drops_empty_sides() -> None:
    triplets = [Triplet("a", "b", "c"), Triplet(" ", "b", "c"), Triplet("a", "", "c")]
    triplets.append(Triplet("a", "b", "\t"))
    kept, dropped = filter_triplets(triplets, KEEP_ALL, seed=0)
    assert kept == triplets[:1]
    assert dropped == {
        "empty": 3,
        "length_ratio_src_pe": 0,
        "length_ratio_mt_pe": 0,
        "unchanged": 0,
    }
    assert tuple(dropped) == DROP_REASONS


def test_the_real_set_passes_over_empty_translations_in_corpus_order() -> None:
    triplets = [Triplet(f"s{i}", "" if i in (1, 4) else f"m{i}", f"p{i}") for i in range(9)]
    real, candidates, untranslated = cut_real_set(triplets, {"train": 2, "valid": 1, "test": 2})
    assert [[t.src for t in rows] for rows in real.values()] == [["s0", "s2"], ["s3"], ["s5", "s6"]]
    assert list(real) == ["train", "valid", "test"]
    assert candidates == triplets[7:] and untranslated == 2


def test_the_real_set_refuses_too_few_translations() -> None:
    triplets = [Triplet("s", "", "p"), Triplet("s", "m", "p"), Triplet("s", " ", "p")]
    with pytest.raises(LearnableSparsityError, match=r"needs 2 triplets.*only 1 of the 3.*2 came"):
        cut_real_set(triplets, {"train": 1, "valid": 1, "test": 0})


def test_filter_drops_length_ratios_either_way_and_keeps_the_boundary() -> None:
    pe = "one two"
    triplets = [
        Triplet("a b", "x y z w", pe),  # mt/pe = 2: kept at max ratio 2
        Triplet("a b", "x y z w v", pe),  # mt/pe = 2.5
        Triplet("a b", "x", "1 2 3"),  # pe/mt = 3
        Triplet("a b c d e", "x y", pe),  # src/pe = 2.5 (and mt fine)
        Triplet("a", "x y", "1 2 3"),  # pe/src = 3
    ]
    settings = FilterSettings(max_length_ratio=2.0, max_unchanged_share=1.0)
    kept, dropped = filter_triplets(triplets, settings, seed=0)
    assert kept == triplets[:1]
    assert dropped["length_ratio_mt_pe"] == 2 and dropped["length_ratio_src_pe"] == 2


@pytest.mark.parametrize(("share", "unchanged_kept"), [(0.0, 0), (0.3, 3), (0.5, 7), (1.0, 12)])
def test_filter_caps_the_unchanged_share_exactly(share: float, unchanged_kept: int) -> None:
    changed = [Triplet(f"s{i}", f"m{i}", f"p{i}") for i in range(7)]
    same = [Triplet(f"t{i}", f"q{i} .", f"q{i}  . ") for i in range(12)]  # same tokens
    triplets = [t for pair in zip(same, changed, strict=False) for t in pair] + same[7:]
    settings = FilterSettings(max_length_ratio=3.0, max_unchanged_share=share)
    kept, dropped = filter_triplets(triplets, settings, seed=5)
    n_same = sum(t in same for t in kept)
    assert n_same == unchanged_kept and dropped["unchanged"] == 12 - unchanged_kept
    assert n_same <= share * len(kept)  # the cap holds …
    assert share == 1 or n_same + 1 > share * (len(kept) + 1)  # … and keeps as many as it can
    assert kept == [t for t in triplets if t in kept]  # original order
    assert all(t in kept for t in changed)
    again, _ = filter_triplets(triplets, settings, seed=5)
    other, _ = filter_triplets(triplets, settings, seed=6)
    assert again == kept
    if 0 < unchanged_kept < 12:  # which unchanged triplets go depends on the seed
        assert other != kept


def test_filter_settings_are_params_with_ranges() -> None:
    settings = build(FilterSettings, {"max_length_ratio": 3, "max_unchanged_share": 0.2}, "ape")
    assert settings.max_length_ratio == 3.0
    with pytest.raises(SettingsError) as share:
        build(FilterSettings, {"max_length_ratio": 3, "max_unchanged_share": 1.5}, "ape")
    assert str(share.value) == "ape.max_unchanged_share must be >= 0 and <= 1, got 1.5"
    with pytest.raises(SettingsError) as ratio:
        build(FilterSettings, {"max_length_ratio": 0.5, "max_unchanged_share": 0.2}, "ape")
    assert str(ratio.value) == "ape.max_length_ratio must be >= 1, got 0.5"


# mt vs pe: one substitution in 4 tokens (25), a case error in 2 (50), one token of 6 missing
# (one insertion, 100/6), unchanged (0), an mt of 6 tokens for a 2-token pe (4 deletions, 200).
TINY = [
    Triplet("s", "the cat sat down", "the dog sat down"),
    Triplet("s", "Hello world", "hello world"),
    Triplet("s", "a b c d e", "a b c d e f"),
    Triplet("s", "same words .", "same words ."),
    Triplet("s", "x y z x y z", "x y"),
]
TINY_TER = [25.0, 50.0, 100 / 6, 0.0, 200.0]


def test_ter_summary_matches_hand_computation() -> None:
    summary = ter_summary(TINY)
    edits, ref_tokens = 1 + 1 + 1 + 0 + 4, 4 + 2 + 6 + 3 + 2
    assert summary["corpus_ter"] == pytest.approx(100 * edits / ref_tokens)
    assert "case:mixed" in summary["signature"]
    assert summary["triplets"] == 5
    assert summary["mean"] == pytest.approx(sum(TINY_TER) / 5)
    assert summary["median"] == pytest.approx(25.0)
    assert summary["quantiles"]["25"] == pytest.approx(100 / 6)
    assert summary["quantiles"]["75"] == pytest.approx(50.0)
    assert summary["unchanged_share"] == pytest.approx(0.2)
    histogram = summary["histogram"]
    assert histogram["edges"] == list(TER_EDGES) and histogram["edges"][-1] == 100
    assert sum(histogram["counts"]) + histogram["overflow"] == 5
    assert histogram["overflow"] == 1
    assert [histogram["counts"][i] for i in (0, 3, 5, 10)] == [1, 1, 1, 1]  # 0, 16.7, 25, 50
    assert json.loads(json.dumps(summary)) == summary


def test_ter_histogram_bins_100_in_the_last_bin_and_renders() -> None:
    summary = ter_summary([*TINY, Triplet("s", "q r", "a b")])
    assert summary["histogram"]["counts"][-1] == 1  # TER 100 (2 substitutions of 2)
    figure = ter_histogram(summary, "smoke: synthetic triplets")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    assert buffer.getvalue().startswith(b"\x89PNG")
    assert ">100" in [label.get_text() for label in figure.axes[0].get_xticklabels()]
