"""Tests for ``learnable_sparsity.data.registry``: :func:`fetch_corpus` on each archive layout of
``learnable_sparsity.data.extractors`` (files served by the loopback HTTP server of conftest.py), the
APE triplet corpora end to end (download, cache, resume, digests, prepared files) and the
completeness of :data:`CORPORA`."""

from __future__ import annotations

import hashlib
import io
import logging
import re
import socket
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from learnable_sparsity.data.corpora import corpus_fields, corpus_settings, source_language
from learnable_sparsity.data.extractors import AlignedMembers
from learnable_sparsity.data.local import (
    PAIR_FIELDS,
    SPLITS,
    TRIPLET_FIELDS,
    read_triplets,
    write_corpus,
)
from learnable_sparsity.data.registry import CORPORA, CorpusSpec, fetch_corpus
from learnable_sparsity.errors import LearnableSparsityError

if TYPE_CHECKING:
    from tests.loopback import LoopbackServer


def _served(
    spec: CorpusSpec, server: LoopbackServer, contents: dict[str, bytes], *, pin: bool = True
) -> CorpusSpec:
    """``spec`` with every file that has a URL served by ``server`` (``contents``: file name →
    bytes) and, with ``pin``, pinned to the digest of what is served (as the registry pins the
    published file); a manual download keeps no URL."""
    for name, data in contents.items():
        server.files[f"/{spec.name}/{name}"] = data
    files = tuple(
        f
        if f.url is None
        else replace(
            f,
            url=server.url(f"/{spec.name}/{f.name}"),
            sha256=hashlib.sha256(contents[f.name]).hexdigest() if pin else f.sha256,
        )
        for f in spec.files
    )
    return replace(spec, files=files)


def _saved_by_hand(spec: CorpusSpec, cache: Path, contents: dict[str, bytes]) -> None:
    """The manual downloads of ``spec`` put where the user saves them."""
    for remote in spec.files:
        if remote.url is None:
            (cache / spec.name).mkdir(parents=True, exist_ok=True)
            (cache / spec.name / remote.name).write_bytes(contents[remote.name])


def _tar_gz(members: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _zip(members: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    return buffer.getvalue()


def _lines(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


def test_fetch_kftt_tarball_layout(server: LoopbackServer, tmp_path: Path) -> None:
    root = "kftt-data-1.0/data"
    members = {}
    for split, n in (("train.cln", 3), ("dev", 2), ("test", 1)):
        for lang in ("ja", "en"):
            members[f"{root}/tok/kyoto-{split}.{lang}"] = _lines(
                *(f"{split} {lang} {i}" for i in range(n))
            )
            members[f"{root}/orig/kyoto-{split}.{lang}"] = _lines("untokenized decoy")
    members[f"{root}/tok/kyoto-train.en"] = _lines("uncleaned decoy")
    spec = _served(CORPORA["kftt_ja_en"], server, {"kftt-data-1.0.tar.gz": _tar_gz(members)})
    corpus = fetch_corpus(spec, tmp_path, progress=False)
    assert corpus == {
        "train": [(f"train.cln ja {i}", f"train.cln en {i}") for i in range(3)],
        "valid": [("dev ja 0", "dev en 0"), ("dev ja 1", "dev en 1")],
        "test": [("test ja 0", "test en 0")],
    }
    fetch_corpus(spec, tmp_path, progress=False)  # from the cache
    assert len(server.requests) == 1


def _wit3_doc(texts: list[str]) -> str:
    segments = "".join(f'<seg id="{i}"> {t} </seg>\n' for i, t in enumerate(texts, start=1))
    return f'<mteval>\n<srcset>\n<doc docid="1">\n<talkid>1</talkid>\n{segments}</doc>\n</srcset>'


def _train_tags(lang: str, n: int) -> str:
    lines = ["<url>http://www.ted.com/talks/x</url>", "<keywords>talks</keywords>"]
    lines += ["<speaker>Someone</speaker>", "<talkid>1</talkid>"]
    lines += [f"<title>title {lang}</title>", f"<description>about {lang}</description>"]
    return _lines(*lines, *(f"sentence {lang} {i}" for i in range(1, n + 1)), "</doc>")


def test_fetch_iwslt17_wit3_layout(server: LoopbackServer, tmp_path: Path) -> None:
    members = {f"de-en/train.tags.de-en.{lang}": _train_tags(lang, 4) for lang in ("de", "en")}
    docs = ["IWSLT17.TED.dev2010"] + [f"IWSLT17.TED.tst{year}" for year in range(2010, 2016)]
    for doc in docs:
        for lang in ("de", "en"):
            members[f"de-en/{doc}.de-en.{lang}.xml"] = _wit3_doc([f"{doc} {lang} &amp; more"])
    archive = _tar_gz(members)
    spec = _served(CORPORA["iwslt17_de_en"], server, {"de-en.tgz": archive})
    assert "/resolve/ebd7c60d" in CORPORA["iwslt17_de_en"].files[0].url  # a pinned revision
    pinned = (replace(spec.files[0], sha256=hashlib.sha256(archive).hexdigest()),)
    corpus = fetch_corpus(replace(spec, files=pinned), tmp_path, progress=False)
    assert corpus["train"] == [(f"sentence de {i}", f"sentence en {i}") for i in range(1, 5)]
    assert corpus["valid"] == [("IWSLT17.TED.dev2010 de & more", "IWSLT17.TED.dev2010 en & more")]
    assert [source for source, _ in corpus["test"]] == [f"{doc} de & more" for doc in docs[1:]]


def test_fetch_iwslt14_fairseq_split(server: LoopbackServer, tmp_path: Path) -> None:
    members = {f"de-en/train.tags.de-en.{lang}": _train_tags(lang, 48) for lang in ("de", "en")}
    docs = CORPORA["iwslt14_de_en"].extractor.test_docs  # type: ignore[attr-defined]
    for doc in docs:
        for lang in ("de", "en"):
            members[f"de-en/{doc}.de-en.{lang}.xml"] = _wit3_doc([f"{doc} {lang}"])
    spec = _served(CORPORA["iwslt14_de_en"], server, {"de-en.tgz": _tar_gz(members)})
    corpus = fetch_corpus(spec, tmp_path, progress=False)
    # title + description + 48 sentences = 50 training pairs; every 23rd goes to valid
    assert corpus["valid"] == [
        ("sentence de 21", "sentence en 21"),
        ("sentence de 44", "sentence en 44"),
    ]
    assert len(corpus["train"]) == 48
    assert corpus["train"][:3] == [
        ("title de", "title en"),
        ("about de", "about en"),
        ("sentence de 1", "sentence en 1"),
    ]
    assert [source for source, _ in corpus["test"]] == [f"{doc} de" for doc in docs]


def test_fetch_iwslt15_plain_files(server: LoopbackServer, tmp_path: Path) -> None:
    contents = {
        f"{name}.{lang}": _lines(*(f"{name} {lang} {i}" for i in range(2))).encode()
        for name in ("train", "tst2012", "tst2013")
        for lang in ("en", "vi")
    }
    contents["train.vi"] = _lines("train vi 0", "").encode()  # an empty target line
    spec = _served(CORPORA["iwslt15_en_vi"], server, contents)
    assert all(remote.sha256 for remote in spec.files)  # pinned: the fakes get their own pins
    pinned = tuple(
        replace(f, sha256=hashlib.sha256(contents[f.name]).hexdigest()) for f in spec.files
    )
    corpus = fetch_corpus(replace(spec, files=pinned), tmp_path, progress=False)
    assert corpus["train"] == [("train en 0", "train vi 0")]  # the pair with an empty side dropped
    assert corpus["test"] == [("tst2013 en 0", "tst2013 vi 0"), ("tst2013 en 1", "tst2013 vi 1")]


def test_fetch_wmt16_parquet_shards(server: LoopbackServer, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")

    def parquet(rows: list[tuple[str, str]]) -> bytes:
        table = pa.table({"translation": [{"ro": ro, "en": en} for ro, en in rows]})
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        return buffer.getvalue()

    spec = CORPORA["wmt16_ro_en"]
    contents = {
        "train-00000-of-00001.parquet": parquet([("Bună ziua .", "Hello .")] * 3),
        "validation-00000-of-00001.parquet": parquet([("da", "yes")]),
        "test-00000-of-00001.parquet": parquet([("nu", "no"), ("", "empty source")]),
    }
    assert sorted(contents) == sorted(f.name for f in spec.files)
    corpus = fetch_corpus(_served(spec, server, contents), tmp_path, progress=False)
    assert corpus == {
        "train": [("Bună ziua .", "Hello .")] * 3,
        "valid": [("da", "yes")],
        "test": [("nu", "no")],
    }


def test_unknown_corpus_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(LearnableSparsityError, match=r"unknown corpus 'wmt99'.*kftt_ja_en"):
        fetch_corpus("wmt99", tmp_path)


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_registry_entries_are_complete(name: str) -> None:
    spec = CORPORA[name]
    assert spec.name == name
    assert name.endswith(f"_{spec.source_lang}_{spec.target_lang}")
    assert set(spec.expected_sizes) == set(spec.splits)
    for size in spec.expected_sizes.values():
        assert size is None or (isinstance(size, int) and size > 0)
    names = [f.name for f in spec.files]
    assert len(names) == len(set(names))
    for remote in spec.files:  # a URL, or a manual download's page
        address = remote.url if remote.url is not None else remote.page
        assert address is not None and address.startswith(("https://", "http://"))
        assert remote.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", remote.sha256)
    extractor = spec.extractor
    if isinstance(extractor, AlignedMembers):  # every part names one member per field
        assert tuple(extractor.splits) == spec.splits
        parts = [part for split_parts in extractor.splits.values() for part in split_parts]
        assert all(len(part) == len(spec.fields) for part in parts)
        assert {member.archive for part in parts for member in part} == set(names)
        return
    assert spec.fields == PAIR_FIELDS and spec.splits == SPLITS  # what the NMT stages read
    referenced = getattr(extractor, "archive", None)
    if referenced is not None:
        assert referenced in names
    else:  # loose files: every split names two downloaded files
        splits = extractor.splits  # type: ignore[attr-defined]
        assert set(splits) == {"train", "valid", "test"}
        used = {n for value in splits.values() for n in value}
        assert used == set(names)


def test_ape_entries_hold_triplets() -> None:
    wmt = CORPORA["wmt_ape_pbsmt_en_de"]
    assert wmt.fields == TRIPLET_FIELDS
    assert wmt.splits == ("train", "valid", "test2016", "test2017", "test2018")
    assert dict(wmt.expected_sizes) == {
        "train": 23_000,
        "valid": 1_000,
        "test2016": 2_000,
        "test2017": 2_000,
        "test2018": 2_000,
    }
    escape = CORPORA["escape_pbsmt_en_de"]
    assert (escape.fields, escape.splits, dict(escape.expected_sizes)) == (
        TRIPLET_FIELDS,
        ("train",),
        {"train": None},
    )
    settings = corpus_settings({"source": "download", "name": wmt.name}, "corpora.ape")
    assert corpus_fields(settings) == TRIPLET_FIELDS
    assert source_language(settings) == "en"


def _triplet_members(folder: str, stem: str, n: int, fields: tuple[str, ...]) -> dict[str, str]:
    """``<folder>/<stem>.<field>`` members with ``n`` lines ``<folder> <stem> <field> <i>``."""
    return {
        f"{folder}/{stem}.{field}": _lines(*(f"{folder} {stem} {field} {i}" for i in range(n)))
        for field in fields
    }


def _wmt17_test_members(n: int, fields: tuple[str, ...]) -> dict[str, str]:
    """WMT17's test files, ``en-de.<field>.test.2017``, lines ``wmt17 test <field> <i>``."""
    return {
        f"en-de.{field}.test.2017": _lines(*(f"wmt17 test {field} {i}" for i in range(n)))
        for field in fields
    }


def _zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


WMT16_ITEM = "wmt16_LRT-1632.zip"


def _wmt_ape_archives() -> dict[str, bytes]:
    """Fake downloads laid out as LINDAT serves the items (the "all files" zip of each, holding
    the published archives) and as the releases name their files (WMT16 ``train/train.src``,
    WMT17 ``en-de.train.src`` and ``en-de.src.test.2017``; Neural Monkey's tutorial, eske/
    seq2seq), with decoys (QE labels) that must not be read, and the WMT18 test set a user
    saved by hand."""
    pe = ("src", "mt", "pe")
    train_dev = {
        **_triplet_members("train", "train", 3, pe),
        **_triplet_members("dev", "dev", 2, pe),
        "train/train.hter": _lines("0.1", "0.2", "0.3"),
    }
    wmt16 = {
        "TrainDev.zip": _zip(train_dev),
        "Test.zip": _zip(_triplet_members("test", "test", 2, ("src", "mt"))),
        "test_pe.zip": _zip(_triplet_members("test", "test", 2, ("pe",))),
    }
    wmt17_train = _tar_gz(
        {f"en-de.train.{f}": _lines(*(f"wmt17 train {f} {i}" for i in range(2))) for f in pe}
    )
    return {
        WMT16_ITEM: _zip_bytes(wmt16),
        "wmt17_train_1-1966.zip": _zip_bytes({"train.tar.gz": wmt17_train}),
        "wmt17_test_LRT-2133.zip": _zip_bytes(
            {"test.tar.gz": _tar_gz(_wmt17_test_members(1, ("src", "mt")))}
        ),
        "wmt17_test_pe_LRT-2483.zip": _zip(_wmt17_test_members(1, ("pe",))),
        "wmt18_test_pbsmt": _tar_gz(_triplet_members("wmt18", "test", 2, pe)),
    }


def _rows(folder: str, stem: str, n: int) -> list[tuple[str, ...]]:
    return [tuple(f"{folder} {stem} {field} {i}" for field in TRIPLET_FIELDS) for i in range(n)]


def test_fetch_wmt_ape_triplets_and_write_them(
    server: LoopbackServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archives = _wmt_ape_archives()
    spec = _served(CORPORA["wmt_ape_pbsmt_en_de"], server, archives)
    _saved_by_hand(spec, tmp_path / "cache", archives)
    with caplog.at_level(logging.INFO, logger="learnable_sparsity.data.extractors"):
        corpus = fetch_corpus(spec, tmp_path / "cache", progress=False)
    expected = {
        "train": _rows("train", "train", 3) + _rows("wmt17", "train", 2),
        "valid": _rows("dev", "dev", 2),
        "test2016": _rows("test", "test", 2),
        "test2017": _rows("wmt17", "test", 1),
        "test2018": _rows("wmt18", "test", 2),
    }
    assert corpus == expected
    # the log names the file each member was read from, inside the archives inside the item
    assert "'train.src' is TrainDev.zip/train/train.src" in caplog.text
    assert "'en-de.src.test.2017' or 'test.src' is test.tar.gz/en-de.src.test.2017" in caplog.text
    root = tmp_path / "cache" / spec.name
    for remote in spec.files:  # each downloaded file is the pinned one; no digest is recorded
        assert (
            hashlib.sha256((root / remote.name).read_bytes()).digest()
            == hashlib.sha256(archives[remote.name]).digest()
        )
        assert not (root / f"{remote.name}.sha256").exists()
    assert fetch_corpus(spec, tmp_path / "cache", progress=False) == expected  # from the cache
    assert len(server.requests) == len(archives) - 1  # the manual download is never requested

    prepared = tmp_path / "corpora" / spec.name
    meta = write_corpus(prepared, corpus, spec.fields)
    assert meta["sizes"] == {"train": 5, "valid": 2, "test2016": 2, "test2017": 1, "test2018": 2}
    files = sorted(path.name for path in prepared.iterdir())
    assert files == sorted(f"{split}.{field}" for split in spec.splits for field in TRIPLET_FIELDS)
    assert sorted(meta["sha256"]) == files
    assert (prepared / "test2018.pe").read_text() == "wmt18 test pe 0\nwmt18 test pe 1\n"
    assert read_triplets(prepared, spec.splits) == expected


def test_interrupted_ape_download_resumes(server: LoopbackServer, tmp_path: Path) -> None:
    archives = _wmt_ape_archives()
    spec = _served(CORPORA["wmt_ape_pbsmt_en_de"], server, archives)
    _saved_by_hand(spec, tmp_path, archives)
    path = f"/{spec.name}/{WMT16_ITEM}"
    server.drop_after[path] = len(archives[WMT16_ITEM]) // 2
    corpus = fetch_corpus(spec, tmp_path, progress=False)
    assert len(corpus["train"]) == 5
    assert [r for r in server.requests if r[0] == path] == [
        (path, None),
        (path, f"bytes={len(archives[WMT16_ITEM]) // 2}-"),
    ]


def test_a_manual_download_not_saved_yet_names_its_page_and_path(
    server: LoopbackServer, tmp_path: Path
) -> None:
    spec = _served(CORPORA["wmt_ape_pbsmt_en_de"], server, _wmt_ape_archives())
    with pytest.raises(LearnableSparsityError) as error:
        fetch_corpus(spec, tmp_path, progress=False)
    message = str(error.value)
    assert "wmt18_test_pbsmt is a manual download" in message
    assert "https://www.statmt.org/wmt18/ape-task.html" in message
    assert str(tmp_path / spec.name / "wmt18_test_pbsmt") in message


def test_a_member_under_no_known_name_lists_what_the_archive_holds(
    server: LoopbackServer, tmp_path: Path
) -> None:
    archives = _wmt_ape_archives()
    archives["wmt18_test_pbsmt"] = _tar_gz(_triplet_members("wmt18", "ape18", 2, ("src", "mt")))
    spec = _served(CORPORA["wmt_ape_pbsmt_en_de"], server, archives)
    _saved_by_hand(spec, tmp_path, archives)
    with pytest.raises(LearnableSparsityError) as error:
        fetch_corpus(spec, tmp_path, progress=False)
    message = str(error.value)
    assert "holds no file ending in 'en-de.src.test.2018' or 'test.src'" in message
    assert "its 2 files: wmt18/ape18.src, wmt18/ape18.mt" in message


def test_an_unpinned_file_is_never_downloaded(server: LoopbackServer, tmp_path: Path) -> None:
    """The registry pins no digest for the LINDAT items: no request is made (the first
    download's digest would be trusted unchecked); the error names the URL and the path."""
    archives = _wmt_ape_archives()
    spec = _served(CORPORA["wmt_ape_pbsmt_en_de"], server, archives, pin=False)
    _saved_by_hand(spec, tmp_path, archives)
    with pytest.raises(LearnableSparsityError) as error:
        fetch_corpus(spec, tmp_path, progress=False)
    message = str(error.value)
    assert "no SHA-256 is pinned for " + server.url(f"/{spec.name}/{WMT16_ITEM}") in message
    assert str(tmp_path / spec.name / WMT16_ITEM) in message
    assert server.requests == []
    _saved_by_hand(
        replace(spec, files=tuple(replace(f, url=None) for f in spec.files)), tmp_path, archives
    )
    assert len(fetch_corpus(spec, tmp_path, progress=False)["train"]) == 5  # put there by hand


def test_fetch_escape_triplets_streaming(tmp_path: Path) -> None:
    """eSCAPE is a manual download of several GB: the archive the user saved is read, nothing is
    requested; its members are copied out beside it and the rows stream from there, once."""
    spec = CORPORA["escape_pbsmt_en_de"]
    members = _triplet_members("escape", "en-de.pbsmt", 4, TRIPLET_FIELDS)
    members["escape/en-de.pbsmt.mt"] = _lines("m0", "", "m2", "m3")  # an empty MT line
    _saved_by_hand(spec, tmp_path / "cache", {spec.files[0].name: _tar_gz(members)})
    corpus = fetch_corpus(spec, tmp_path / "cache", progress=False)
    assert list(corpus) == ["train"]
    assert not isinstance(corpus["train"], Sequence)  # an iterator: nothing read yet
    copied = tmp_path / "cache" / spec.name / f"{spec.files[0].name}.members"
    assert sorted(path.name for path in copied.iterdir()) == [
        "0-en-de.pbsmt.src",
        "1-en-de.pbsmt.mt",
        "2-en-de.pbsmt.pe",
    ]
    streamed = write_corpus(tmp_path / "streamed", corpus, spec.fields)
    rows = [
        (f"escape en-de.pbsmt src {i}", f"m{i}", f"escape en-de.pbsmt pe {i}") for i in (0, 2, 3)
    ]
    assert (
        read_triplets(tmp_path / "streamed", ("train",))["train"] == rows
    )  # the empty row dropped
    listed = write_corpus(tmp_path / "listed", {"train": rows}, spec.fields)
    assert streamed == listed  # the same files, sizes and digests as from a list


def test_a_streamed_corpus_names_the_file_that_ends_first(tmp_path: Path) -> None:
    spec = CORPORA["escape_pbsmt_en_de"]
    members = _triplet_members("escape", "en-de.pbsmt", 3, TRIPLET_FIELDS)
    members["escape/en-de.pbsmt.pe"] = _lines("p0", "p1")
    _saved_by_hand(spec, tmp_path, {spec.files[0].name: _tar_gz(members)})
    corpus = fetch_corpus(spec, tmp_path, progress=False)
    with pytest.raises(LearnableSparsityError) as err:
        write_corpus(tmp_path / "prepared", corpus, spec.fields)
    message = str(err.value)
    assert "line-aligned files differ in length" in message
    assert re.search(r"\['[^']*:escape/en-de\.pbsmt\.pe'\] end after 2 lines", message)
    assert not (tmp_path / "prepared").exists() or not any((tmp_path / "prepared").iterdir())


def test_misaligned_ape_members_name_every_file(server: LoopbackServer, tmp_path: Path) -> None:
    archives = _wmt_ape_archives()
    archives["wmt17_test_pe_LRT-2483.zip"] = _zip(_wmt17_test_members(2, ("pe",)))
    spec = _served(CORPORA["wmt_ape_pbsmt_en_de"], server, archives)
    _saved_by_hand(spec, tmp_path, archives)
    with pytest.raises(LearnableSparsityError) as err:
        fetch_corpus(spec, tmp_path, progress=False)
    message = str(err.value)
    assert "line-aligned files differ in length" in message
    assert re.search(r"LRT-2133\.zip:test\.tar\.gz/en-de\.mt\.test\.2017 has 1 lines", message)
    assert re.search(r"LRT-2483\.zip:en-de\.pe\.test\.2017 has 2 lines", message)


def test_misaligned_prepared_triplets_name_every_file(tmp_path: Path) -> None:
    write_corpus(tmp_path, {"test2017": [("s", "m", "p"), ("s2", "m2", "p2")]}, TRIPLET_FIELDS)
    (tmp_path / "test2017.pe").write_text("p\n")
    with pytest.raises(LearnableSparsityError) as err:
        read_triplets(tmp_path, ("test2017",))
    message = str(err.value)
    assert f"{tmp_path / 'test2017.mt'} has 2 lines" in message
    assert f"{tmp_path / 'test2017.pe'} has 1 lines" in message


def test_rows_must_match_the_fields(tmp_path: Path) -> None:
    with pytest.raises(LearnableSparsityError, match=r"train: every row .* \['src', 'tgt'\]"):
        write_corpus(tmp_path, {"train": [("s", "m", "p")]})


def test_unreachable_ape_host_suggests_the_local_source(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spec = CORPORA["wmt_ape_pbsmt_en_de"]
    files = tuple(
        replace(f, url=f"http://127.0.0.1:{port}/{f.name}", sha256="0" * 64) for f in spec.files
    )
    with pytest.raises(LearnableSparsityError) as err:
        fetch_corpus(replace(spec, files=files), tmp_path, progress=False, timeout=5)
    message = str(err.value)
    assert f"http://127.0.0.1:{port}/wmt16_LRT-1632.zip" in message
    assert "`local` corpus source" in message


def test_source_language_of_every_corpus_kind() -> None:
    def language(entry: dict) -> str | None:
        return source_language(corpus_settings(entry, "corpora.x"))

    assert language({"source": "generated", "sizes": {"train": 1, "valid": 1, "test": 1}}) == "en"
    assert language({"source": "download", "name": "kftt_ja_en"}) == "ja"
    assert language({"source": "download", "name": "wmt14_en_de"}) == "en"
    files = {split: ["a", "b"] for split in ("train", "valid", "test")}
    assert language({"source": "local", "files": files}) is None
    assert language({"source": "local", "files": files, "source_lang": "ro"}) == "ro"
