"""The environment checked against its lock (``pipelines.scaffold.tracking.lock``): the pins that
apply here, the differences an environment installed otherwise shows, and a digest that changes with
the lock."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from pipelines.scaffold.tracking import lock
from pipelines.scaffold.tracking.lock import LOCKS, locked_environment, pins

PYTEST = metadata.version("pytest")
PACKAGING = metadata.version("packaging")


def _lock(root: Path, variant: str, text: str) -> None:
    for relative in LOCKS[variant]:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text if relative == LOCKS[variant][0] else "")


def test_pins_are_the_lines_whose_markers_hold_here(tmp_path: Path) -> None:
    path = tmp_path / "lock.txt"
    path.write_text(
        "# via uv\n"
        "Foo_Bar==1.2.3 ; python_full_version >= '3.11' \\\n"
        "    --hash=sha256:00\n"
        "    # via baz\n"
        "never==9.9 ; sys_platform == 'never' \\\n"
        "plain==2.0\n"
        "--index-url https://example.org/simple\n"
        "torch==2.13.0+cpu\n"
    )
    assert pins(path) == {"foo-bar": "1.2.3", "plain": "2.0", "torch": "2.13.0+cpu"}


def test_an_environment_that_is_its_lock_matches_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock, "variant", lambda: "cuda")
    _lock(tmp_path, "cuda", f"pytest=={PYTEST} \\\n    --hash=sha256:00\npackaging=={PACKAGING}\n")
    found = locked_environment(tmp_path)
    assert found.matches and found.differences == ()
    tags = found.tags()
    assert tags["environment.lock"] == "requirements/cuda.txt"
    assert tags["environment.lock_matches"] == "true"
    assert "environment.lock_differences" not in tags
    assert len(tags["environment.lock_sha256"]) == 64


def test_differences_are_named_and_the_digest_follows_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock, "variant", lambda: "cpu")
    _lock(tmp_path, "cpu", f"pytest=={PYTEST}\n")
    before = locked_environment(tmp_path)
    assert before.files == LOCKS["cpu"] and before.matches
    _lock(tmp_path, "cpu", f"pytest==0.0.1\nno-such-distribution==1.0\npackaging=={PACKAGING}\n")
    after = locked_environment(tmp_path)
    assert after.sha256 != before.sha256
    assert after.differences == (
        "no-such-distribution: not installed, 1.0 locked",
        f"pytest: {PYTEST} installed, 0.0.1 locked",
    )
    tags = after.tags()
    assert tags["environment.lock_matches"] == "false"
    assert tags["environment.lock_differences"].startswith("no-such-distribution: not installed")
    record = after.as_record()
    assert record["matches_lock"] is False and len(record["differences"]) == 2


def test_many_differences_are_counted_not_all_spelled_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock, "variant", lambda: "cuda")
    _lock(tmp_path, "cuda", "".join(f"absent-{i:02d}==1.0\n" for i in range(13)))
    shown = locked_environment(tmp_path).tags()["environment.lock_differences"]
    assert shown.count("not installed") == lock.SHOWN_DIFFERENCES
    assert shown.endswith("and 3 more")


@pytest.mark.parametrize(("torch", "expected"), [("2.13.0+cpu", "cpu"), ("2.13.0", "cuda")])
def test_the_variant_is_the_torch_build(
    torch: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = metadata.version
    monkeypatch.setattr(
        lock.metadata, "version", lambda name: torch if name == "torch" else real(name)
    )
    assert lock.variant() == expected


def test_this_environment_is_checked_against_the_lock_of_its_torch_build() -> None:
    """Whichever way the tests' environment was made, its lock is one of the repository's and
    each difference names a distribution of it."""
    found = locked_environment()
    assert found.files == LOCKS[lock.variant()]
    for difference in found.differences:
        assert " locked" in difference, difference
