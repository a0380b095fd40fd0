"""Translation quality with sacreBLEU, always with the metric's signature.

* ``corpus_bleu`` — detokenized BLEU (sacreBLEU's default 13a tokenizer), the comparable number.
* ``tokenized_bleu`` — BLEU as the AST / EST papers reported it (multi-bleu style): sacreBLEU
  with ``tokenize="none"`` on whitespace-split tokens. Meaningful only on pre-tokenised text
  (the smoke corpus, KFTT's tokenized files): on raw text "word," and "word" are different tokens.
* ``corpus_chrf`` — character n-gram F-score (chrF2), an extra.
* :func:`empty_hypotheses` — how many hypotheses are empty (the decoder emitted eos at once);
  BLEU scores them as zero-length output, so they show up only as a lower brevity penalty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from components.errors import LearnableSparsityError


@dataclass(frozen=True)
class Score:
    """One corpus-level score, its sacreBLEU signature and metric details."""

    name: str
    score: float
    signature: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The score as a JSON-ready dict (name, score, signature, details)."""
        return asdict(self)


def _check(hypotheses: list[str], references: list[str]) -> None:
    if len(hypotheses) != len(references):
        raise LearnableSparsityError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: they must align"
        )
    if not hypotheses:
        raise LearnableSparsityError("no hypotheses to score")


def _bleu(name: str, metric: BLEU, hypotheses: list[str], references: list[str]) -> Score:
    _check(hypotheses, references)
    result = metric.corpus_score(hypotheses, [references])
    details = {
        "precisions": list(result.precisions),
        "brevity_penalty": result.bp,
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
    }
    return Score(name, float(result.score), str(metric.get_signature()), details)


def corpus_bleu(hypotheses: list[str], references: list[str]) -> Score:
    """Detokenized corpus BLEU (13a tokenizer, case-sensitive)."""
    return _bleu("bleu", BLEU(), hypotheses, references)


def tokenized_bleu(hypotheses: list[str], references: list[str]) -> Score:
    """Corpus BLEU on pre-tokenized text (tokens = whitespace-separated), as the papers report;
    meaningless on raw text, where punctuation stays glued to the words."""
    return _bleu("tokenized_bleu", BLEU(tokenize="none", force=True), hypotheses, references)


def corpus_chrf(hypotheses: list[str], references: list[str]) -> Score:
    """Corpus chrF (character 6-grams, β = 2)."""
    _check(hypotheses, references)
    metric = CHRF()
    result = metric.corpus_score(hypotheses, [references])
    return Score("chrf", float(result.score), str(metric.get_signature()))


def empty_hypotheses(hypotheses: Sequence[str]) -> int:
    """The number of hypotheses with no token (empty or whitespace only)."""
    return sum(not hypothesis.strip() for hypothesis in hypotheses)


def translation_metrics(hypotheses: list[str], references: list[str]) -> dict[str, dict[str, Any]]:
    """BLEU, tokenized BLEU and chrF as JSON-ready dicts keyed by metric name."""
    scores = (corpus_bleu, tokenized_bleu, corpus_chrf)
    return {s.name: s.to_dict() for s in (f(hypotheses, references) for f in scores)}
