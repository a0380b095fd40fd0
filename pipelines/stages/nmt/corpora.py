"""DVC stage ``corpora``: every corpus named in params ``corpora`` → ``data/corpora/<name>/``.

A corpus entry is generated (the smoke corpus), the user's local files (which must lie in
``data/external``, a DVC dependency of this stage), or a published corpus downloaded through the
registry (see ``learnable_sparsity.data.corpora``). Each corpus directory holds
``{train,valid,test}.{src,tgt}`` (an APE corpus of the registry: ``<split>.{src,mt,pe}`` for its
own splits) and ``meta.json`` (its settings, sizes and the SHA-256 of every file; for a SWORD
corpus also each module's version and digest, which the preflight compares with the library's:
a library outside the project is no DVC dependency).
"""

from __future__ import annotations

import dataclasses
import logging

from learnable_sparsity.data.corpora import (
    LocalCorpus,
    SwordCorpus,
    bible_modules,
    corpus_fields,
    corpus_settings,
    load_corpus,
)
from learnable_sparsity.data.local import write_corpus
from pipelines.scaffold import layout
from pipelines.scaffold.files import write_json
from pipelines.scaffold.stage import Stage, run_stage

log = logging.getLogger(__name__)


def main(stage: Stage) -> None:
    corpora = stage.params.entries("corpora", corpus_settings)
    for name, settings in corpora.items():
        if isinstance(settings, LocalCorpus):
            for split, paths in settings.files.items():
                for index, path in enumerate(paths):
                    stage.require_external(f"corpora.{name}.files.{split}[{index}]", path)
    for name, settings in corpora.items():
        meta = write_corpus(layout.corpus_dir(name), load_corpus(settings), corpus_fields(settings))
        if isinstance(settings, SwordCorpus):  # the preflight compares them with the library's
            meta["modules"] = bible_modules(settings)
        source = dataclasses.asdict(settings)
        write_json(layout.corpus_dir(name) / "meta.json", {"source": source, **meta})
        log.info("corpus %s: %s", name, meta["sizes"])


if __name__ == "__main__":
    run_stage("corpora", main)
