"""The data of every experiment: parallel corpora for NMT, images and game features for the
latent-variable experiments.

* :mod:`learnable_sparsity.data.corpora` — the corpus settings (params ``corpora.<name>``) and loading.
* :mod:`learnable_sparsity.data.generated` — a deterministic synthetic parallel corpus (smoke scale).
* :mod:`learnable_sparsity.data.local` — plain-text parallel files: the user's, validated, and the
  prepared corpora the stages write and read.
* :mod:`learnable_sparsity.data.registry` — the registry of published corpora and ``fetch_corpus``, which
  downloads and extracts one.
* :mod:`learnable_sparsity.data.fetch` — the HTTP fetcher: resumable, SHA-256-verified, cached downloads.
* :mod:`learnable_sparsity.data.extractors` — corpus files (parquet, plain text, zip/tar, WIT3) to pairs
  or triplets.
* :mod:`learnable_sparsity.data.bpe` — joint BPE (sentencepiece) training, encoding and decoding.
* :mod:`learnable_sparsity.data.images` — image splits, the digits, binarisation and grey levels.
* :mod:`learnable_sparsity.data.idx_images` — MNIST / Fashion-MNIST: idx files, downloads, splits.
* :mod:`learnable_sparsity.data.signal_game` — signalling-game features (EGG files, digits stand-in).
* :mod:`learnable_sparsity.data.datasets` — the dataset settings (params ``images.<name>``), building and
  storing them.
"""
