"""The refusal of ``synthetic_ape`` to translate sentences an MT model was trained on, checked
before any task starts (``check_unseen``), on a small corpus in a temporary repository root."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from components.ape.triplets import SyntheticApeSettings
from components.data.local import write_corpus
from components.errors import LearnableSparsityError
from components.nmt.grid import NmtSettings
from components.settings import build
from pipelines.scaffold.params import load_params
from pipelines.synthetic_ape import check_unseen

REPO = Path(__file__).resolve().parents[2]
TRAIN = [(f"train sentence {i} .", f"satz {i} .") for i in range(20)]
HELDOUT = [(f"held out sentence {i} .", f"ausgelassen {i} .") for i in range(12)]


@pytest.fixture
def nmt(tmp_path, monkeypatch) -> NmtSettings:
    """The committed NMT settings on corpus ``c`` (train and heldout splits), cwd = tmp_path."""
    monkeypatch.chdir(tmp_path)
    write_corpus(tmp_path / "data/corpora/c", {"train": TRAIN, "heldout": HELDOUT})
    settings = load_params(REPO / "params.yaml").settings("nmt", NmtSettings)
    return replace(settings, corpora=("c",))


def synthetic(**changes) -> SyntheticApeSettings:
    data = {
        "corpus": "c",
        "real": {"train": 4, "valid": 2, "test": 2},
        "synthetic": 4,
        "filters": {"max_length_ratio": 2.0, "max_unchanged_share": 0.2},
        **changes,
    }
    return build(SyntheticApeSettings, data, "synthetic_ape")


def sources(pairs) -> list[str]:
    return [source for source, _ in pairs]


def test_held_out_sentences_pass(nmt) -> None:
    check_unseen(synthetic(), nmt, sources(HELDOUT))


def test_the_training_split_is_refused_naming_the_overlap(nmt) -> None:
    with pytest.raises(
        LearnableSparsityError, match=r"c/train for NMT model c/softmax/seed0.*20 of 20"
    ):
        check_unseen(synthetic(split="train"), nmt, sources(TRAIN))


def test_one_training_sentence_among_the_held_out_ones_is_refused(nmt) -> None:
    leaked = [*sources(HELDOUT), TRAIN[3][0]]
    with pytest.raises(LearnableSparsityError, match=r"1 of 13.*train sentence 3 \."):
        check_unseen(synthetic(), nmt, leaked)


def test_a_model_outside_the_nmt_grid_is_refused(nmt) -> None:
    with pytest.raises(LearnableSparsityError, match="not a cell of the NMT grid"):
        check_unseen(synthetic(model="softmax/seed7"), nmt, sources(HELDOUT))


def test_kfold_refuses_a_sentence_repeated_across_folds(nmt) -> None:
    check_unseen(synthetic(mode="kfold", folds=3), nmt, sources(HELDOUT))
    repeated = sources(HELDOUT) + sources(HELDOUT)[:1]
    with pytest.raises(LearnableSparsityError, match="fold"):
        check_unseen(synthetic(mode="kfold", folds=3), nmt, repeated)
