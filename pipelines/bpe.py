"""DVC stage ``bpe``: joint BPE per corpus (sentencepiece) → ``data/bpe/<name>/bpe.model``.

Trained on the source and target sides of the training split together, with ``bpe.vocab_size``
pieces (32000 in the paper profile). Word boundaries stay recoverable from the "▁" marks.
"""

from __future__ import annotations

import logging
from pathlib import Path

from components.data.bpe import train_joint_bpe
from pipelines.corpora import OUT as CORPORA
from pipelines.io import read_corpus
from pipelines.params import load_params

OUT = Path("data/bpe")
log = logging.getLogger(__name__)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params()
    vocab_size = params.get("bpe.vocab_size", int)
    for name in params.get("corpora", dict):
        train = read_corpus(CORPORA / name)["train"]
        path = train_joint_bpe(train, OUT / name / "bpe", vocab_size)
        log.info("BPE for %s: %s", name, path)


if __name__ == "__main__":
    main()
