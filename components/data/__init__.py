"""Corpora for the NMT chain: the generated smoke corpus, local files, downloads, joint BPE.

* :mod:`components.data.generated` — a deterministic synthetic parallel corpus (smoke scale).
* :mod:`components.data.local` — the user's own plain-text parallel files, validated.
* :mod:`components.data.registry` — the registry of published corpora and ``fetch_corpus``, which
  downloads and extracts one.
* :mod:`components.data.fetch` — the HTTP fetcher: resumable, SHA-256-verified, cached downloads.
* :mod:`components.data.extractors` — corpus files (parquet, plain text, zip/tar, WIT3) to pairs.
* :mod:`components.data.bpe` — joint BPE (sentencepiece) training, encoding and decoding.
* :mod:`components.data.atomic` — atomic file writes (temporary file + rename).
"""
