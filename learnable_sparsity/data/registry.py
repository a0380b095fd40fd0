"""The registry of published corpora and :func:`fetch_corpus`, which downloads and extracts one.

:data:`CORPORA` names every corpus of the reproduced papers, with its language pair, the files to
fetch, how the train/valid/test pairs are extracted from them and the published split sizes
(train / valid / test pairs):

* ``iwslt17_de_en`` (de→en): IWSLT 2017 TED talks, the WIT3 archive kept by Hugging Face
  (``IWSLT/iwslt2017``, a pinned revision and digest); train ``train.tags``, valid dev2010, test
  tst2010–tst2015 (the Hugging Face splits); 206,112 / 888 / 8,079.
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
  tst2012, test tst2013; 133,317 / 1,553 / 1,268. The six files are pinned to the SHA-256 digests
  that huggingface/datasets recorded for them (Stanford publishes none).

Two automatic post-editing (APE) corpora hold (source, MT output, post-edit) triplets
(``fields`` src, mt, pe) of English→German IT-domain text translated by a phrase-based SMT
system, already tokenized (Correia & Martins 2019 train and test on them):

* ``wmt_ape_pbsmt_en_de``: the WMT APE shared task data on LINDAT/CLARIN, each item fetched whole
  (the repository's "all files of the item" zip, ``<handle>/allzip``, so that no bitstream name
  is assumed): WMT16 (11372/LRT-1632: ``TrainDev.zip``, ``Test.zip``, ``test_pe.zip``, Neural
  Monkey's APE tutorial), WMT17 training set (11234/1-1966), test set (11372/LRT-2133) and its
  post-edits, a separate item (11372/LRT-2483), as the WMT17 task page links them. Splits:
  ``train`` = WMT16 + WMT17 training triplets (12,000 + 11,000), ``valid`` = the WMT16 dev set
  (1,000; WMT17 and WMT18 reuse it), ``test2016`` / ``test2017`` / ``test2018`` (2,000 each).
  The members are found by name inside any archive of the item, under the names each release
  used (WMT16 ``train.src``, WMT17 ``en-de.train.src`` and ``en-de.src.test.2017``, as
  eske/seq2seq's ``config/APE/clean-raw-data.sh`` renames them), and the log names each file used.
  The WMT18 PBSMT test set is a manual download: no source at hand gives its item (the registry
  once guessed 11372/LRT-2590); get it from the WMT18 APE task page.
* ``escape_pbsmt_en_de``: the artificial eSCAPE corpus (Negri et al. 2018), PBSMT part,
  ``train`` only: about 7.2 million triplets (the paper's figure; the exact count is not known
  here, so none is expected). A manual download: the paper gives only the page
  ``hltshare.fbk.eu/QT21/eSCAPE.html``; its archive's name and members are unknown here. It is
  read streaming (several GB): the members are copied out of the archive and their lines read
  in one pass into the prepared files, never held in memory whole.

**Manual downloads and what is unverified.** A file whose entry has no URL (``RemoteFile.page``
only) is read from ``<cache>/<corpus>/<file name>`` where the user saved it; without it the
error names the page and the path. The LINDAT items' ``allzip`` addresses and the WMT18 and eSCAPE
member names were written without network access: a wrong one fails loudly (an HTTP error naming
the URL, a licence page refused as a web page, or a missing member listed with the files the
archive does hold), and ``python -m pipelines.commands.preflight --online --profile paper`` finds the first
two in a minute. No publisher checksum exists for these items, and every download is pinned
(:func:`~learnable_sparsity.data.fetch.download`): a file without a digest here (the LINDAT items,
kftt, fairseq's IWSLT14, wmt/wmt16's ``main``) is fetched by the user, who checks it and saves it
as ``<cache>/<corpus>/<file name>``, where it is used as it is; the error names the URL and path.

Text is kept as published (see :mod:`learnable_sparsity.data.extractors`), so ``iwslt14_de_en`` differs
from fairseq's Moses-tokenized, lowercased, length-cleaned version in its train/valid sizes
(fairseq: 160,239 / 7,283); its test set has the same 6,750 segments.

:func:`fetch_corpus` downloads every file of a corpus into ``<cache_dir>/<name>/`` with
:func:`learnable_sparsity.data.fetch.download` (cache reuse, resume, SHA-256 checks; an unreachable host
raises a :class:`~learnable_sparsity.errors.LearnableSparsityError` pointing to the ``local`` corpus
source), extracts the splits, logs a warning for a split size that differs from the published
one and then drops rows with an empty field (counted in the log). A file whose digest is not
pinned is never downloaded: it must be in the cache already.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from learnable_sparsity.data.extractors import (
    AlignedMembers,
    Extractor,
    Member,
    ParquetTranslations,
    TextFiles,
    Wit3Archive,
)
from learnable_sparsity.data.fetch import DEFAULT_TIMEOUT, download
from learnable_sparsity.data.local import PAIR_FIELDS, SPLITS, TRIPLET_FIELDS, Rows
from learnable_sparsity.errors import LearnableSparsityError

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteFile:
    """One file of a corpus: its name in the cache, its URL and, if pinned, its SHA-256.

    A file without a URL is a manual download: ``page`` says where a user gets it, to save it as
    ``<cache>/<corpus>/<name>``. A file with a URL but no digest is one too: only a pinned file
    is downloaded.
    """

    name: str
    url: str | None
    sha256: str | None = None
    page: str | None = None


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
_LINDAT = "https://lindat.mff.cuni.cz/repository/xmlui/handle"
_WMT18_APE = "https://www.statmt.org/wmt18/ape-task.html"
_ESCAPE = "http://hltshare.fbk.eu/QT21/eSCAPE.html"


# Stanford's IWSLT15 files as huggingface/datasets recorded them (datasets/mt_eng_vietnamese/
# dataset_infos.json at 040102f1): Stanford publishes no digest.
_IWSLT15_SHA256 = {
    ("train", "en"): "c26dfeed74b6bf3752f5ca552f2412456f0de153f7c804df8717931fb3a5c78a",
    ("train", "vi"): "707206edf2dc0280273952c7b70544ea8a1363aa69aaeb9d70514b888dc3067d",
    ("tst2012", "en"): "b8fbcd0d4199d41276421d1f7228298df67dd9e2c5c134c2ee8cdf3ec27801e2",
    ("tst2012", "vi"): "01004078b3f36b0c46e81b65fc6851230b3c823405c76d1d82ef3b786b512ff0",
    ("tst2013", "en"): "3860ce60bc5b85d96cc2d3d580cf1bc9d62440e939c1b964676d3607c4e8f1df",
    ("tst2013", "vi"): "29af16842808da2812b8fd4d47fc05d082ba870e60ab7755090ad04b380994cd",
}


# The Hugging Face revisions pinned (a dataset's ``main`` moves): IWSLT 2017 at the revision whose
# de-en.tgz huggingface/datasets recorded with its SHA-256 (datasets/iwslt2017/dataset_infos.json
# at 040102f1; the repository is IWSLT/iwslt2017 since, and the Hub redirects the old name);
# wmt/wmt14 at a revision a published script pins (no digest of the de-en shards is published);
# wmt/wmt16: none found, so ``main``, whose files (no digest pinned) the user fetches by hand.
_IWSLT17_REVISION = "ebd7c60d9800c2a1be010a227e5f0a2363730f7a"
_WMT14_REVISION = "b199e406369ec1b7634206d3ded5ba45de2fe696"
_WMT16_REVISION = "main"


def _hf_parquet(
    repo: str, revision: str, config: str, shards: Mapping[str, int]
) -> tuple[tuple[RemoteFile, ...], ParquetTranslations]:
    """Files and extractor of a Hugging Face parquet conversion at ``revision``.

    Its files are ``<config>/<split>-NNNNN-of-MMMMM.parquet``, ``shards`` giving MMMMM per split.
    """
    hf_split = {"train": "train", "valid": "validation", "test": "test"}
    names = {
        split: tuple(f"{hf_split[split]}-{i:05d}-of-{count:05d}.parquet" for i in range(count))
        for split, count in shards.items()
    }
    files = tuple(
        RemoteFile(name, f"{_HF}/{repo}/resolve/{revision}/{config}/{name}")
        for split_names in names.values()
        for name in split_names
    )
    return files, ParquetTranslations(names)


def _triplet(archive: str, *names: str) -> tuple[Member, ...]:
    """The ``src``, ``mt`` and ``pe`` members of ``archive``: each ``name`` is a pattern with
    ``{field}``, alternatives of the names releases used."""
    return tuple(
        Member(archive, tuple(name.format(field=field) for name in names))
        for field in TRIPLET_FIELDS
    )


def _lindat_item(name: str, handle: str) -> RemoteFile:
    """A LINDAT/CLARIN item, all its files in one zip (no bitstream name assumed)."""
    return RemoteFile(name, f"{_LINDAT}/{handle}/allzip")


def _wmt_ape_pbsmt() -> CorpusSpec:
    """The WMT 2016-2018 APE en-de PBSMT data (see the module docstring for the sources)."""
    files = (
        _lindat_item("wmt16_LRT-1632.zip", "11372/LRT-1632"),
        _lindat_item("wmt17_train_1-1966.zip", "11234/1-1966"),
        _lindat_item("wmt17_test_LRT-2133.zip", "11372/LRT-2133"),
        _lindat_item("wmt17_test_pe_LRT-2483.zip", "11372/LRT-2483"),
        RemoteFile("wmt18_test_pbsmt", None, page=_WMT18_APE),
    )
    test2017 = (  # the post-edits are an item of their own
        Member("wmt17_test_LRT-2133.zip", ("en-de.src.test.2017", "test.src")),
        Member("wmt17_test_LRT-2133.zip", ("en-de.mt.test.2017", "test.mt")),
        Member("wmt17_test_pe_LRT-2483.zip", ("en-de.pe.test.2017", "test.pe")),
    )
    extractor = AlignedMembers(
        {
            "train": (
                _triplet("wmt16_LRT-1632.zip", "train.{field}"),
                _triplet("wmt17_train_1-1966.zip", "en-de.train.{field}", "train.{field}"),
            ),
            "valid": (_triplet("wmt16_LRT-1632.zip", "dev.{field}"),),
            "test2016": (_triplet("wmt16_LRT-1632.zip", "test.{field}"),),
            "test2017": (test2017,),
            # unverified names, by analogy with 2017's: the error lists the archive's files
            "test2018": (_triplet("wmt18_test_pbsmt", "en-de.{field}.test.2018", "test.{field}"),),
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
    """The eSCAPE en-de PBSMT triplets: a manual download (see the module docstring)."""
    archive = "escape_en-de_pbsmt"
    return CorpusSpec(
        "escape_pbsmt_en_de",
        "en",
        "de",
        (RemoteFile(archive, None, page=_ESCAPE),),
        # unverified member names: the error lists the archive's files
        AlignedMembers({"train": (_triplet(archive, "en-de.pbsmt.{field}"),)}, streamed=True),
        {"train": None},  # about 7.2 million; the exact published count is not known here
        "eSCAPE (Negri et al. 2018) artificial APE triplets, en-de, phrase-based MT",
        TRIPLET_FIELDS,
        ("train",),
    )


def _registry() -> dict[str, CorpusSpec]:
    wmt16_files, wmt16_extractor = _hf_parquet(
        "wmt/wmt16", _WMT16_REVISION, "ro-en", {"train": 1, "valid": 1, "test": 1}
    )
    wmt14_files, wmt14_extractor = _hf_parquet(
        "wmt/wmt14", _WMT14_REVISION, "de-en", {"train": 3, "valid": 1, "test": 1}
    )
    specs = [
        CorpusSpec(
            "iwslt17_de_en",
            "de",
            "en",
            (
                RemoteFile(
                    "de-en.tgz",
                    f"{_HF}/iwslt2017/resolve/{_IWSLT17_REVISION}"
                    "/data/2017-01-trnted/texts/de/en/de-en.tgz",
                    "ebcd53c53c8df742437e3a0fb964772e78764c3f6d4e38df0b6a2f71abc3a8b4",
                ),
            ),
            Wit3Archive(
                "de-en.tgz",
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
                RemoteFile(f"{name}.{lang}", f"{_STANFORD_IWSLT15}/{name}.{lang}", digest)
                for (name, lang), digest in _IWSLT15_SHA256.items()
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


def _fetch(remote: RemoteFile, root: Path, *, progress: bool, timeout: float) -> Path:
    """The cached or downloaded file; a manual download must be in the cache already."""
    if remote.url is not None:
        return download(
            remote.url, root / remote.name, remote.sha256, progress=progress, timeout=timeout
        )
    if not (root / remote.name).is_file():
        raise LearnableSparsityError(
            f"{remote.name} is a manual download (no verified address): get it from "
            f"{remote.page} and save it as {root / remote.name} (a zip or tar archive)"
        )
    return root / remote.name


def fetch_corpus(
    corpus: str | CorpusSpec,
    cache_dir: str | os.PathLike[str],
    *,
    progress: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Rows | Iterator[tuple[str, ...]]]:
    """Download (or reuse from ``cache_dir/<name>/``) and extract a corpus of :data:`CORPORA`.

    Returns the rows of every split of ``corpus.splits``, one string per field of
    ``corpus.fields``: (source, target) pairs, or (source, MT, post-edit) triplets; rows with an
    empty field are dropped (and counted in the log). A list, or for a corpus its extractor
    streams (several GB) an iterator to read once.
    """
    if isinstance(corpus, str):
        if corpus not in CORPORA:
            raise LearnableSparsityError(f"unknown corpus {corpus!r}; known: {sorted(CORPORA)}")
        corpus = CORPORA[corpus]
    root = Path(cache_dir) / corpus.name
    files = {
        remote.name: _fetch(remote, root, progress=progress, timeout=timeout)
        for remote in corpus.files
    }
    splits = corpus.extractor.extract(files, corpus.source_lang, corpus.target_lang)
    result: dict[str, Rows | Iterator[tuple[str, ...]]] = {}
    for split in corpus.splits:
        kept = _kept_rows(splits[split], corpus, split)
        result[split] = list(kept) if isinstance(splits[split], Sequence) else kept
    return result


def _kept_rows(
    rows: Iterable[tuple[str, ...]], corpus: CorpusSpec, split: str
) -> Iterator[tuple[str, ...]]:
    """The rows of ``split`` without those with an empty field; once read, the log says how
    many were dropped and whether the count differs from the published size."""
    total = dropped = 0
    for row in rows:
        total += 1
        if all(row):
            yield row
        else:
            dropped += 1
    expected = corpus.expected_sizes.get(split)
    if expected is not None and total != expected:
        _log.warning(
            "%s %s has %d rows, the published size is %d", corpus.name, split, total, expected
        )
    if dropped:
        _log.warning("%s %s: dropped %d rows with an empty field", corpus.name, split, dropped)
