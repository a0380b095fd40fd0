r"""A deterministic synthetic parallel corpus: the smoke-scale stand-in for a real NMT corpus.

Every pair is drawn from a small grammar with a ``random.Random(seed)`` of its own (no global
RNG), so the same seed gives the same corpus on every machine and Python version. Tokens are
separated by single spaces and punctuation is a token of its own.

**Source language** (English-like). About 270 stems: 116 nouns, 39 transitive and 25
intransitive verbs, 44 adjectives, 8 adverbs, 8 prepositions, determiners, 16 number words and
the interrogatives *who what which where when why how* (and *how many*). All morphology is
regular:

* nouns take plural ``-s``; 39 of the nouns also combine into **compounds** of 2 or 3 stems
  written as one word, head last (``riverboatcaptain``, ``firestations``), which a subword model
  has to split;
* verbs take ``-s`` (present, singular subject), ``-ed`` (past) and ``is/are … -ing``
  (progressive);
* the indefinite article is ``an`` before a vowel.

A noun phrase is ``(determiner | number) adjective* noun [relative clause]``. Numbers are words
(``one`` … ``twelve``, ``twenty`` … ``fifty``) or digits (``2`` … ``99``); ``one`` takes a
singular noun, every other number a plural one. A relative clause follows its noun, either with
a subject gap (``the dog that helped the farmers``: the verb agrees with the head noun) or with an
object gap (``the dog that the farmers helped``). A clause is

    subject verb-group [object] [preposition noun-phrase] [adverb] ``.``

with the verb agreeing in number with the subject (``who`` and ``what`` are singular).
Questions (30% of the sentences) end in ``?``: yes/no questions invert with *do/does/did* or
*is/are* (``did the dog help the farmers ?``); wh-questions ask for the subject (``who helped
the farmers ?``, ``which dogs …``, ``how many dogs …``, no inversion), the object (``what did
the dog help ?``), the place (``where …``) or the time, reason or manner (``when``/``why``/``how
…``), the wh-phrase fronted and the rest inverted. Relative clauses attach to (non-wh) subjects
and objects only, one level deep. Source sentences have 4 to 25 tokens.

**Target language** (invented, head-initial noun phrases, verb-final clauses). Every source stem
and function word has one target word (:data:`LEXICON`, a bijection; the auxiliaries, ``that``
and ``an`` have none): determiners, numbers, interrogatives and prepositions are fixed by hand
(``the → le``, ``a → un``, ``which → ke``, ``three → tir``, ``who → kiu``, ``in → ni`` …);
nouns (shape CVCV), verbs (CVCVC), adjectives (VCVC) and adverbs (VCVCVC) are spelled from
the SHA-256 digest of the English stem. The translation of a sentence is:

* **Clause order** ``[adverb] subject [noun-phrase postposition] [object] verb``: the verb moves to
  the end, the adverb to the front, and prepositions become postpositions.
* **Verb** = stem + tense (``-a`` present, ``-o`` past, ``-u`` progressive) + ``-n`` when the
  subject is plural. Auxiliaries (``do/does/did/is/are``) have no target word.
* **Noun phrase mirrored**: ``noun adjectives… (determiner | number) [relative clause]`` — the
  adjectives in reverse order. Plural nouns take ``-ri``; adjectives agree with their noun
  (``-e`` singular, ``-i`` plural). Number words are translated, digits copied unchanged.
* **Compounds** are translated part by part in reverse order (head first) and written as one
  word: ``riverboatcaptains`` → T(captain) T(boat) T(river) ``ri``.
* **Relative clause** after the noun phrase, verb-final: ``[other noun phrase] verb marker`` with
  marker ``ko`` (subject gap) or ``mu`` (object gap); its verb agrees with the head noun for a
  subject gap and with its own subject for an object gap.
* **Questions**: the final ``?`` becomes the particle ``ka`` and wh-words stay in place (the slot
  of what they ask for); declaratives end in ``.``.

Example (``yesterday → ugatez``, ``dog → kuma``, ``big → ineg``, ``garden → gusi``,
``farmer → mafu``, ``help → nufun``)::

    the big dog helped the farmers in the garden yesterday .
    ugatez kuma inege le gusi le ni mafuri le nufuno .

So a model has to move the verb past the whole object, agree it with a subject several tokens
back, mirror noun phrases, reorder compound parts inside a word and carry a question from the
first token (``did``, ``what``) to the last (``ka``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from learnable_sparsity.errors import LearnableSparsityError

# --------------------------------------------------------------------------- source vocabulary

# The source language is English-like: English question words (who … how) and "?" (ISO 639-1).
SOURCE_LANGUAGE = "en"

NOUNS: tuple[str, ...] = (
    "dog", "cat", "farmer", "teacher", "doctor", "sailor", "baker", "king", "queen", "bird",
    "horse", "boat", "captain", "house", "tree", "garden", "village", "forest", "mountain",
    "lake", "island", "road", "bridge", "tower", "castle", "market", "school", "letter", "book",
    "song", "friend", "brother", "sister", "mother", "father", "student", "soldier", "pilot",
    "driver", "singer", "dancer", "painter", "writer", "hunter", "monkey", "donkey", "rabbit",
    "tiger", "lion", "snake", "frog", "duck", "goat", "apple", "flower", "stone", "window",
    "door", "table", "chair", "cup", "bottle", "hat", "coat", "shoe", "ring", "key", "lamp",
    "candle", "clock", "picture", "map", "ship", "train", "car", "wagon", "wheel", "gate",
    "wall", "field", "hill", "cloud", "star", "moon", "storm", "fire", "station", "master",
    "sea", "night", "harbor", "river", "sun", "rain", "snow", "wind", "bell", "drum", "ball",
    "kite", "boot", "sword", "knight", "dragon", "wizard", "giant", "robot", "engine", "basket",
    "rope", "egg", "cake", "water", "mill", "shop", "garage",
)  # fmt: skip
# Nouns that also combine into compounds (2 or 3 distinct stems, head last).
COMPOUND_STEMS: tuple[str, ...] = (
    "river", "boat", "captain", "fire", "station", "master", "sea", "ship", "night", "storm",
    "tower", "bell", "sun", "rain", "snow", "wind", "stone", "bridge", "gate", "wall", "field",
    "hill", "cloud", "star", "moon", "harbor", "engine", "clock", "school", "market", "garden",
    "water", "horse", "door", "key", "book", "road", "mill", "shop",
)  # fmt: skip
TRANSITIVE_VERBS: tuple[str, ...] = (
    "help", "call", "visit", "follow", "paint", "pull", "kick", "lift", "hunt", "greet", "need",
    "want", "count", "clean", "cook", "guard", "thank", "warn", "mark", "pick", "pack", "check",
    "join", "fill", "collect", "protect", "remember", "answer", "order", "borrow", "enjoy",
    "obey", "destroy", "attack", "defend", "invent", "accept", "expect", "respect",
)  # fmt: skip
INTRANSITIVE_VERBS: tuple[str, ...] = (
    "walk", "talk", "jump", "laugh", "shout", "wait", "rest", "work", "play", "stay", "listen",
    "return", "climb", "float", "dream", "yawn", "cough", "sail", "wander", "appear", "bark",
    "howl", "crawl", "pray", "groan",
)  # fmt: skip
ADJECTIVES: tuple[str, ...] = (
    "big", "small", "old", "young", "red", "green", "tall", "short", "quick", "quiet", "dark",
    "bright", "warm", "cold", "soft", "loud", "brave", "clever", "happy", "sad", "angry", "calm",
    "proud", "rich", "poor", "strong", "weak", "heavy", "dirty", "empty", "new", "long", "round",
    "sharp", "sweet", "wild", "gentle", "lazy", "busy", "famous", "honest", "silent", "golden",
    "wooden",
)  # fmt: skip
ADVERBS: tuple[str, ...] = (
    "yesterday", "today", "again", "often", "quickly", "slowly", "together", "tonight",
)  # fmt: skip
PREPOSITIONS: tuple[str, ...] = ("in", "on", "near", "under", "behind", "with", "from", "to")
SINGULAR_DETERMINERS: tuple[str, ...] = ("the", "a", "this", "every", "my", "your")
PLURAL_DETERMINERS: tuple[str, ...] = ("the", "these", "some", "my", "your")
# "one" takes a singular noun, the others a plural one.
NUMBER_WORDS: tuple[str, ...] = (
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "twenty", "thirty", "forty", "fifty",
)  # fmt: skip
WH_PRONOUNS: tuple[str, ...] = ("who", "what")
WH_ADVERBS: tuple[str, ...] = ("when", "why", "how")
TENSES: tuple[str, ...] = ("present", "past", "progressive")

# --------------------------------------------------------------------------- target language

# Hand-made target words: determiners, numbers, interrogatives and postpositions.
FUNCTION_WORDS: dict[str, str] = {
    "the": "le", "a": "un", "this": "ki", "these": "kin", "every": "oro", "some": "sum",
    "my": "mi", "your": "tu", "which": "ke", "how many": "kemo",
    "one": "en", "two": "du", "three": "tir", "four": "kat", "five": "pen", "six": "sek",
    "seven": "sap", "eight": "ok", "nine": "nov", "ten": "dek", "eleven": "dekan",
    "twelve": "dedu", "twenty": "duk", "thirty": "tirk", "forty": "katk", "fifty": "penk",
    "who": "kiu", "what": "kea", "where": "kewo", "when": "keto", "why": "kesa", "how": "kedi",
    "in": "ni", "on": "pe", "near": "ma", "under": "sot", "behind": "ur", "with": "lo",
    "from": "ra", "to": "e",
}  # fmt: skip
QUESTION_PARTICLE = "ka"
RELATIVE_MARKERS: dict[str, str] = {"subject": "ko", "object": "mu"}
PLURAL_SUFFIX = "ri"
ADJECTIVE_SUFFIXES: dict[bool, str] = {False: "e", True: "i"}  # keyed by "noun is plural"
TENSE_SUFFIXES: dict[str, str] = {"present": "a", "past": "o", "progressive": "u"}
PLURAL_SUBJECT_SUFFIX = "n"

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def _spell(word: str, shape: str, attempt: int) -> str:
    """An invented spelling of ``word`` with ``shape`` (C = consonant, V = vowel)."""
    digest = hashlib.sha256(f"{word}#{attempt}".encode()).digest()
    pools = [_CONSONANTS if slot == "C" else _VOWELS for slot in shape]
    return "".join(pool[byte % len(pool)] for pool, byte in zip(pools, digest, strict=False))


def _build_lexicon() -> dict[str, str]:
    lexicon = dict(FUNCTION_WORDS)
    used = set(lexicon.values())
    open_classes = (
        (NOUNS, "CVCV"),
        (TRANSITIVE_VERBS + INTRANSITIVE_VERBS, "CVCVC"),
        (ADJECTIVES, "VCVC"),
        (ADVERBS, "VCVCVC"),
    )
    for words, shape in open_classes:
        for word in words:
            attempt = 0
            while (spelling := _spell(word, shape, attempt)) in used:
                attempt += 1
            lexicon[word] = spelling
            used.add(spelling)
    return lexicon


# Source stem (or function word) -> target word; a bijection.
LEXICON: dict[str, str] = _build_lexicon()

MIN_WORDS = 4
MAX_WORDS = 25

# Sampling probabilities of the grammar.
_P_QUESTION = 0.3
_P_WH = 0.7  # of the questions; the others are yes/no questions
_P_TRANSITIVE = 0.65
_P_PLURAL = 0.4
_P_NUMBER = 0.25  # of the noun phrases: a number instead of a determiner
_P_DIGITS = 0.4  # of the numbers
_P_COMPOUND = 0.12
_P_RELATIVE = 0.15
_P_PLACE = 0.3
_P_ADVERB = 0.3
_ADJECTIVE_COUNT_WEIGHTS = (55, 30, 15)  # 0, 1 or 2 adjectives

# --------------------------------------------------------------------------- sentence structure

Tense = Literal["present", "past", "progressive"]


@dataclass(frozen=True)
class WhPronoun:
    """``who`` or ``what`` as a subject or an object (grammatically singular)."""

    word: str


@dataclass(frozen=True)
class NounPhrase:
    """``(determiner | number) adjective* noun [relative]``.

    ``noun`` holds the stems of the noun, head last (several for a compound). ``number`` is a
    number word, a digit string or ``"how many"``; ``determiner`` may be ``"which"``. A phrase
    with ``"which"`` or ``"how many"`` is a wh-phrase.
    """

    noun: tuple[str, ...]
    plural: bool = False
    determiner: str | None = None
    number: str | None = None
    adjectives: tuple[str, ...] = ()
    relative: RelativeClause | None = None

    @property
    def is_wh(self) -> bool:
        """Whether this phrase asks a question (``which …`` or ``how many …``)."""
        return self.determiner == "which" or self.number == "how many"


@dataclass(frozen=True)
class RelativeClause:
    """``that …`` after a noun, with a transitive verb and a subject or object gap.

    ``other`` is the clause's own object (subject gap) or its own subject (object gap).
    """

    verb: str
    tense: Tense
    gap: Literal["subject", "object"]
    other: NounPhrase


@dataclass(frozen=True)
class PrepPhrase:
    """``preposition noun-phrase``."""

    preposition: str
    object: NounPhrase


Argument = NounPhrase | WhPronoun


@dataclass(frozen=True)
class Sentence:
    """One clause. ``place`` may be ``"where"`` and ``adverb`` one of ``when why how``.

    A question has at most one wh-element (a :class:`WhPronoun`, a wh-:class:`NounPhrase`,
    ``where`` or ``when``/``why``/``how``); a question without one is a yes/no question.
    """

    subject: Argument
    verb: str
    tense: Tense
    object: Argument | None = None
    place: PrepPhrase | Literal["where"] | None = None
    adverb: str | None = None
    question: bool = False

    def __post_init__(self) -> None:
        slots = self.wh_slots()
        if len(slots) > 1:
            raise LearnableSparsityError(f"sentence has several wh-elements ({slots}): {self}")
        if slots and not self.question:
            raise LearnableSparsityError(
                f"sentence has the wh-element {slots[0]!r} but question=False: {self}"
            )

    def wh_slots(self) -> list[str]:
        """The slots (subject, object, place, adverb) that hold a wh-element."""

        def is_wh(arg: Argument | None) -> bool:
            return isinstance(arg, WhPronoun) or (isinstance(arg, NounPhrase) and arg.is_wh)

        candidates = {
            "subject": is_wh(self.subject),
            "object": is_wh(self.object),
            "place": self.place == "where",
            "adverb": self.adverb in WH_ADVERBS,
        }
        return [slot for slot, wh in candidates.items() if wh]


# --------------------------------------------------------------------------- rendering


def _lookup(word: str) -> str:
    try:
        return LEXICON[word]
    except KeyError:
        raise LearnableSparsityError(f"word {word!r} is not in the generated lexicon") from None


def _is_plural(arg: Argument | None) -> bool:
    return isinstance(arg, NounPhrase) and arg.plural


def _relative_agreement(rel: RelativeClause, head_plural: bool) -> bool:
    """Whether the verb of ``rel`` agrees with a plural: the head noun's number for a subject
    gap, the clause's own subject's for an object gap."""
    return head_plural if rel.gap == "subject" else rel.other.plural


def _source_verb(verb: str, tense: str, plural: bool) -> list[str]:
    """The finite verb group in declarative order."""
    if tense == "present":
        return [verb if plural else verb + "s"]
    if tense == "past":
        return [verb + "ed"]
    return ["are" if plural else "is", verb + "ing"]


def _source_inverted_verb(verb: str, tense: str, plural: bool) -> tuple[str, str]:
    """(auxiliary, main verb) of a question with subject-auxiliary inversion."""
    if tense == "present":
        return ("do" if plural else "does"), verb
    if tense == "past":
        return "did", verb
    return ("are" if plural else "is"), verb + "ing"


def _source_np(np: NounPhrase) -> list[str]:
    rest = [*np.adjectives, "".join(np.noun) + ("s" if np.plural else "")]
    lead = np.number if np.number is not None else np.determiner
    if lead == "a" and rest[0][0] in "aeiou":
        lead = "an"
    words = [*(lead.split() if lead else ()), *rest]
    if np.relative is not None:
        rel = np.relative
        verb = _source_verb(rel.verb, rel.tense, _relative_agreement(rel, np.plural))
        other = _source_np(rel.other)
        words += ["that", *(verb + other if rel.gap == "subject" else other + verb)]
    return words


def _source_argument(arg: Argument | None) -> list[str]:
    if arg is None:
        return []
    return [arg.word] if isinstance(arg, WhPronoun) else _source_np(arg)


def source_text(sentence: Sentence) -> str:
    """The source-language sentence (tokens joined by single spaces)."""
    plural = _is_plural(sentence.subject)
    subject = _source_argument(sentence.subject)
    slots = {
        "object": _source_argument(sentence.object),
        "place": (
            [sentence.place]
            if sentence.place == "where"
            else [sentence.place.preposition, *_source_np(sentence.place.object)]
            if sentence.place is not None
            else []
        ),
        "adverb": [sentence.adverb] if sentence.adverb else [],
    }
    wh = sentence.wh_slots()
    if not sentence.question or wh == ["subject"]:
        words = [*subject, *_source_verb(sentence.verb, sentence.tense, plural)]
        fronted: list[str] = []
    else:
        auxiliary, main = _source_inverted_verb(sentence.verb, sentence.tense, plural)
        fronted = slots.pop(wh[0]) if wh else []
        words = [*fronted, auxiliary, *subject, main]
    words += [*slots.get("object", []), *slots.get("place", []), *slots.get("adverb", [])]
    words.append("?" if sentence.question else ".")
    return " ".join(words)


def _target_verb(verb: str, tense: str, plural: bool) -> str:
    return _lookup(verb) + TENSE_SUFFIXES[tense] + (PLURAL_SUBJECT_SUFFIX if plural else "")


def _target_np(np: NounPhrase) -> list[str]:
    noun = "".join(_lookup(part) for part in reversed(np.noun))
    words = [noun + (PLURAL_SUFFIX if np.plural else "")]
    words += [_lookup(adj) + ADJECTIVE_SUFFIXES[np.plural] for adj in reversed(np.adjectives)]
    lead = np.number if np.number is not None else np.determiner
    if lead is not None:
        words.append(lead if lead.isdigit() else _lookup(lead))
    if np.relative is not None:
        rel = np.relative
        verb = _target_verb(rel.verb, rel.tense, _relative_agreement(rel, np.plural))
        words += [*_target_np(rel.other), verb, RELATIVE_MARKERS[rel.gap]]
    return words


def _target_argument(arg: Argument | None) -> list[str]:
    if arg is None:
        return []
    return [_lookup(arg.word)] if isinstance(arg, WhPronoun) else _target_np(arg)


def target_text(sentence: Sentence) -> str:
    """The target-language translation of ``sentence`` (tokens joined by single spaces)."""
    words = [_lookup(sentence.adverb)] if sentence.adverb else []
    words += _target_argument(sentence.subject)
    if sentence.place == "where":
        words.append(_lookup("where"))
    elif sentence.place is not None:
        words += [*_target_np(sentence.place.object), _lookup(sentence.place.preposition)]
    words += _target_argument(sentence.object)
    words.append(_target_verb(sentence.verb, sentence.tense, _is_plural(sentence.subject)))
    words.append(QUESTION_PARTICLE if sentence.question else ".")
    return " ".join(words)


def render(sentence: Sentence) -> tuple[str, str]:
    """(source, target) text of ``sentence``."""
    return source_text(sentence), target_text(sentence)


# --------------------------------------------------------------------------- sampling


def _sample_noun(rng: random.Random) -> tuple[str, ...]:
    if rng.random() < _P_COMPOUND:
        return tuple(rng.sample(COMPOUND_STEMS, rng.choice((2, 2, 3))))
    return (rng.choice(NOUNS),)


def _sample_np(rng: random.Random, *, relative: bool, wh: bool = False) -> NounPhrase:
    noun = _sample_noun(rng)
    n_adjectives = rng.choices((0, 1, 2), weights=_ADJECTIVE_COUNT_WEIGHTS)[0]
    adjectives = tuple(rng.sample(ADJECTIVES, n_adjectives))
    determiner = number = None
    if wh:
        if rng.random() < 0.5:
            return NounPhrase(noun, True, number="how many", adjectives=adjectives)
        plural, determiner = rng.random() < _P_PLURAL, "which"
    else:
        plural = rng.random() < _P_PLURAL
        if rng.random() < _P_NUMBER:
            if not plural:
                number = "one"
            elif rng.random() < _P_DIGITS:
                number = str(rng.randint(2, 99))
            else:
                number = rng.choice(NUMBER_WORDS[1:])
        else:
            determiner = rng.choice(PLURAL_DETERMINERS if plural else SINGULAR_DETERMINERS)
    clause = None
    if relative and rng.random() < _P_RELATIVE:
        clause = RelativeClause(
            verb=rng.choice(TRANSITIVE_VERBS),
            tense=rng.choice(TENSES),
            gap=rng.choice(("subject", "object")),
            other=_sample_np(rng, relative=False),
        )
    return NounPhrase(noun, plural, determiner, number, adjectives, clause)


def _sample_argument(rng: random.Random, *, wh: bool) -> Argument:
    if not wh:
        return _sample_np(rng, relative=True)
    if rng.random() < 0.5:
        return WhPronoun(rng.choice(WH_PRONOUNS))
    return _sample_np(rng, relative=False, wh=True)


def _sample_sentence(rng: random.Random) -> Sentence:
    transitive = rng.random() < _P_TRANSITIVE
    verb = rng.choice(TRANSITIVE_VERBS if transitive else INTRANSITIVE_VERBS)
    tense = rng.choice(TENSES)
    question = rng.random() < _P_QUESTION
    wh_slot = None
    if question and rng.random() < _P_WH:
        wh_slot = rng.choice(("subject", "place", "adverb", *(("object",) if transitive else ())))
    subject = _sample_argument(rng, wh=wh_slot == "subject")
    obj = _sample_argument(rng, wh=wh_slot == "object") if transitive else None
    place: PrepPhrase | Literal["where"] | None = None
    if wh_slot == "place":
        place = "where"
    elif rng.random() < _P_PLACE:
        place = PrepPhrase(rng.choice(PREPOSITIONS), _sample_np(rng, relative=False))
    adverb = None
    if wh_slot == "adverb":
        adverb = rng.choice(WH_ADVERBS)
    elif rng.random() < _P_ADVERB:
        adverb = rng.choice(ADVERBS)
    return Sentence(subject, verb, tense, obj, place, adverb, question)


# --------------------------------------------------------------------------- corpora


def _check_count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise LearnableSparsityError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def generate_corpus(n_pairs: int, seed: int) -> list[tuple[str, str]]:
    """``n_pairs`` (source, target) pairs with pairwise distinct source sentences.

    Deterministic in ``seed``: the same seed gives the same list, and a longer corpus with the
    same seed starts with the shorter one.
    """
    _check_count("n_pairs", n_pairs)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise LearnableSparsityError(f"seed must be an integer, got {seed!r}")
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    while len(pairs) < n_pairs:
        source, target = render(_sample_sentence(rng))
        if source not in seen and MIN_WORDS <= source.count(" ") + 1 <= MAX_WORDS:
            seen.add(source)
            pairs.append((source, target))
    return pairs


def generate_splits(sizes: Mapping[str, int], seed: int) -> dict[str, list[tuple[str, str]]]:
    """Disjoint splits, e.g. ``sizes={"train": 20000, "valid": 500, "test": 500}``.

    One corpus of ``sum(sizes.values())`` pairs is generated with ``seed`` and cut into
    consecutive slices in the order of ``sizes``; no source sentence occurs twice in it, so no
    source sentence is shared between splits.
    """
    counts = {split: _check_count(f"sizes[{split!r}]", size) for split, size in sizes.items()}
    pairs = generate_corpus(sum(counts.values()), seed)
    splits: dict[str, list[tuple[str, str]]] = {}
    start = 0
    for split, count in counts.items():
        splits[split] = pairs[start : start + count]
        start += count
    return splits
