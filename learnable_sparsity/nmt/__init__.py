"""Transformer encoder-decoder for NMT with pluggable (sparse) attention, training and search."""
