"""Which locked environment a run ran in: the lock `make` installed it from, the lock's digest, and
whether the installed distributions are the ones it pins.

`make` installs every distribution at the version and hash of one lock under
``requirements/``: ``cuda.txt`` (PyPI's torch, built with CUDA) or ``torch-cpu.txt`` (the same
release's CPU build, from PyTorch's CPU index) + ``cpu.txt``. The runs' MLflow
tags and the kept records name the lock and its SHA-256, so that a result says which environment
made it; an environment that differs from its lock (installed by hand, upgraded since) says so
and how, rather than borrowing the lock's digest.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipelines.scaffold.imports import ROOT

# The files of each lock, in the order `make` installs them (relative to the repository root).
LOCKS = {
    "cpu": ("requirements/torch-cpu.txt", "requirements/cpu.txt"),
    "cuda": ("requirements/cuda.txt",),
}
# torch's CPU builds carry this local version label (2.13.0+cpu); PyPI's CUDA build none.
CPU_LABEL = "cpu"
# A pin of a lock: ``name==version`` and an optional environment marker after ``;``.
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")
# How many differences the tags spell out (the count is always given).
SHOWN_DIFFERENCES = 10


def pins(path: Path) -> dict[str, str]:
    """The pins of lock file ``path`` that apply to this interpreter and platform (their
    markers evaluated here), by canonical distribution name."""
    pinned = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _PIN.match(line.strip())
        if match is None:
            continue
        name, version, marker = match.groups()
        if marker is None or Marker(marker).evaluate():
            pinned[canonicalize_name(name)] = version
    return pinned


def variant() -> str:
    """The lock this environment should match: ``cpu`` where torch is a CPU build (``+cpu``),
    ``cuda`` otherwise (PyPI's build)."""
    try:
        torch = Version(metadata.version("torch"))
    except metadata.PackageNotFoundError:
        return "cuda"
    return "cpu" if torch.local == CPU_LABEL else "cuda"


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _same(installed: str, locked: str) -> bool:
    try:
        return Version(installed) == Version(locked)
    except InvalidVersion:
        return installed == locked


@dataclass(frozen=True)
class LockedEnvironment:
    """The lock an environment is checked against (``files``, relative to the repository), its
    SHA-256 (over the files' names and contents) and the installed distributions that differ
    from its pins (``"numpy: 2.4.7 installed, 2.4.6 locked"``; empty: the environment is the
    lock's)."""

    variant: str
    files: tuple[str, ...]
    sha256: str
    differences: tuple[str, ...]

    @property
    def matches(self) -> bool:
        return not self.differences

    def tags(self) -> dict[str, str]:
        """The run tags: ``environment.lock``, ``.lock_sha256``, ``.lock_matches`` (and, where it
        does not, ``.lock_differences``)."""
        tags = {
            "environment.lock": " + ".join(self.files),
            "environment.lock_sha256": self.sha256,
            "environment.lock_matches": str(self.matches).lower(),
        }
        if self.differences:
            shown = list(self.differences[:SHOWN_DIFFERENCES])
            more = len(self.differences) - len(shown)
            tags["environment.lock_differences"] = "; ".join(
                shown + ([f"and {more} more"] if more else [])
            )
        return tags

    def as_record(self) -> dict[str, object]:
        return {
            "lock": list(self.files),
            "lock_sha256": self.sha256,
            "matches_lock": self.matches,
            "differences": list(self.differences),
        }


def locked_environment(root: Path = ROOT) -> LockedEnvironment:
    """This environment checked against the lock of its torch build (:func:`variant`)."""
    kind = variant()
    files = LOCKS[kind]
    digest = hashlib.sha256()
    pinned: dict[str, str] = {}
    for relative in files:
        path = root / relative
        digest.update(relative.encode("utf-8") + b"\0" + path.read_bytes() + b"\0")
        pinned |= pins(path)
    differences = []
    for name, locked in sorted(pinned.items()):
        installed = _installed(name)
        if installed is None:
            differences.append(f"{name}: not installed, {locked} locked")
        elif not _same(installed, locked):
            differences.append(f"{name}: {installed} installed, {locked} locked")
    return LockedEnvironment(kind, files, digest.hexdigest(), tuple(differences))
