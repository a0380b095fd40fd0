"""Tests for ``learnable_sparsity.data.generated``: determinism, splits, coverage and the translation."""

from __future__ import annotations

import re

import pytest

from learnable_sparsity.data.corpora import corpus_settings, load_corpus
from learnable_sparsity.data.generated import (
    ADJECTIVES,
    ADVERBS,
    COMPOUND_STEMS,
    FUNCTION_WORDS,
    INTRANSITIVE_VERBS,
    LEXICON,
    MAX_WORDS,
    MIN_WORDS,
    NOUNS,
    TRANSITIVE_VERBS,
    NounPhrase,
    PrepPhrase,
    RelativeClause,
    Sentence,
    WhPronoun,
    generate_corpus,
    generate_splits,
    render,
)
from learnable_sparsity.errors import LearnableSparsityError

N = 2000


@pytest.fixture(scope="module")
def corpus() -> list[tuple[str, str]]:
    return generate_corpus(N, seed=0)


def test_same_seed_gives_the_same_corpus(corpus: list[tuple[str, str]]) -> None:
    assert generate_corpus(N, seed=0) == corpus
    assert generate_corpus(N // 2, seed=0) == corpus[: N // 2]


def test_different_seeds_give_different_corpora(corpus: list[tuple[str, str]]) -> None:
    other = generate_corpus(N, seed=1)
    assert len(set(other) & set(corpus)) < N // 10


def test_splits_are_disjoint_and_have_the_requested_sizes() -> None:
    splits = generate_splits({"train": 1500, "valid": 200, "test": 300}, seed=3)
    assert {name: len(pairs) for name, pairs in splits.items()} == {
        "train": 1500,
        "valid": 200,
        "test": 300,
    }
    sources = [{source for source, _ in pairs} for pairs in splits.values()]
    assert sum(map(len, sources)) == 2000  # no source sentence repeats, within or across splits
    assert generate_splits({"train": 1500, "valid": 200, "test": 300}, seed=3) == splits


@pytest.mark.parametrize(
    ("sizes", "seed", "named"),
    [
        ({"train": -1}, 0, "sizes['train']"),
        ({"valid": 2.5}, 0, "sizes['valid']"),
        ({"train": 10}, "0", "seed"),
    ],
)
def test_bad_split_arguments_are_named(sizes: dict, seed: object, named: str) -> None:
    with pytest.raises(LearnableSparsityError, match=re.escape(named)):
        generate_splits(sizes, seed)  # type: ignore[arg-type]


def test_lengths_and_punctuation(corpus: list[tuple[str, str]]) -> None:
    for source, target in corpus:
        words = source.split(" ")
        assert MIN_WORDS <= len(words) <= MAX_WORDS
        assert "" not in words and "" not in target.split(" ")
        question = words[-1] == "?"
        assert words[-1] in "?."
        assert target.split()[-1] == ("ka" if question else ".")
        assert "?" not in target


def test_corpus_covers_every_construction(corpus: list[tuple[str, str]]) -> None:
    sources = [source.split() for source, _ in corpus]
    words = {word for sentence in sources for word in sentence}
    questions = [s for s in sources if s[-1] == "?"]
    assert 0.2 < len(questions) / N < 0.4
    assert {"who", "what", "which", "where", "when", "why", "how", "many"} <= words
    assert {"did", "does", "do", "is", "are"} <= words
    assert any(s[0] in {"did", "does", "do", "is", "are"} for s in questions)  # yes/no questions
    assert sum("that" in s for s in sources) > N // 20  # relative clauses
    assert any(word.isdigit() for word in words)
    assert {"one", "three", "twenty"} & words
    assert any(word.endswith("ed") for word in words) and any(w.endswith("ing") for w in words)
    compound = re.compile(f"(?:{'|'.join(COMPOUND_STEMS)}){{2,3}}s?")
    compounds = {w for w in words if compound.fullmatch(w) and w.removesuffix("s") not in NOUNS}
    assert len(compounds) > 50
    assert max(len(w) for w in compounds) >= 15


def test_lexicon_is_a_bijection_over_all_stems() -> None:
    stems = [
        *NOUNS,
        *TRANSITIVE_VERBS,
        *INTRANSITIVE_VERBS,
        *ADJECTIVES,
        *ADVERBS,
        *FUNCTION_WORDS,
    ]
    assert len(stems) == len(set(stems)) == len(LEXICON)
    assert len(set(LEXICON.values())) == len(LEXICON)
    assert set(COMPOUND_STEMS) <= set(NOUNS)


def _np(*noun: str, **kwargs: object) -> NounPhrase:
    return NounPhrase(tuple(noun), **kwargs)  # type: ignore[arg-type]


# Lexicon used below: dog kuma, farmer mafu, cat fufa, king peko, horse fige, teacher duze,
# garden gusi, river goba, boat dozu, captain fuve; help nufun, follow zatif, walk zifaz,
# sail repap, paint radet, play fogif, count dopog, greet sepus; big ineg, old udef, red idun,
# tall atib, quiet uduk; yesterday ugatez, today ofulir, tonight eneter.
HAND_TRANSLATED = [
    (  # SOV, adverb first, mirrored NPs, postposition, adjective agreement, past tense
        Sentence(
            _np("dog", determiner="the", adjectives=("big",)),
            "help",
            "past",
            _np("farmer", plural=True, determiner="the"),
            PrepPhrase("in", _np("garden", determiner="the")),
            "yesterday",
        ),
        "the big dog helped the farmers in the garden yesterday .",
        "ugatez kuma inege le gusi le ni mafuri le nufuno .",
    ),
    (  # subject-gap relative clause: its verb agrees with the plural head
        Sentence(
            _np(
                "farmer",
                plural=True,
                determiner="the",
                relative=RelativeClause(
                    "follow", "present", "subject", _np("cat", determiner="a", adjectives=("old",))
                ),
            ),
            "walk",
            "past",
        ),
        "the farmers that follow an old cat walked .",
        "mafuri le fufa udefe un zatifan ko zifazon .",
    ),
    (  # object-gap relative clause: its verb agrees with its own (plural) subject
        Sentence(
            _np(
                "dog",
                determiner="the",
                relative=RelativeClause(
                    "help", "past", "object", _np("farmer", plural=True, determiner="the")
                ),
            ),
            "sail",
            "progressive",
            adverb="tonight",
        ),
        "the dog that the farmers helped is sailing tonight .",
        "eneter kuma le mafuri le nufunon mu repapu .",
    ),
    (  # object wh-question: do-support in the source, wh in situ and "ka" in the target
        Sentence(_np("dog", determiner="the"), "paint", "past", WhPronoun("what"), question=True),
        "what did the dog paint ?",
        "kuma le kea radeto ka",
    ),
    (  # yes/no question; a 3-part compound translated part by part in reverse order
        Sentence(
            _np("river", "boat", "captain", plural=True, number="three"),
            "sail",
            "progressive",
            question=True,
        ),
        "are three riverboatcaptains sailing ?",
        "fuvedozugobari tir repapun ka",
    ),
    (  # "where": digits copied, the wh-word in the place slot
        Sentence(
            _np("dog", plural=True, number="15"), "play", "present", place="where", question=True
        ),
        "where do 15 dogs play ?",
        "kumari 15 kewo fogifan ka",
    ),
    (  # subject "which": no inversion, plural agreement on adjective and verb
        Sentence(
            _np("dog", plural=True, determiner="which", adjectives=("red",)),
            "help",
            "present",
            _np("cat", determiner="my"),
            question=True,
        ),
        "which red dogs help my cat ?",
        "kumari iduni ke fufa mi nufunan ka",
    ),
    (  # "how many" object fronted over the subject; the adverb stays last in the source
        Sentence(
            _np("king", determiner="the"),
            "count",
            "past",
            _np("horse", plural=True, number="how many", adjectives=("tall",)),
            adverb="today",
            question=True,
        ),
        "how many tall horses did the king count today ?",
        "ofulir peko le figeri atibi kemo dopogo ka",
    ),
    (  # two adjectives mirrored; "a" becomes "an" before a vowel; present singular -s
        Sentence(
            _np("teacher", determiner="a", adjectives=("old", "quiet")),
            "greet",
            "present",
            _np("king", plural=True, determiner="the"),
        ),
        "an old quiet teacher greets the kings .",
        "duze uduke udefe un pekori le sepusa .",
    ),
]


@pytest.mark.parametrize(("sentence", "source", "target"), HAND_TRANSLATED)
def test_hand_translated_examples(sentence: Sentence, source: str, target: str) -> None:
    assert render(sentence) == (source, target)


def test_wh_elements_need_a_question_and_only_one() -> None:
    with pytest.raises(LearnableSparsityError, match="question=False"):
        Sentence(WhPronoun("who"), "walk", "past")
    with pytest.raises(LearnableSparsityError, match="several wh-elements"):
        Sentence(WhPronoun("who"), "walk", "past", place="where", question=True)


def test_unknown_word_is_named() -> None:
    with pytest.raises(LearnableSparsityError, match="'unicorn'"):
        render(Sentence(_np("unicorn", determiner="the"), "walk", "past"))


def test_an_extra_split_is_cut_after_train_valid_and_test_which_stay_as_they_were() -> None:
    base = {"source": "generated", "sizes": {"train": 30, "valid": 5, "test": 5}, "seed": 3}
    with_heldout = {**base, "sizes": {**base["sizes"], "heldout": 12}}
    plain = load_corpus(corpus_settings(base, "corpora.smoke"))
    extended = load_corpus(corpus_settings(with_heldout, "corpora.smoke"))
    assert {split: extended[split] for split in plain} == dict(plain)
    assert len(extended["heldout"]) == 12
    sources = {source for rows in plain.values() for source, _ in rows}
    assert not sources & {source for source, _ in extended["heldout"]}


def test_a_generated_corpus_needs_train_valid_and_test() -> None:
    data = {"source": "generated", "sizes": {"train": 30, "heldout": 5}, "seed": 0}
    with pytest.raises(
        LearnableSparsityError, match=r"corpora.smoke.sizes .*missing \['valid', 'test'\]"
    ):
        corpus_settings(data, "corpora.smoke")
