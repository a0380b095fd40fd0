"""Tests for ``learnable_sparsity.data.bpe``: joint BPE on the generated corpus, round trips, word ids."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from learnable_sparsity.data.bpe import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    BpeModel,
    train_joint_bpe,
    word_ids,
)
from learnable_sparsity.data.generated import generate_corpus
from learnable_sparsity.errors import LearnableSparsityError

VOCAB = 500


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str]]:
    return generate_corpus(2000, seed=0)


@pytest.fixture(scope="module")
def model_path(pairs: list[tuple[str, str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_joint_bpe(pairs, tmp_path_factory.mktemp("bpe") / "joint", VOCAB)


@pytest.fixture(scope="module")
def model(model_path: Path) -> BpeModel:
    return BpeModel(model_path)


def test_training_writes_model_and_vocab_deterministically(
    pairs: list[tuple[str, str]], model_path: Path, tmp_path: Path
) -> None:
    assert model_path.name == "joint.model"
    vocab_lines = model_path.with_suffix(".vocab").read_text().splitlines()
    assert len(vocab_lines) == VOCAB
    assert vocab_lines[:4] == ["<pad>\t0", "<unk>\t0", "<s>\t0", "</s>\t0"]
    again = train_joint_bpe(pairs, tmp_path / "sub" / "joint", VOCAB)
    assert again.read_bytes() == model_path.read_bytes()
    assert sorted(p.name for p in again.parent.iterdir()) == ["joint.model", "joint.vocab"]


def test_special_ids(model: BpeModel) -> None:
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert model.id_to_piece([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = model.encode_ids("the dog walked .", add_bos=True, add_eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID and UNK_ID not in ids


def test_round_trip_on_the_generated_corpus(model: BpeModel, pairs: list[tuple[str, str]]) -> None:
    sentences = [s for pair in pairs for s in pair]
    batch = model.encode_ids_batch(sentences, add_bos=True, add_eos=True)
    for sentence, ids in zip(sentences, batch, strict=True):
        assert model.decode([*ids, PAD_ID, PAD_ID]) == sentence
        assert model.decode_pieces(model.encode(sentence)) == sentence
    assert batch[0] == model.encode_ids(sentences[0], add_bos=True, add_eos=True)


def test_both_languages_share_the_vocabulary(model: BpeModel, pairs: list[tuple[str, str]]) -> None:
    source, target = pairs[0]
    assert UNK_ID not in model.encode_ids(source) + model.encode_ids(target)


def test_word_ids_group_the_pieces_of_a_split_compound(model: BpeModel) -> None:
    sentence = "the riverboatcaptains helped the firestations ."
    pieces = model.encode(sentence)
    ids = word_ids(pieces)
    assert ids.count(1) >= 3  # "riverboatcaptains" is split into several pieces
    words = sentence.split()
    assert max(ids) == len(words) - 1
    for index, word in enumerate(words):
        text = "".join(p for p, i in zip(pieces, ids, strict=True) if i == index)
        assert text.removeprefix("\u2581") == word


def test_word_ids_on_hand_made_pieces() -> None:
    assert word_ids(["▁the", "▁river", "boat", "s", "▁", "15", "▁."]) == [0, 1, 1, 1, 2, 2, 3]
    assert word_ids(["river", "boat", "▁x"]) == [0, 0, 1]
    assert word_ids([]) == []


def test_vocab_size_too_small_is_named(pairs: list[tuple[str, str]], tmp_path: Path) -> None:
    with pytest.raises(LearnableSparsityError, match="vocab_size=10"):
        train_joint_bpe(pairs, tmp_path / "m", 10)
    with pytest.raises(LearnableSparsityError, match="vocab_size must be an integer > 3"):
        train_joint_bpe(pairs, tmp_path / "m", 3)
    assert not list(tmp_path.iterdir())


def test_vocab_size_too_large_shrinks_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tiny = [("the dog walked .", "kuma le zifazo .")] * 20
    with caplog.at_level(logging.WARNING, logger="learnable_sparsity.data.bpe"):
        path = train_joint_bpe(tiny, tmp_path / "tiny", 32000)
    assert 4 < BpeModel(path).vocab_size < 100
    assert "fewer than vocab_size=32000" in caplog.text


def test_missing_model_is_named(tmp_path: Path) -> None:
    with pytest.raises(LearnableSparsityError, match="does not exist"):
        BpeModel(tmp_path / "none.model")
