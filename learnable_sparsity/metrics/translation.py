"""Translation quality with sacreBLEU, always with the metric's signature.

* ``corpus_bleu`` — detokenized BLEU (sacreBLEU's default 13a tokenizer), the comparable number.
* ``tokenized_bleu`` — BLEU as the AST / EST papers reported it (multi-bleu style): sacreBLEU
  with ``tokenize="none"`` on whitespace-split tokens. Meaningful only on pre-tokenised text
  (the smoke corpus, KFTT's tokenized files): on raw text "word," and "word" are different tokens.
* ``corpus_chrf`` — character n-gram F-score (chrF2), an extra.
* ``ter`` / ``sentence_ter`` — TER as the WMT APE shared tasks score post-edits (see :func:`ter`);
  :func:`ape_metrics` gives it with tokenized BLEU, the two numbers APE papers report.
* :func:`empty_hypotheses` — how many hypotheses are empty (the decoder emitted eos at once);
  BLEU scores them as zero-length output, so they show up only as a lower brevity penalty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    from sacrebleu.metrics import BLEU, CHRF, TER

from learnable_sparsity.errors import LearnableSparsityError


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


def _ape_ter() -> TER:
    """The one TER configuration of the project (corpus and sentence level): case-sensitive,
    whitespace tokens, no normalisation, punctuation kept (see :func:`ter`)."""
    return TER(case_sensitive=True)


def ter(hypotheses: list[str], references: list[str]) -> Score:
    """Corpus TER = 100 · Σ edits / Σ reference tokens, edits = the fewest insertions,
    deletions, substitutions and block shifts turning a hypothesis into its reference
    (Snover et al. 2006); lower is better.

    As the WMT APE shared tasks compute it: tercom 7.25 with ``-s`` (case-sensitive) on
    tokenized text, no normalisation, the corpus total of its summary. sacreBLEU's *default*
    TER lowercases both sides (tercom's default without ``-s``), so a wrong capital stops
    counting as an edit and the score comes out lower than the APE tasks' number; hence
    ``case_sensitive=True`` here (signature ``case:mixed``). An empty hypothesis costs one
    deletion per reference token (TER 100 for that sentence).
    """
    _check(hypotheses, references)
    metric = _ape_ter()
    result = metric.corpus_score(hypotheses, [references])
    details = {"num_edits": float(result.num_edits), "ref_length": float(result.ref_length)}
    return Score("ter", float(result.score), str(metric.get_signature()), details)


def sentence_ter(hypotheses: list[str], references: list[str]) -> list[float]:
    """TER of each hypothesis against its reference, configured as :func:`ter` (100 · edits /
    reference tokens; an empty reference gives 0 against an empty hypothesis, else 100)."""
    _check(hypotheses, references)
    metric = _ape_ter()
    return [
        float(metric.sentence_score(hypothesis, [reference]).score)
        for hypothesis, reference in zip(hypotheses, references, strict=True)
    ]


def ape_metrics(hypotheses: list[str], references: list[str]) -> dict[str, dict[str, Any]]:
    """TER and tokenized BLEU (what multi-bleu.perl computes on tokenized text), the APE
    shared tasks' two scores, as JSON-ready dicts keyed by metric name."""
    scores = (ter, tokenized_bleu)
    return {s.name: s.to_dict() for s in (f(hypotheses, references) for f in scores)}


def translation_metrics(hypotheses: list[str], references: list[str]) -> dict[str, dict[str, Any]]:
    """BLEU, tokenized BLEU and chrF as JSON-ready dicts keyed by metric name."""
    scores = (corpus_bleu, tokenized_bleu, corpus_chrf)
    return {s.name: s.to_dict() for s in (f(hypotheses, references) for f in scores)}
