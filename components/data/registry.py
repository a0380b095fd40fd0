"""The registry of published corpora and :func:`fetch_corpus`, which downloads and extracts one.

:data:`CORPORA` names every corpus of the reproduced papers, with its language pair, the files to
fetch, how the train/valid/test pairs are extracted from them and the published split sizes
(train / valid / test pairs):

* ``iwslt17_de_en`` (de→en): IWSLT 2017 TED talks, the WIT3 zip kept by Hugging Face
  (``IWSLT/iwslt2017``); train ``train.tags``, valid dev2010, test tst2010–tst2015 (the Hugging
  Face splits); 206,112 / 888 / 8,079.
* ``kftt_ja_en`` (ja→en): Kyoto Free Translation Task 1.0 tarball (phontron.com), tokenized
  files; train the cleaned ``kyoto-train.cln`` (≤ 40 words), valid dev, test test;
  329,882 / 1,166 / 1,160.
* ``wmt16_ro_en`` (ro→en): WMT 2016, Hugging Face ``wmt/wmt16`` parquet; valid newsdev2016, test
  newstest2016; 610,320 / 1,999 / 1,999.
* ``wmt14_en_de`` (en→de): WMT 2014, Hugging Face ``wmt/wmt14`` parquet (3 train shards); valid
  newstest2013, test newstest2014; 4,508,785 / 3,000 / 3,003.
* ``iwslt14_de_en`` (de→en): IWSLT 2014 TED talks, fairseq's WIT3 tarball, fairseq's split
  (``prepare-iwslt14.sh``): every 23rd training pair is valid, test dev2010 + TEDX dev2012 +
  tst2010–tst2012; – / – / 6,750.
* ``iwslt15_en_vi`` (en→vi): IWSLT 2015 as prepared by Stanford NLP (tokenized files); valid
  tst2012, test tst2013; 133,317 / 1,553 / 1,268.

Two automatic post-editing (APE) corpora hold (source, MT output, post-edit) triplets
(``fields`` src, mt, pe) of English→German IT-domain text translated by a phrase-based SMT
system, already tokenized (Correia & Martins 2019 train and test on them):

* ``wmt_ape_pbsmt_en_de``: the WMT APE shared task data, LINDAT/CLARIN items: WMT16 (handle
  11372/LRT-1632: ``TrainDev.zip``, ``Test.zip``, ``test_pe.zip``), WMT17 training set (handle
  11234/1-1966, as the WMT17 task page links it) and test set (11372/LRT-2133), WMT18 PBSMT test
  set. Splits: ``train`` = WMT16 + WMT17 training triplets (12,000 + 11,000), ``valid`` = the
  WMT16 dev set (1,000; WMT17 and WMT18 reuse it), ``test2016`` / ``test2017`` / ``test2018``
  (2,000 each).
* ``escape_pbsmt_en_de``: the artificial eSCAPE corpus (Negri et al. 2018), PBSMT part,
  ``train`` only: about 7.2 million triplets (the paper's figure; the exact count is not known
  here, so none is expected).

**Unverified.** These entries were written without network access: only the WMT16 archive
names come from a published description (Neural Monkey's APE tutorial); the file names of the
WMT17 and WMT18 items, the WMT18 handle, the eSCAPE URL and the member names inside every
archive (``train.src`` …, matched in any folder) are best guesses. LINDAT may also answer a
licence page instead of the file. A wrong guess fails loudly (an HTTP error naming the URL, an
archive that is not one, or a member named as missing); the fix is a data change in this entry,
or the right archive copied to ``<cache>/<corpus>/<file name>``, which is used without a request.

Text is kept as published (see :mod:`components.data.extractors`), so ``iwslt14_de_en`` differs
from fairseq's Moses-tokenized, lowercased, length-cleaned version in its train/valid sizes
(fairseq: 160,239 / 7,283); its test set has the same 6,750 segments.

:func:`fetch_corpus` downloads every file of a corpus into ``<cache_dir>/<name>/`` with
:func:`components.data.fetch.download` (cache reuse, resume, SHA-256 checks; an unreachable host
raises a :class:`~components.errors.LearnableSparsityError` pointing to the ``local`` corpus
source), extracts the splits, logs a warning for a split size that differs from the published
one and then drops rows with an empty field (counted in the log). No entry pins a digest yet (they
could not be computed offline; the Hugging Face ``main`` revisions can also move): the first
download of each file records its digest and later uses are verified against the record.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from components.data.extractors import (
    AlignedMembers,
    Extractor,
    Member,
    ParquetTranslations,
    TextFiles,
    Wit3Archive,
)
from components.data.fetch import DEFAULT_TIMEOUT, download
from components.data.local import PAIR_FIELDS, SPLITS, TRIPLET_FIELDS, Rows
from components.errors import LearnableSparsityError

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteFile:
    """One file of a corpus: its name in the cache, its URL and, if pinned, its SHA-256."""

    name: str
    url: str
    sha256: str | None = None


@dataclass(frozen=True)
class CorpusSpec:
    """A downloadable corpus translated from ``source_lang`` into ``target_lang``.

    Its rows have one string per element of ``fields`` (the file extensions of a prepared
    split): (source, target) pairs by default, (src, mt, pe) triplets for an APE corpus.
    ``splits`` are the splits its extractor yields (an APE corpus has a test set per year).
    ``expected_sizes`` holds the published number of rows per split (None where unknown).
    """

    name: str
    source_lang: str
    target_lang: str
    files: tuple[RemoteFile, ...]
    extractor: Extractor
    expected_sizes: Mapping[str, int | None] = field(default_factory=dict)
    description: str = ""
    fields: tuple[str, ...] = PAIR_FIELDS
    splits: tuple[str, ...] = SPLITS


_HF = "https://huggingface.co/datasets"
_STANFORD_IWSLT15 = "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi"
_LINDAT = "https://lindat.mff.cuni.cz/repository/xmlui/bitstream/handle"
_ESCAPE = "http://hltshare.fbk.eu/QT21/eSCAPE"


def _hf_parquet(
    repo: str, config: str, shards: Mapping[str, int]
) -> tuple[tuple[RemoteFile, ...], ParquetTranslations]:
    """Files and extractor of a Hugging Face parquet conversion.

    Its files are ``<config>/<split>-NNNNN-of-MMMMM.parquet``, ``shards`` giving MMMMM per split.
    """
    hf_split = {"train": "train", "valid": "validation", "test": "test"}
    names = {
        split: tuple(f"{hf_split[split]}-{i:05d}-of-{count:05d}.parquet" for i in range(count))
        for split, count in shards.items()
    }
    files = tuple(
        RemoteFile(name, f"{_HF}/{repo}/resolve/main/{config}/{name}")
        for split_names in names.values()
        for name in split_names
    )
    return files, ParquetTranslations(names)


def _triplet(archive: str, stem: str) -> tuple[Member, ...]:
    """The members ``<stem>.src`` / ``.mt`` / ``.pe`` of ``archive`` (the APE releases name
    their files after the fields)."""
    return tuple(Member(archive, f"{stem}.{extension}") for extension in TRIPLET_FIELDS)


def _wmt_ape_pbsmt() -> CorpusSpec:
    """The WMT 2016-2018 APE en-de PBSMT data (layout unverified, see the module docstring)."""
    files = (
        RemoteFile("wmt16_TrainDev.zip", f"{_LINDAT}/11372/LRT-1632/TrainDev.zip"),
        RemoteFile("wmt16_Test.zip", f"{_LINDAT}/11372/LRT-1632/Test.zip"),
        RemoteFile("wmt16_test_pe.zip", f"{_LINDAT}/11372/LRT-1632/test_pe.zip"),
        RemoteFile("wmt17_train.tar.gz", f"{_LINDAT}/11234/1-1966/train.tar.gz"),
        RemoteFile("wmt17_test.tar.gz", f"{_LINDAT}/11372/LRT-2133/test.tar.gz"),
        # The WMT18 handle is a guess (the WMT18 task page was not at hand).
        RemoteFile("wmt18_test_pbsmt.tar.gz", f"{_LINDAT}/11372/LRT-2590/test_pbsmt.tar.gz"),
    )
    test2016 = (  # the 2016 test post-edits come in a zip of their own
        Member("wmt16_Test.zip", "test.src"),
        Member("wmt16_Test.zip", "test.mt"),
        Member("wmt16_test_pe.zip", "test.pe"),
    )
    extractor = AlignedMembers(
        {
            "train": (
                _triplet("wmt16_TrainDev.zip", "train"),
                _triplet("wmt17_train.tar.gz", "train"),
            ),
            "valid": (_triplet("wmt16_TrainDev.zip", "dev"),),
            "test2016": (test2016,),
            "test2017": (_triplet("wmt17_test.tar.gz", "test"),),
            "test2018": (_triplet("wmt18_test_pbsmt.tar.gz", "test"),),
        }
    )
    sizes = {
        "train": 23_000,
        "valid": 1_000,
        "test2016": 2_000,
        "test2017": 2_000,
        "test2018": 2_000,
    }
    return CorpusSpec(
        "wmt_ape_pbsmt_en_de",
        "en",
        "de",
        files,
        extractor,
        sizes,
        "WMT APE en-de IT-domain PBSMT triplets: train WMT16+17, valid dev 2016, tests 2016-2018",
        TRIPLET_FIELDS,
        tuple(extractor.splits),
    )


def _escape_pbsmt() -> CorpusSpec:
    """The eSCAPE en-de PBSMT triplets (URL and layout unverified, see the module docstring)."""
    archive = "en-de.pbsmt.tgz"
    return CorpusSpec(
        "escape_pbsmt_en_de",
        "en",
        "de",
        (RemoteFile(archive, f"{_ESCAPE}/{archive}"),),
        AlignedMembers({"train": (_triplet(archive, "en-de.pbsmt"),)}),
        {"train": None},  # about 7.2 million; the exact published count is not known here
        "eSCAPE (Negri et al. 2018) artificial APE triplets, en-de, phrase-based MT",
        TRIPLET_FIELDS,
        ("train",),
    )


def _registry() -> dict[str, CorpusSpec]:
    wmt16_files, wmt16_extractor = _hf_parquet(
        "wmt/wmt16", "ro-en", {"train": 1, "valid": 1, "test": 1}
    )
    wmt14_files, wmt14_extractor = _hf_parquet(
        "wmt/wmt14", "de-en", {"train": 3, "valid": 1, "test": 1}
    )
    specs = [
        CorpusSpec(
            "iwslt17_de_en",
            "de",
            "en",
            (
                RemoteFile(
                    "de-en.zip",
                    f"{_HF}/IWSLT/iwslt2017/resolve/main/data/2017-01-trnted/texts/de/en/de-en.zip",
                ),
            ),
            Wit3Archive(
                "de-en.zip",
                "de-en",
                test_docs=tuple(f"IWSLT17.TED.tst{year}" for year in range(2010, 2016)),
                valid_docs=("IWSLT17.TED.dev2010",),
            ),
            {"train": 206_112, "valid": 888, "test": 8_079},
            "IWSLT 2017 TED talks; valid dev2010, test tst2010-2015 (the Hugging Face splits)",
        ),
        CorpusSpec(
            "kftt_ja_en",
            "ja",
            "en",
            (
                RemoteFile(
                    "kftt-data-1.0.tar.gz",
                    "http://www.phontron.com/kftt/download/kftt-data-1.0.tar.gz",
                ),
            ),
            TextFiles(
                {
                    split: (f"data/tok/kyoto-{name}.ja", f"data/tok/kyoto-{name}.en")
                    for split, name in (("train", "train.cln"), ("valid", "dev"), ("test", "test"))
                },
                archive="kftt-data-1.0.tar.gz",
            ),
            {"train": 329_882, "valid": 1_166, "test": 1_160},
            "Kyoto Free Translation Task 1.0, tokenized; cleaned train (<= 40 words), dev, test",
        ),
        CorpusSpec(
            "wmt16_ro_en",
            "ro",
            "en",
            wmt16_files,
            wmt16_extractor,
            {"train": 610_320, "valid": 1_999, "test": 1_999},
            "WMT 2016 ro-en; valid newsdev2016, test newstest2016",
        ),
        CorpusSpec(
            "wmt14_en_de",
            "en",
            "de",
            wmt14_files,
            wmt14_extractor,
            {"train": 4_508_785, "valid": 3_000, "test": 3_003},
            "WMT 2014 en-de; valid newstest2013, test newstest2014",
        ),
        CorpusSpec(
            "iwslt14_de_en",
            "de",
            "en",
            (
                RemoteFile(
                    "de-en.tgz", "https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
                ),
            ),
            Wit3Archive(
                "de-en.tgz",
                "de-en",
                test_docs=(
                    "IWSLT14.TED.dev2010",
                    "IWSLT14.TEDX.dev2012",
                    "IWSLT14.TED.tst2010",
                    "IWSLT14.TED.tst2011",
                    "IWSLT14.TED.tst2012",
                ),
                valid_every=23,
                keep_title_description=True,
            ),
            {"train": None, "valid": None, "test": 6_750},
            "IWSLT 2014 TED talks with fairseq's split (prepare-iwslt14.sh), untokenized",
        ),
        CorpusSpec(
            "iwslt15_en_vi",
            "en",
            "vi",
            tuple(
                RemoteFile(f"{name}.{lang}", f"{_STANFORD_IWSLT15}/{name}.{lang}")
                for name in ("train", "tst2012", "tst2013")
                for lang in ("en", "vi")
            ),
            TextFiles(
                {
                    "train": ("train.en", "train.vi"),
                    "valid": ("tst2012.en", "tst2012.vi"),
                    "test": ("tst2013.en", "tst2013.vi"),
                }
            ),
            {"train": 133_317, "valid": 1_553, "test": 1_268},
            "IWSLT 2015 TED talks (Stanford NLP's tokenized files); valid tst2012, test tst2013",
        ),
        _wmt_ape_pbsmt(),
        _escape_pbsmt(),
    ]
    return {spec.name: spec for spec in specs}


CORPORA: dict[str, CorpusSpec] = _registry()


def fetch_corpus(
    corpus: str | CorpusSpec,
    cache_dir: str | os.PathLike[str],
    *,
    progress: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Rows]:
    """Download (or reuse from ``cache_dir/<name>/``) and extract a corpus of :data:`CORPORA`.

    Returns the rows of every split of ``corpus.splits``, one string per field of
    ``corpus.fields``: (source, target) pairs, or (source, MT, post-edit) triplets.
    """
    if isinstance(corpus, str):
        if corpus not in CORPORA:
            raise LearnableSparsityError(f"unknown corpus {corpus!r}; known: {sorted(CORPORA)}")
        corpus = CORPORA[corpus]
    root = Path(cache_dir) / corpus.name
    files = {
        remote.name: download(
            remote.url, root / remote.name, remote.sha256, progress=progress, timeout=timeout
        )
        for remote in corpus.files
    }
    splits = corpus.extractor.extract(files, corpus.source_lang, corpus.target_lang)
    result: dict[str, Rows] = {}
    for split in corpus.splits:
        rows = splits[split]
        expected = corpus.expected_sizes.get(split)
        if expected is not None and len(rows) != expected:
            _log.warning(
                "%s %s has %d rows, the published size is %d",
                corpus.name,
                split,
                len(rows),
                expected,
            )
        result[split] = [row for row in rows if all(row)]
        if len(result[split]) < len(rows):
            _log.warning(
                "%s %s: dropped %d rows with an empty field",
                corpus.name,
                split,
                len(rows) - len(result[split]),
            )
    return result
