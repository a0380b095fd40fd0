"""Evaluation metrics: translation (BLEU, chrF, TER via sacreBLEU, with signatures)."""
