r"""Synthetic APE triplets (src, mt, pe) from a parallel corpus, eSCAPE-style (Negri et al. 2018).

src is a source sentence, mt its machine translation (beam search) and pe the corpus reference,
standing in for a human post-edit of mt. mt is only realistic — it has the errors an APE model
must learn to fix — when the MT model never saw src: translate held-out pairs, or cross-translate
with k-fold (:func:`kfold`: model j trains on every fold but j and translates fold j), and check
it with :func:`unseen_check` before translating (or leave a real corpus's repeated sentences out:
:func:`seen_sources`, :func:`repeated_sources`). :func:`filter_triplets` then drops broken
triplets and caps the share of mt = pe ("nothing to fix"); :func:`ter_summary` and
:func:`ter_histogram` describe how much there is to fix, as TER(mt, pe).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, NamedTuple

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    import numpy as np
    from matplotlib.figure import Figure

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.metrics.translation import sentence_ter, ter
from learnable_sparsity.settings import Settings, SettingsError, setting


class Triplet(NamedTuple):
    """One APE example: source sentence, its machine translation, the post-edit (reference)."""

    src: str
    mt: str
    pe: str


# --------------------------------------------------------------------------- unseen sources


def kfold(n: int, k: int, seed: int) -> list[list[int]]:
    """A random partition of range(n) into k folds, the same for the same (n, k, seed).

    The indices are shuffled with ``random.Random(seed)`` and dealt round-robin, so fold sizes
    are ⌈n/k⌉ or ⌊n/k⌋ (they differ by at most 1); each fold is sorted.
    """
    if k < 2:
        raise LearnableSparsityError(f"k-fold cross-translation needs k >= 2 folds, got k={k}")
    if k > n:
        raise LearnableSparsityError(f"cannot split {n} sentence pairs into k={k} non-empty folds")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return [sorted(order[fold::k]) for fold in range(k)]


# How many overlapping sentences the refusal of :func:`unseen_check` quotes.
SHOWN_EXAMPLES = 3


def seen_sources(sources: Sequence[str], training_sources: Iterable[str]) -> list[int]:
    """The positions of ``sources`` whose sentence (exact match after stripping) occurs in
    ``training_sources``; empty lines are never seen (they carry no text)."""
    seen = {sentence.strip() for sentence in training_sources}
    seen.discard("")
    return [i for i, sentence in enumerate(sources) if sentence.strip() in seen]


def repeated_sources(sources: Sequence[str]) -> list[int]:
    """The positions of ``sources`` whose sentence (stripped, not empty) occurs earlier."""
    earlier: set[str] = set()
    repeated = []
    for i, sentence in enumerate(sources):
        text = sentence.strip()
        if text and text in earlier:
            repeated.append(i)
        earlier.add(text)
    return repeated


def unseen_check(
    sources_to_translate: Sequence[str], training_sources: Iterable[str], *, what: str
) -> None:
    """Refuse to translate source sentences the MT model was trained on.

    Compares source sentences (exact match after stripping), not (source, reference) pairs:
    a model that saw a source sentence, with whatever reference, has learnt to translate it,
    so its output is not that of unseen text, which is the stricter check. Empty lines are
    ignored (they carry no text and :func:`filter_triplets` drops them). Raises
    :class:`LearnableSparsityError` naming ``what`` (e.g. "fold 2"), how many of the
    sentences to translate occur in the training sources, and up to ``SHOWN_EXAMPLES`` of them.
    """
    overlap = [
        sources_to_translate[i] for i in seen_sources(sources_to_translate, training_sources)
    ]
    if overlap:
        examples = list(dict.fromkeys(s.strip() for s in overlap))[:SHOWN_EXAMPLES]
        raise LearnableSparsityError(
            f"{what}: {len(overlap)} of {len(sources_to_translate)} source sentences to "
            f"translate occur in the MT model's training sources, e.g. {examples}; synthetic mt "
            "must be the translation of unseen text (translate held-out pairs or cross-translate "
            "k folds; synthetic_ape.seen: leave_out leaves a corpus's repeated sentences out)"
        )


# --------------------------------------------------------------------------- filtering


@dataclass(frozen=True, kw_only=True)
class FilterSettings(Settings):
    """Which synthetic triplets to keep (:func:`filter_triplets`).

    ``max_length_ratio``: drop a triplet whose mt, or whose src, is more than this many times
    longer or shorter than pe, in whitespace tokens. mt vs pe catches degenerate translations
    (truncated output, repetition loops); src vs pe catches misaligned corpus pairs, whose pe
    is no post-edit of mt. One threshold for both: a faithful translation's length in tokens
    stays close to its source's, far inside the factors that flag these failures.
    ``max_unchanged_share``: at most this share of the kept triplets may have mt = pe
    (nothing to fix); 1 keeps them all, 0 none.
    """

    max_length_ratio: float = setting(at_least=1)
    max_unchanged_share: float = setting(at_least=0, at_most=1)


# The reasons :func:`filter_triplets` drops a triplet, in the order they are tested (a triplet
# is counted under the first that applies).
DROP_REASONS: tuple[str, ...] = ("empty", "length_ratio_src_pe", "length_ratio_mt_pe", "unchanged")


def _ratio_exceeds(a: str, b: str, limit: float) -> bool:
    """Whether one of two non-empty texts has more than ``limit`` times the other's tokens."""
    longer, shorter = sorted((len(a.split()), len(b.split())), reverse=True)
    return longer > limit * shorter


def _max_unchanged(changed: int, share: float) -> int | None:
    """The largest u with u ≤ share · (changed + u), None when share = 1 (no limit).

    Exact in rationals, with the share as written (its shortest decimal, e.g. 0.3 = 3/10): a
    binary float comparison would let 3 of 10 fail a 0.3 cap.
    """
    if share >= 1:
        return None
    s = Fraction(repr(share))
    return int(s * changed / (1 - s))


def _drop_reason(triplet: Triplet, settings: FilterSettings) -> str | None:
    """The first reason of ``DROP_REASONS`` before "unchanged" that applies to ``triplet``."""
    if not all(side.strip() for side in triplet):
        return "empty"
    if _ratio_exceeds(triplet.src, triplet.pe, settings.max_length_ratio):
        return "length_ratio_src_pe"
    if _ratio_exceeds(triplet.mt, triplet.pe, settings.max_length_ratio):
        return "length_ratio_mt_pe"
    return None


def filter_triplets(
    triplets: Sequence[Triplet], settings: FilterSettings, seed: int
) -> tuple[list[Triplet], dict[str, int]]:
    """The triplets kept (in their original order) and how many were dropped per reason.

    Dropped, in this order (each triplet counted once, under the first reason that applies;
    the counts are keyed by ``DROP_REASONS``):

    * ``empty`` — src, mt or pe is empty after stripping;
    * ``length_ratio_src_pe`` / ``length_ratio_mt_pe`` — see :class:`FilterSettings`;
    * ``unchanged`` — of the C changed and U unchanged (mt and pe the same whitespace tokens,
      i.e. TER 0) triplets left, keep the U' = min(U, ⌊s·C / (1 − s)⌋) that make the unchanged
      share U' / (C + U') at most s = ``max_unchanged_share`` — the most that do — dropping a
      uniformly random U − U' of them, drawn with ``random.Random(seed)``.
    """
    dropped = dict.fromkeys(DROP_REASONS, 0)
    survivors: list[int] = []
    for index, triplet in enumerate(triplets):
        reason = _drop_reason(triplet, settings)
        if reason is None:
            survivors.append(index)
        else:
            dropped[reason] += 1
    unchanged = [i for i in survivors if triplets[i].mt.split() == triplets[i].pe.split()]
    limit = _max_unchanged(len(survivors) - len(unchanged), settings.max_unchanged_share)
    excess = 0 if limit is None else max(0, len(unchanged) - limit)
    removed = set(random.Random(seed).sample(unchanged, excess))
    dropped["unchanged"] = excess
    return [triplets[i] for i in survivors if i not in removed], dropped


# --------------------------------------------------------------------------- TER summary

# Histogram bins of sentence TER: [0, 5), [5, 10), …, [95, 100], then an overflow bin for
# TER > 100 (more edits than reference tokens: an mt much longer than pe).
TER_BIN_WIDTH = 5
TER_EDGES: tuple[int, ...] = tuple(range(0, 100 + TER_BIN_WIDTH, TER_BIN_WIDTH))
TER_QUANTILES: tuple[int, ...] = (10, 25, 75, 90)


def ter_summary(triplets: Sequence[Triplet]) -> dict[str, Any]:
    """How much there is to post-edit: TER(mt, pe), as plain JSON data.

    ``corpus_ter`` (100 · Σ edits / Σ pe tokens) and its ``signature``, as the APE shared tasks
    compute it (:func:`learnable_sparsity.metrics.translation.ter`); the distribution of sentence
    TER (the same configuration): ``mean``, ``median``, ``quantiles`` ({"10": q10, …}, linear
    interpolation), ``unchanged_share`` (share with TER 0) and ``triplets`` (how many); and
    ``histogram``: ``edges`` (``TER_EDGES``), ``counts`` per bin (the last bin closed:
    [95, 100]) and ``overflow`` (TER > 100); counts + overflow sum to ``triplets``.
    """
    mts = [t.mt for t in triplets]
    pes = [t.pe for t in triplets]
    corpus = ter(mts, pes)
    scores = np.asarray(sentence_ter(mts, pes))
    counts, _ = np.histogram(scores, bins=np.asarray(TER_EDGES, dtype=float))
    return {
        "corpus_ter": corpus.score,
        "signature": corpus.signature,
        "triplets": len(triplets),
        "mean": float(scores.mean()),
        "median": float(np.median(scores)),
        "quantiles": {str(q): float(np.percentile(scores, q)) for q in TER_QUANTILES},
        "unchanged_share": float(np.mean(scores == 0)),
        "histogram": {
            "edges": list(TER_EDGES),
            "counts": [int(c) for c in counts],
            "overflow": int(np.sum(scores > TER_EDGES[-1])),
        },
    }


def ter_histogram(summary: dict[str, Any], title: str) -> Figure:
    """The sentence-TER histogram of a :func:`ter_summary`: one bar per bin, the overflow bin
    (TER > 100) as a separate last bar labelled ">100", the corpus TER and the unchanged share
    in the title."""
    histogram = summary["histogram"]
    edges, counts = histogram["edges"], histogram["counts"]
    width = edges[1] - edges[0]
    fig = Figure(figsize=(6.0, 3.6), layout="constrained")
    ax = fig.subplots()
    ax.bar(edges[:-1], counts, width=width, align="edge", color="C0", edgecolor="white")
    overflow_at = edges[-1] + 2.5 * width  # a gap of two bins after [95, 100]
    ax.bar(overflow_at, histogram["overflow"], width=width, color="C3")
    ticks = [edge for edge in edges if edge % 20 == 0]
    ax.set_xticks([*ticks, overflow_at], [*map(str, ticks), f">{edges[-1]}"])
    ax.set_xlabel("sentence TER(mt, pe)")
    ax.set_ylabel("triplets")
    ax.set_title(
        f"{title}\ncorpus TER {summary['corpus_ter']:.1f}, "
        f"{100 * summary['unchanged_share']:.1f}% unchanged, {summary['triplets']} triplets",
        fontsize="medium",
    )
    return fig


# --------------------------------------------------------------------------- the stage's settings

# The splits of the low-resource "real" set: train, the dev set that Table 3.1 reports and
# model selection would use, and the test set of Table 3.2.
REAL_SPLITS = ("train", "valid", "test")


def cut_real_set(
    triplets: Sequence[Triplet], sizes: dict[str, int]
) -> tuple[dict[str, list[Triplet]], list[Triplet], int]:
    """The real set's splits (``sizes`` triplets each, in corpus order, in ``REAL_SPLITS``
    order), the triplets after the last one taken (the synthetic candidates), and how many
    triplets were passed over because their translation is empty.

    A model may emit nothing but end-of-sentence; such a triplet cannot enter the real set
    (its files hold a sentence on every line, and an APE system has nothing to edit), so the
    next translated one takes its place. The synthetic candidates keep theirs: the filters
    count them as ``empty``.
    """
    real: dict[str, list[Triplet]] = {split: [] for split in REAL_SPLITS}
    untranslated, position = 0, 0
    for split in REAL_SPLITS:
        while len(real[split]) < sizes[split]:
            if position == len(triplets):
                raise LearnableSparsityError(
                    f"synthetic_ape.real needs {sum(sizes.values())} triplets with a "
                    f"translation but only {position - untranslated} of the {len(triplets)} "
                    f"translated sentences have one ({untranslated} came out empty); "
                    "enlarge the split, shrink synthetic_ape.real or train the model longer"
                )
            if triplets[position].mt.strip():
                real[split].append(triplets[position])
            else:
                untranslated += 1
            position += 1
    return real, list(triplets[position:]), untranslated


@dataclass(frozen=True, kw_only=True)
class SyntheticApeSettings(Settings):
    """Params ``synthetic_ape``: eSCAPE-style triplets (src, MT(src), reference) from a parallel
    corpus and NMT models that never saw the translated sentences.

    ``mode: heldout`` translates ``split`` of ``corpus`` with the trained NMT cell
    ``<corpus>/<model>`` (trained on the corpus's ``train`` split); ``mode: kfold`` cuts
    ``split`` into ``folds`` folds, trains one NMT model (params ``nmt.model``/``nmt.train``,
    attention and seed of ``model``) on all folds but one and translates that one. The
    translated triplets, in corpus order, are cut into the ``real`` set (its splits' sizes,
    kept as translated but for sentences translated to nothing, which the next one replaces:
    :func:`cut_real_set`) and the ``synthetic`` training set (``synthetic`` triplets kept by
    the ``filters``). Sizes of 0 produce no set (the paper profile downloads its real data).
    ``seen``: what to do with sentences of ``split`` the MT model trained on (in ``heldout``
    mode: whose source occurs in the corpus's ``train``; in ``kfold`` mode: whose source occurs
    earlier in ``split``, so in another fold): ``refuse`` (the default: a configuration that
    translates training text fails before any work) or ``leave_out`` (a real corpus repeats
    sentences — the Bible's "No matarás." is a verse of Exodus and of Deuteronomy —: they are
    left out before translating, and counted).
    """

    corpus: str
    split: str = "heldout"
    mode: Literal["heldout", "kfold"] = "heldout"
    model: str = "softmax/seed0"  # <variant>/seed<k>
    folds: int = setting(5, at_least=2)
    chunk_sentences: int = setting(1000, at_least=1)  # sentences per Ray task
    real: dict[str, int] = setting(at_least=0)
    synthetic: int = setting(at_least=0)
    filters: FilterSettings
    seen: Literal["refuse", "leave_out"] = "refuse"

    def validate(self) -> None:
        if sorted(self.real) != sorted(REAL_SPLITS):
            raise SettingsError("real", f"must give the sizes of {list(REAL_SPLITS)}")
        variant, _, seed = self.model.partition("/seed")
        if not variant or not seed.isdigit():
            raise SettingsError("model", f"must read <variant>/seed<k>, got {self.model!r}")

    @property
    def needed(self) -> int:
        """Real triplets; the synthetic ones come from what is left after them."""
        return sum(self.real.values())
