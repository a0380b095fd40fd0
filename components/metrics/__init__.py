"""Evaluation metrics: translation (BLEU, chrF via sacreBLEU, with signatures)."""
