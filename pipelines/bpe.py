"""DVC stage ``bpe``: joint BPE per corpus (sentencepiece) → ``data/bpe/<name>/bpe.model``.

Trained on the source and target sides of the training split together, with ``bpe.vocab_size``
pieces (32000 in the paper profile). Word boundaries stay recoverable from the "▁" marks.
"""

from __future__ import annotations

import logging

from components.data.bpe import BpeSettings, train_joint_bpe
from components.data.local import read_corpus
from pipelines.scaffold import layout
from pipelines.scaffold.stage import Stage, run_stage

log = logging.getLogger(__name__)


def main(stage: Stage) -> None:
    settings = stage.settings("bpe", BpeSettings)
    for name in stage.params.get("corpora", dict):
        train = read_corpus(layout.corpus_dir(name), ("train",))["train"]
        path = train_joint_bpe(train, layout.bpe_model(name).with_suffix(""), settings.vocab_size)
        log.info("BPE for %s: %s", name, path)


if __name__ == "__main__":
    run_stage("bpe", main)
