"""Corpora for the NMT chain: the generated smoke corpus, local files, downloads, joint BPE.

* :mod:`components.data.generated` — a deterministic synthetic parallel corpus (smoke scale).
* :mod:`components.data.local` — the user's own plain-text parallel files, validated.
* :mod:`components.data.download` — the registry of real corpora and a resumable, verified
  downloader.
* :mod:`components.data.bpe` — joint BPE (sentencepiece) training, encoding and decoding.
* :mod:`components.data.atomic` — atomic file writes (temporary file + rename).
"""
