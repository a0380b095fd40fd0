"""DVC stage ``bpe``: joint BPE per corpus (sentencepiece) → ``data/bpe/<name>/bpe.model``.

Trained on the source and target sides of the training split together, with ``bpe.vocab_size``
pieces (32000 in the paper profile), for every parallel corpus (not the APE triplet corpora:
the APE models read WordPieces). Word boundaries stay recoverable from the "▁" marks.
"""

from __future__ import annotations

import logging

from learnable_sparsity.data.bpe import BpeSettings, train_joint_bpe
from learnable_sparsity.data.corpora import corpus_fields, corpus_settings
from learnable_sparsity.data.local import PAIR_FIELDS, read_corpus
from pipelines.scaffold import layout
from pipelines.scaffold.stage import Stage, run_stage

log = logging.getLogger(__name__)


def main(stage: Stage) -> None:
    settings = stage.settings("bpe", BpeSettings)
    corpora = stage.params.entries("corpora", corpus_settings)
    for name in (name for name, corpus in corpora.items() if corpus_fields(corpus) == PAIR_FIELDS):
        train = read_corpus(layout.corpus_dir(name), ("train",))["train"]
        path = train_joint_bpe(train, layout.bpe_model(name).with_suffix(""), settings.vocab_size)
        log.info("BPE for %s: %s", name, path)


if __name__ == "__main__":
    run_stage("bpe", main)
