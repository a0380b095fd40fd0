"""The data of every experiment: parallel corpora for NMT, images and game features for the
latent-variable experiments.

* :mod:`components.data.corpora` — the corpus settings (params ``corpora.<name>``) and loading.
* :mod:`components.data.generated` — a deterministic synthetic parallel corpus (smoke scale).
* :mod:`components.data.local` — plain-text parallel files: the user's, validated, and the
  prepared corpora the stages write and read.
* :mod:`components.data.registry` — the registry of published corpora and ``fetch_corpus``, which
  downloads and extracts one.
* :mod:`components.data.fetch` — the HTTP fetcher: resumable, SHA-256-verified, cached downloads.
* :mod:`components.data.extractors` — corpus files (parquet, plain text, zip/tar, WIT3) to pairs
  or triplets.
* :mod:`components.data.bpe` — joint BPE (sentencepiece) training, encoding and decoding.
* :mod:`components.data.images` — image splits, the digits, binarisation and grey levels.
* :mod:`components.data.idx_images` — MNIST / Fashion-MNIST: idx files, downloads, splits.
* :mod:`components.data.signal_game` — signalling-game features (EGG files, digits stand-in).
* :mod:`components.data.datasets` — the dataset settings (params ``images.<name>``), building and
  storing them.
* :mod:`components.data.atomic` — atomic file writes (temporary file + rename).
"""
