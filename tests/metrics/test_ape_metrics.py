"""APE metrics (TER, tokenized BLEU) against the sacreBLEU command line on tokenized files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sacrebleu.metrics import TER

from learnable_sparsity.metrics.translation import ape_metrics, sentence_ter, ter, tokenized_bleu

# Tokenized, mixed-case post-editing output: case errors ("berlin", "The"), punctuation as its
# own token, an empty hypothesis and a block shift.
HYPS = [
    "the house is in berlin .",
    "We have , however , no Time .",
    "",
    "The results are shown in Table 2 .",
    "he said that : « it is OK » .",
]
REFS = [
    "The house is in Berlin .",
    "However , we have no time .",
    "Nothing was translated here .",
    "the results are shown in table 2 .",
    "he said : « it is OK » .",
]


def _sacrebleu_cli(tmp_path: Path, *flags: str) -> str:
    """The score that ``python -m sacrebleu REF -i HYP FLAGS -b -w 6`` prints."""
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    ref.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), *flags]
    done = subprocess.run([*command, "-b", "-w", "6"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_ter_equals_the_sacrebleu_command_line_case_sensitive(tmp_path: Path) -> None:
    score = ter(HYPS, REFS)
    assert f"{score.score:.6f}" == _sacrebleu_cli(tmp_path, "-m", "ter", "--ter-case-sensitive")
    assert "case:mixed" in score.signature and "norm:no" in score.signature
    assert "punct:yes" in score.signature
    assert score.details["ref_length"] == sum(len(r.split()) for r in REFS)


def test_tokenized_bleu_equals_the_sacrebleu_command_line(tmp_path: Path) -> None:
    score = tokenized_bleu(HYPS, REFS)
    assert f"{score.score:.6f}" == _sacrebleu_cli(tmp_path, "-m", "bleu", "--tokenize", "none")
    assert "tok:none" in score.signature and "case:mixed" in score.signature


def test_default_sacrebleu_ter_ignores_case_and_scores_lower() -> None:
    """Lowercasing both sides turns the case errors into matches: fewer edits, lower TER."""
    metric = TER()
    default = metric.corpus_score(HYPS, [REFS])
    assert "case:lc" in str(metric.get_signature())
    assert default.score < ter(HYPS, REFS).score
    assert default.num_edits < ter(HYPS, REFS).details["num_edits"]


def test_sentence_ter_by_hand_and_ape_metrics_dict() -> None:
    assert sentence_ter(["a b c d", "", "x"], ["a x c d", "a b", ""]) == [25.0, 100.0, 100.0]
    assert sentence_ter(["the Cat"], ["the cat"]) == [50.0]  # case-sensitive
    assert sentence_ter([""], [""]) == [0.0]
    metrics = ape_metrics(HYPS, REFS)
    assert set(metrics) == {"ter", "tokenized_bleu"}
    assert metrics["ter"]["score"] == pytest.approx(ter(HYPS, REFS).score)
    assert all("signature" in m and "details" in m for m in metrics.values())
