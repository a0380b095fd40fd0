"""Corpus settings (params ``corpora.<name>``) and a prepared corpus on disk.

A corpus entry names its ``source``:

* ``generated`` — the project's synthetic parallel corpus (:mod:`learnable_sparsity.data.generated`):
  ``sizes`` per split and a ``seed``; offline.
* ``local`` — the user's files: ``files: {train: [src, tgt], valid: [...], test: [...]}``,
  validated by :mod:`learnable_sparsity.data.local`, and optionally ``source_lang`` (e.g. ``de``).
* ``download`` — a published corpus of the registry (:mod:`learnable_sparsity.data.registry`) by
  ``name``, fetched into ``cache`` with resume and checksums.
* ``sword`` — two Bible translations in the SWORD module format aligned verse by verse
  (:mod:`learnable_sparsity.data.sword`): installed Debian packages, or the same packages downloaded.

The prepared corpus is written by ``learnable_sparsity.data.local.write_corpus``, one file per split and
field (:func:`corpus_fields`: ``.src`` / ``.tgt``, or ``.src`` / ``.mt`` / ``.pe`` for a
downloaded APE corpus). :func:`source_language` names the language of a corpus's source side (the
head analysis reads the question words of that language).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from learnable_sparsity.data.generated import SOURCE_LANGUAGE, generate_splits
from learnable_sparsity.data.local import PAIR_FIELDS, SPLITS, Rows, load_local_corpus
from learnable_sparsity.data.registry import CORPORA, fetch_corpus
from learnable_sparsity.data.sword import (
    MODULES,
    aligned_verses,
    module_fingerprint,
    module_library,
    read_module,
    split_by_chapter,
)
from learnable_sparsity.settings import Settings, SettingsError, build_tagged, setting


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


@dataclass(frozen=True, kw_only=True)
class SwordCorpus(Settings):
    """Two translations of :data:`learnable_sparsity.data.sword.MODULES` aligned verse by verse,
    ``source_module`` → ``target_module``.

    ``library`` is a SWORD library holding both (null: the system's, ``/usr/share/sword``, when
    it holds them, else their Debian packages downloaded into ``cache``). Pairs with more than
    ``max_words`` whitespace words on either side are dropped (null: none are). ``sizes`` gives
    the verses of every split but train (``valid``, ``test``, and e.g. ``heldout``), each filled
    with whole chapters drawn with ``seed`` until it holds at least that many; train holds the
    other chapters.
    """

    source: Literal["sword"]
    source_module: str = "spaRV1909eb"
    target_module: str = "engWEB2015eb"
    library: str | None = None
    cache: str = "data/cache"
    sizes: dict[str, int] = setting(at_least=1)
    max_words: int | None = setting(None, at_least=1)
    seed: int = setting(0, at_least=0)

    def validate(self) -> None:
        for key in ("source_module", "target_module"):
            if getattr(self, key) not in MODULES:
                raise SettingsError(key, f"is {getattr(self, key)!r}; known: {sorted(MODULES)}")
        if self.source_module == self.target_module:
            raise SettingsError("target_module", "must differ from source_module")
        if "train" in self.sizes or not {"valid", "test"} <= set(self.sizes):
            raise SettingsError(
                "sizes",
                f"must name valid and test, not train (the rest); got {sorted(self.sizes)}",
            )

    @property
    def modules(self) -> list[str]:
        return [self.source_module, self.target_module]


CorpusSettings = GeneratedCorpus | LocalCorpus | DownloadedCorpus | SwordCorpus
SOURCES: dict[str, type[CorpusSettings]] = {
    "generated": GeneratedCorpus,
    "local": LocalCorpus,
    "download": DownloadedCorpus,
    "sword": SwordCorpus,
}


def _check_splits(key: str, per_split: Mapping[str, Any]) -> None:
    if sorted(per_split) != sorted(SPLITS):
        raise SettingsError(key, f"must name the splits {list(SPLITS)}, got {sorted(per_split)}")


def corpus_settings(data: Any, where: str) -> CorpusSettings:
    """The settings of one corpus entry, of the class its ``source`` names."""
    return build_tagged(SOURCES, data, where)


def source_language(settings: CorpusSettings) -> str | None:
    """The language of the corpus's source side (ISO 639-1, e.g. "de"): English for the
    generated corpus, the registry's for a downloaded one or a SWORD module, ``source_lang``
    for the user's files (None: not given)."""
    if isinstance(settings, GeneratedCorpus):
        return SOURCE_LANGUAGE
    if isinstance(settings, LocalCorpus):
        return settings.source_lang
    if isinstance(settings, SwordCorpus):
        return MODULES[settings.source_module].lang
    return CORPORA[settings.name].source_lang


def corpus_fields(settings: CorpusSettings) -> tuple[str, ...]:
    """The fields of the corpus's rows, named by their file extensions: (src, tgt) pairs, or
    the registry's fields for a downloaded corpus ((src, mt, pe) triplets for an APE corpus)."""
    if isinstance(settings, DownloadedCorpus):
        return CORPORA[settings.name].fields
    return PAIR_FIELDS


def load_corpus(settings: CorpusSettings) -> Mapping[str, Rows | Iterable[tuple[str, ...]]]:
    """The rows of every split of the corpus ``settings`` describe: (source, target) pairs, or
    the fields of :func:`corpus_fields` (an iterable to read once for a streamed download)."""
    if isinstance(settings, GeneratedCorpus):
        # The order of the splits decides which slice of the one generated corpus each gets.
        sizes = {split: settings.sizes[split] for split in settings.splits}
        return generate_splits(sizes, settings.seed)
    if isinstance(settings, LocalCorpus):
        return load_local_corpus({split: tuple(paths) for split, paths in settings.files.items()})
    if isinstance(settings, SwordCorpus):
        return load_bible(settings)
    return fetch_corpus(settings.name, Path(settings.cache))


def bible_library(settings: SwordCorpus) -> Path:
    """The SWORD library a ``sword`` corpus is read from (:func:`module_library`)."""
    configured = Path(settings.library) if settings.library is not None else None
    return module_library(settings.modules, configured, Path(settings.cache))


def bible_modules(settings: SwordCorpus) -> dict[str, dict[str, str]]:
    """The version and digest of each module a ``sword`` corpus is read from
    (:func:`module_fingerprint`), to be recorded beside the corpus: the library may lie outside
    the project, where DVC does not see it change."""
    library = bible_library(settings)
    return {name: module_fingerprint(library, name) for name in settings.modules}


def load_bible(settings: SwordCorpus) -> dict[str, list[tuple[str, str]]]:
    """The aligned verses of a ``sword`` corpus, filtered by length and split by chapter."""
    library = bible_library(settings)
    source, target = (read_module(library, name) for name in settings.modules)
    rows = aligned_verses(source, target)
    if settings.max_words is not None:
        limit = settings.max_words
        rows = [row for row in rows if max(len(row[1].split()), len(row[2].split())) <= limit]
    return split_by_chapter(rows, dict(settings.sizes), settings.seed)
