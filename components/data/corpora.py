"""Corpus settings (params ``corpora.<name>``) and a prepared corpus on disk.

A corpus entry names its ``source``:

* ``generated`` — the project's synthetic parallel corpus (:mod:`components.data.generated`):
  ``sizes`` per split and a ``seed``; offline.
* ``local`` — the user's files: ``files: {train: [src, tgt], valid: [...], test: [...]}``,
  validated by :mod:`components.data.local`, and optionally ``source_lang`` (e.g. ``de``).
* ``download`` — a published corpus of the registry (:mod:`components.data.registry`) by
  ``name``, fetched into ``cache`` with resume and checksums.

The prepared corpus is written by ``components.data.local.write_corpus``, one file per split and
field (:func:`corpus_fields`: ``.src`` / ``.tgt``, or ``.src`` / ``.mt`` / ``.pe`` for a
downloaded APE corpus). :func:`source_language` names the language of a corpus's source side (the
head analysis reads the question words of that language).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from components.data.generated import SOURCE_LANGUAGE, generate_splits
from components.data.local import PAIR_FIELDS, SPLITS, Rows, load_local_corpus
from components.data.registry import CORPORA, fetch_corpus
from components.settings import Settings, SettingsError, build_tagged, setting


@dataclass(frozen=True, kw_only=True)
class GeneratedCorpus(Settings):
    """The generated smoke corpus: ``sizes`` pairs per split from ``seed``.

    ``sizes`` names train, valid and test and may name more splits (e.g. ``heldout``, pairs no
    model trains on, for ``synthetic_ape``); those are cut after the three, in their order, so
    adding one leaves train, valid and test as they were.
    """

    source: Literal["generated"]
    sizes: dict[str, int] = setting(at_least=1)
    seed: int = setting(0, at_least=0)

    def validate(self) -> None:
        missing = [split for split in SPLITS if split not in self.sizes]
        if missing:
            raise SettingsError("sizes", f"must name the splits {list(SPLITS)}; missing {missing}")

    @property
    def splits(self) -> tuple[str, ...]:
        """train, valid, test, then the extra splits in the order of ``sizes``."""
        return (*SPLITS, *(split for split in self.sizes if split not in SPLITS))


@dataclass(frozen=True, kw_only=True)
class LocalCorpus(Settings):
    """The user's files: (source path, target path) per split; ``source_lang`` is the language
    of the source side (ISO 639-1, e.g. "de"), None when not given."""

    source: Literal["local"]
    files: dict[str, tuple[str, ...]]
    source_lang: str | None = None

    def validate(self) -> None:
        _check_splits("files", self.files)
        for split, paths in self.files.items():
            if len(paths) != 2:
                raise SettingsError(f"files.{split}", f"must be [source, target], got {paths}")


@dataclass(frozen=True, kw_only=True)
class DownloadedCorpus(Settings):
    """A published corpus of the registry, cached in ``cache``."""

    source: Literal["download"]
    name: str
    cache: str = "data/cache"

    def validate(self) -> None:
        if self.name not in CORPORA:
            raise SettingsError("name", f"is {self.name!r}; the registry has {sorted(CORPORA)}")


CorpusSettings = GeneratedCorpus | LocalCorpus | DownloadedCorpus
SOURCES: dict[str, type[CorpusSettings]] = {
    "generated": GeneratedCorpus,
    "local": LocalCorpus,
    "download": DownloadedCorpus,
}


def _check_splits(key: str, per_split: Mapping[str, Any]) -> None:
    if sorted(per_split) != sorted(SPLITS):
        raise SettingsError(key, f"must name the splits {list(SPLITS)}, got {sorted(per_split)}")


def corpus_settings(data: Any, where: str) -> CorpusSettings:
    """The settings of one corpus entry, of the class its ``source`` names."""
    return build_tagged(SOURCES, data, where)


def source_language(settings: CorpusSettings) -> str | None:
    """The language of the corpus's source side (ISO 639-1, e.g. "de"): English for the
    generated corpus, the registry's for a downloaded one, ``source_lang`` for the user's files
    (None: not given)."""
    if isinstance(settings, GeneratedCorpus):
        return SOURCE_LANGUAGE
    if isinstance(settings, LocalCorpus):
        return settings.source_lang
    return CORPORA[settings.name].source_lang


def corpus_fields(settings: CorpusSettings) -> tuple[str, ...]:
    """The fields of the corpus's rows, named by their file extensions: (src, tgt) pairs, or
    the registry's fields for a downloaded corpus ((src, mt, pe) triplets for an APE corpus)."""
    if isinstance(settings, DownloadedCorpus):
        return CORPORA[settings.name].fields
    return PAIR_FIELDS


def load_corpus(settings: CorpusSettings) -> Mapping[str, Rows]:
    """The rows of every split of the corpus ``settings`` describe: (source, target) pairs, or
    the fields of :func:`corpus_fields`."""
    if isinstance(settings, GeneratedCorpus):
        # The order of the splits decides which slice of the one generated corpus each gets.
        sizes = {split: settings.sizes[split] for split in settings.splits}
        return generate_splits(sizes, settings.seed)
    if isinstance(settings, LocalCorpus):
        return load_local_corpus({split: tuple(paths) for split, paths in settings.files.items()})
    return fetch_corpus(settings.name, Path(settings.cache))
