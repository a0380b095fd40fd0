"""DVC stage ``corpora``: every corpus named in params ``corpora`` → ``data/corpora/<name>/``.

A corpus entry has a ``source``:

* ``generated`` — the project's synthetic parallel corpus (``sizes``, ``seed``); offline.
* ``local`` — the user's files: ``files: {train: [src, tgt], valid: [...], test: [...]}``.
* ``download`` — a published corpus by registry ``name`` (see ``components.data.download``),
  fetched into ``cache`` with resume and checksums.

Each corpus directory holds ``{train,valid,test}.{src,tgt}`` and ``meta.json`` (source, sizes,
SHA-256 of every file).
"""

from __future__ import annotations

import logging
from pathlib import Path

from components.data.download import fetch_corpus
from components.data.generated import generate_splits
from components.data.local import SPLITS, load_local_corpus
from components.errors import LearnableSparsityError
from pipelines.io import Pairs, write_corpus, write_json
from pipelines.params import Params, load_params

OUT = Path("data/corpora")
log = logging.getLogger(__name__)


def load_source(name: str, spec: Params) -> dict[str, Pairs]:
    """The train/valid/test pairs of corpus ``name`` as its params entry describes."""
    source = spec.get("source", str)
    if source == "generated":
        sizes = spec.get("sizes", dict)
        for split in SPLITS:
            size = spec.get(f"sizes.{split}", int)
            if size < 1:
                raise LearnableSparsityError(f"{spec.source}: corpora.{name}.sizes.{split} < 1")
        return generate_splits({split: sizes[split] for split in SPLITS}, spec.get("seed", int))
    if source == "local":
        files = spec.get("files", dict)
        return load_local_corpus({split: tuple(paths) for split, paths in files.items()})
    if source == "download":
        return fetch_corpus(spec.get("name", str), Path(spec.get("cache", str)))
    raise LearnableSparsityError(
        f"{spec.source}: corpora.{name}.source must be generated, local or download; got {source!r}"
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params()
    corpora = params.section("corpora")
    for name in corpora.data:
        spec = corpora.section(name)
        splits = load_source(name, spec)
        meta = write_corpus(OUT / name, splits)
        write_json(OUT / name / "meta.json", {"source": dict(spec.data), **meta})
        log.info("corpus %s: %s", name, meta["sizes"])


if __name__ == "__main__":
    main()
