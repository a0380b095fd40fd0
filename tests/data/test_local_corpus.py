"""Tests for ``learnable_sparsity.data.local``: loading and validating the user's parallel files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from learnable_sparsity.data.local import load_local_corpus, read_lines
from learnable_sparsity.errors import LearnableSparsityError


def _write_corpus(root: Path, **overrides: bytes) -> dict[str, tuple[Path, Path]]:
    """Six files train/valid/test × src/tgt; ``overrides`` replaces e.g. ``valid_tgt``."""
    files = {}
    for split, n in (("train", 5), ("valid", 2), ("test", 3)):
        paths = []
        for side in ("src", "tgt"):
            path = root / f"{split}.{side}"
            default = "".join(f"{split} {side} {i} .\n" for i in range(n)).encode()
            path.write_bytes(overrides.get(f"{split}_{side}", default))
            paths.append(path)
        files[split] = (paths[0], paths[1])
    return files


def test_loads_pairs_per_split(tmp_path: Path) -> None:
    files = _write_corpus(
        tmp_path,
        train_src="\ufeffé one\r\n  two  \nthree\nfour\nfive".encode(),  # BOM, CRLF, no final \n
    )
    corpus = load_local_corpus(files)
    assert corpus["train"] == [
        ("é one", "train tgt 0 ."),
        ("two", "train tgt 1 ."),
        ("three", "train tgt 2 ."),
        ("four", "train tgt 3 ."),
        ("five", "train tgt 4 ."),
    ]
    assert corpus["valid"] == [
        ("valid src 0 .", "valid tgt 0 ."),
        ("valid src 1 .", "valid tgt 1 ."),
    ]
    assert len(corpus["test"]) == 3


def test_missing_file_is_named(tmp_path: Path) -> None:
    files = _write_corpus(tmp_path)
    files["test"][1].unlink()
    with pytest.raises(LearnableSparsityError, match=re.escape(f"{files['test'][1]} does not")):
        load_local_corpus(files)


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    files = _write_corpus(tmp_path, valid_src=b"fine\nalso fine\nbad \xff byte\n")
    with pytest.raises(LearnableSparsityError) as err:
        load_local_corpus(files)
    assert str(files["valid"][0]) in str(err.value)
    assert "line 3 is not valid UTF-8" in str(err.value)


def test_different_line_counts_name_both_files_and_counts(tmp_path: Path) -> None:
    files = _write_corpus(tmp_path, train_tgt=b"a\nb\nc\nd\n")
    with pytest.raises(LearnableSparsityError) as err:
        load_local_corpus(files)
    message = str(err.value)
    assert f"{files['train'][0]} has 5 lines" in message
    assert f"{files['train'][1]} has 4" in message


def test_empty_lines_are_listed_with_their_numbers(tmp_path: Path) -> None:
    lines = ["x"] * 30
    for number in (2, 4, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23):  # 1-based
        lines[number - 1] = "  "
    path = tmp_path / "train.src"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LearnableSparsityError) as err:
        read_lines(path)
    message = str(err.value)
    assert str(path) in message
    assert "12 empty line(s)" in message
    # The line numbers listed end with the tenth (the path may hold any digits: pytest-121/).
    listed = message.split("at line(s) ")[1].split(";")[0]
    assert listed == "2, 4, 5, 7, 9, 11, 13, 15, 17, 19, …"


def test_empty_file_is_named(tmp_path: Path) -> None:
    files = _write_corpus(tmp_path, test_src=b"")
    with pytest.raises(LearnableSparsityError, match=re.escape(f"{files['test'][0]} is empty")):
        load_local_corpus(files)


def test_splits_must_be_train_valid_test(tmp_path: Path) -> None:
    files = _write_corpus(tmp_path)
    files["dev"] = files.pop("valid")
    with pytest.raises(LearnableSparsityError, match=r"missing \['valid'\], unknown \['dev'\]"):
        load_local_corpus(files)
