"""The HTTP fetcher: resumable, checksummed downloads into a file cache, standard library only.

:func:`download` fetches one URL into one cache entry and guarantees that the file it returns has
the expected SHA-256:

* **Cache.** A file already at the destination is verified and reused without any request.
* **Resume.** Bytes arrive in ``<file>.part``; a transfer cut short is resumed with an HTTP
  ``Range`` request, up to :data:`DEFAULT_ATTEMPTS` transfers per call, and a partial file left
  by the last attempt stays for the next call to resume. Progress is a tqdm bar.
* **Checksums.** Every download is pinned: the caller gives the expected SHA-256 (the data
  registries pin one per file). The finished file is checked against it and renamed into place
  atomically; a mismatch moves the bad file to ``<file>.corrupt`` and raises a
  :class:`~learnable_sparsity.errors.LearnableSparsityError` naming the file and both digests.
  Nothing is fetched for an entry that pins no digest (such as the Hugging Face ``main`` revision
  of wmt/wmt16): trusting whatever the first download brings would let a changed or hijacked
  source choose the digest later downloads are checked against. Such a file is a manual download,
  used as it is once the user has put it in the cache.
* **Offline.** An unreachable host raises a ``LearnableSparsityError`` naming the URL and pointing
  to the ``local`` corpus source (:mod:`learnable_sparsity.data.local`); an HTTP error names its status.
* **Pages.** No file the project downloads is a web page: an answer of type ``text/html`` (a
  licence form, a login or an error page served with status 200, as data repositories do) is
  refused before a byte is kept, naming the URL and the file to put in the cache by hand.

The digest is :func:`~learnable_sparsity.files.sha256_of`, the one used throughout.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    from tqdm import tqdm

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.files import sha256_of

CHUNK_SIZE = 1 << 16
DEFAULT_TIMEOUT = 60.0  # seconds without data before a connection counts as lost
DEFAULT_ATTEMPTS = 3  # transfers of one file (each resuming the previous one)
USER_AGENT = "learnable-sparsity-corpus-downloader/0.1"
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Content types of a web page, never of a corpus file.
WEB_PAGE_TYPES = ("text/html", "application/xhtml")

_log = logging.getLogger(__name__)


class _InterruptedError(Exception):
    """A transfer stopped before its end; the ``.part`` file holds what arrived."""


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _quarantine(path: Path, final: Path) -> Path:
    bad = _sibling(final, ".corrupt")
    os.replace(path, bad)
    return bad


def _transfer(url: str, part: Path, *, progress: bool, timeout: float) -> None:
    """Fetch ``url`` into ``part``, resuming what it already holds; raise _InterruptedError on a
    transfer cut short and LearnableSparsityError when the server cannot be used."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        response = urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        )
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # nothing left to send: start over to be sure
            part.unlink()
            raise _InterruptedError(f"server refused to resume {part} at byte {offset}") from None
        raise LearnableSparsityError(
            f"download of {url} failed: HTTP {err.code} {err.reason}"
        ) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", err)
        raise LearnableSparsityError(
            f"cannot reach {url} ({reason}). Without network access, fetch the files elsewhere "
            "and use the `local` corpus source with plain-text parallel files"
        ) from None
    with response:
        kind = response.headers.get("Content-Type", "").lower()
        if kind.startswith(WEB_PAGE_TYPES):
            raise LearnableSparsityError(
                f"download of {url} answers a web page ({kind}), not the file: a licence, login "
                f"or error page? Open the URL in a browser and save the file as "
                f"{part.with_name(part.name.removesuffix('.part'))} (the cache uses it as it is)"
            )
        resumed = offset > 0 and response.status == 206
        if resumed and not response.headers.get("Content-Range", "").startswith(f"bytes {offset}-"):
            raise LearnableSparsityError(
                f"download of {url}: the server answered the range request for byte {offset} "
                f"with Content-Range {response.headers.get('Content-Range')!r}"
            )
        if not resumed:
            offset = 0  # the server sends the whole file
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None else None
        received = 0
        with (
            open(part, "ab" if resumed else "wb") as out,
            tqdm(
                total=total,
                initial=offset,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=part.name.removesuffix(".part"),
                disable=not progress,
            ) as bar,
        ):
            try:
                while chunk := response.read(CHUNK_SIZE):
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as err:
                raise _InterruptedError(
                    f"transfer of {url} broke after byte {offset + received}: {err}"
                ) from None
    if length is not None and received < int(length):
        raise _InterruptedError(
            f"connection to {url} closed after byte {offset + received} of {total}"
        )


def download(
    url: str,
    dest: str | os.PathLike[str],
    sha256: str | None,
    *,
    progress: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    attempts: int = DEFAULT_ATTEMPTS,
) -> Path:
    """Download ``url`` to ``dest`` (the cache entry) unless a verified copy is there already.

    ``sha256`` is the pinned digest of the file. None (no digest pinned): nothing is downloaded;
    a file the user put at ``dest`` is returned as it is, else the error names the URL and
    ``dest``. A transfer cut short is resumed from ``<dest>.part`` with an HTTP Range request,
    up to ``attempts`` transfers in all; after that the partial file stays for the next call to
    resume. Returns ``dest``.
    """
    dest = Path(dest)
    if sha256 is None:
        if dest.is_file():
            return dest
        raise LearnableSparsityError(
            f"no SHA-256 is pinned for {url}, so it is not downloaded (the first download's "
            f"digest would be trusted unchecked): fetch the file yourself, check it, and save it "
            f"as {dest}, where it is used as it is"
        )
    if not _SHA256.fullmatch(sha256.lower()):
        raise LearnableSparsityError(
            f"sha256 for {dest.name} is not a hex SHA-256 digest: {sha256!r}"
        )
    expected = sha256.lower()
    if dest.is_file():
        actual = sha256_of(dest)
        if actual == expected:
            return dest
        bad = _quarantine(dest, dest)
        _log.warning(
            "cached %s has sha256 %s, expected %s: moved to %s, downloading again",
            dest,
            actual,
            expected,
            bad,
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = _sibling(dest, ".part")
    for attempt in range(1, attempts + 1):
        try:
            _transfer(url, part, progress=progress, timeout=timeout)
            break
        except _InterruptedError as err:
            _log.warning("%s (attempt %d of %d)", err, attempt, attempts)
    else:
        size = part.stat().st_size if part.exists() else 0
        raise LearnableSparsityError(
            f"download of {url} was interrupted {attempts} times; {part} keeps the first {size} "
            "bytes and the next call resumes from there"
        )
    actual = sha256_of(part)
    if actual != expected:
        bad = _quarantine(part, dest)
        raise LearnableSparsityError(
            f"{dest.name} downloaded from {url} has sha256 {actual}, expected the pinned "
            f"{expected}; the file was moved to {bad}"
        )
    os.replace(part, dest)
    return dest
