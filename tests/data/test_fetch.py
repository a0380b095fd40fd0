"""Tests for ``learnable_sparsity.data.fetch``: :func:`download` against the loopback HTTP server of
tests/loopback.py (pinned checksums, resume, cache, the offline error, web pages)."""

from __future__ import annotations

import hashlib
import logging
import random
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from learnable_sparsity.data.fetch import download
from learnable_sparsity.errors import LearnableSparsityError

if TYPE_CHECKING:
    from tests.loopback import LoopbackServer

PAYLOAD = random.Random(0).randbytes(300_000)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_download_verifies_the_pinned_checksum(server: LoopbackServer, tmp_path: Path) -> None:
    server.files["/corpus.bin"] = PAYLOAD
    dest = tmp_path / "cache" / "corpus.bin"
    assert download(server.url("/corpus.bin"), dest, _sha(PAYLOAD), progress=False) == dest
    assert dest.read_bytes() == PAYLOAD
    assert sorted(p.name for p in dest.parent.iterdir()) == ["corpus.bin"]


def test_nothing_unpinned_is_downloaded(server: LoopbackServer, tmp_path: Path) -> None:
    """No digest: no request (a first download's digest would be trusted unchecked); a file the
    user put in the cache is used as it is."""
    server.files["/corpus.bin"] = PAYLOAD
    dest = tmp_path / "cache" / "corpus.bin"
    with pytest.raises(LearnableSparsityError) as error:
        download(server.url("/corpus.bin"), dest, None, progress=False)
    assert "no SHA-256 is pinned" in str(error.value) and str(dest) in str(error.value)
    assert server.requests == [] and not dest.parent.exists()
    dest.parent.mkdir()
    dest.write_bytes(b"checked by the user")
    assert download(server.url("/corpus.bin"), dest, None, progress=False) == dest
    assert server.requests == [] and dest.read_bytes() == b"checked by the user"


def test_checksum_mismatch_names_file_and_both_digests(
    server: LoopbackServer, tmp_path: Path
) -> None:
    server.files["/corpus.bin"] = PAYLOAD
    dest = tmp_path / "corpus.bin"
    wrong = "0" * 64
    with pytest.raises(LearnableSparsityError) as err:
        download(server.url("/corpus.bin"), dest, wrong, progress=False)
    message = str(err.value)
    assert "corpus.bin" in message and wrong in message and _sha(PAYLOAD) in message
    assert not dest.exists()
    assert (tmp_path / "corpus.bin.corrupt").read_bytes() == PAYLOAD


def test_interrupted_download_resumes_with_a_range_request(
    server: LoopbackServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:

    server.files["/corpus.bin"] = PAYLOAD
    server.drop_after["/corpus.bin"] = 100_000
    dest = tmp_path / "corpus.bin"
    with caplog.at_level(logging.WARNING):
        download(server.url("/corpus.bin"), dest, _sha(PAYLOAD), progress=False)
    assert dest.read_bytes() == PAYLOAD
    assert server.requests == [("/corpus.bin", None), ("/corpus.bin", "bytes=100000-")]
    assert "closed after byte 100000 of 300000" in caplog.text
    assert not (tmp_path / "corpus.bin.part").exists()


def test_partial_file_is_kept_for_the_next_call(server: LoopbackServer, tmp_path: Path) -> None:
    server.files["/corpus.bin"] = PAYLOAD
    server.drop_after["/corpus.bin"] = 12_345
    dest = tmp_path / "corpus.bin"
    with pytest.raises(LearnableSparsityError, match="keeps the first 12345 bytes"):
        download(server.url("/corpus.bin"), dest, _sha(PAYLOAD), progress=False, attempts=1)
    assert not dest.exists()
    download(server.url("/corpus.bin"), dest, _sha(PAYLOAD), progress=False)
    assert dest.read_bytes() == PAYLOAD
    assert server.requests[-1] == ("/corpus.bin", "bytes=12345-")


def test_complete_partial_file_refused_by_the_server_restarts(
    server: LoopbackServer, tmp_path: Path
) -> None:
    server.files["/corpus.bin"] = PAYLOAD
    (tmp_path / "corpus.bin.part").write_bytes(PAYLOAD)  # complete, but never renamed
    download(server.url("/corpus.bin"), tmp_path / "corpus.bin", _sha(PAYLOAD), progress=False)
    assert server.requests == [("/corpus.bin", "bytes=300000-"), ("/corpus.bin", None)]
    assert (tmp_path / "corpus.bin").read_bytes() == PAYLOAD


def test_corrupted_cache_entry_is_downloaded_again(server: LoopbackServer, tmp_path: Path) -> None:
    server.files["/corpus.bin"] = PAYLOAD
    dest = tmp_path / "corpus.bin"
    download(server.url("/corpus.bin"), dest, _sha(PAYLOAD), progress=False)
    dest.write_bytes(b"bit rot")
    download(server.url("/corpus.bin"), dest, _sha(PAYLOAD), progress=False)
    assert dest.read_bytes() == PAYLOAD
    assert (tmp_path / "corpus.bin.corrupt").read_bytes() == b"bit rot"
    assert len(server.requests) == 2


def test_cache_hit_makes_no_request(server: LoopbackServer, tmp_path: Path) -> None:
    server.files["/corpus.bin"] = PAYLOAD
    dest = tmp_path / "corpus.bin"
    download(server.url("/corpus.bin"), dest, _sha(PAYLOAD), progress=False)
    download(server.url("/corpus.bin"), dest, _sha(PAYLOAD), progress=False)
    assert len(server.requests) == 1


def test_unreachable_host_suggests_the_local_source(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/corpus.bin"
    with pytest.raises(LearnableSparsityError) as err:
        download(url, tmp_path / "corpus.bin", "0" * 64, progress=False, timeout=5)
    assert url in str(err.value) and "`local` corpus source" in str(err.value)


def test_http_error_is_named(server: LoopbackServer, tmp_path: Path) -> None:
    with pytest.raises(LearnableSparsityError, match=r"/missing\.bin failed: HTTP 404"):
        download(server.url("/missing.bin"), tmp_path / "missing.bin", "0" * 64, progress=False)


def test_a_web_page_where_a_file_was_expected_is_refused(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """A repository that answers its licence form with status 200: nothing is kept or recorded."""
    server.files["/item/train.zip"] = b"<html><form>accept the licence</form></html>"
    server.content_types["/item/train.zip"] = "text/html;charset=UTF-8"
    dest = tmp_path / "cache" / "train.zip"
    with pytest.raises(LearnableSparsityError) as error:
        download(server.url("/item/train.zip"), dest, "0" * 64, progress=False)
    assert "answers a web page (text/html" in str(error.value)
    assert server.url("/item/train.zip") in str(error.value) and str(dest) in str(error.value)
    assert not any(dest.parent.iterdir())
