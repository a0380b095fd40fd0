"""``synthetic_ape``: its refusal to translate sentences an MT model was trained on, checked before
any task starts (``check_unseen``), or leaving them out (``leave_out_seen``), and the k-fold mode
run as a stage, on small corpora in a temporary repository root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from learnable_sparsity.ape.triplets import SyntheticApeSettings
from learnable_sparsity.data.bpe import train_joint_bpe
from learnable_sparsity.data.generated import generate_splits
from learnable_sparsity.data.local import read_triplets, write_corpus
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.grid import NmtSettings
from learnable_sparsity.settings import build
from pipelines.cells.translation import check_unseen, leave_out_seen
from pipelines.scaffold.params import load_params

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


def test_leave_out_drops_what_the_model_trains_on_and_refuse_keeps_it(nmt) -> None:
    leaked = [*HELDOUT[:3], TRAIN[3], HELDOUT[3], HELDOUT[0]]
    kept, left_out = leave_out_seen(synthetic(seen="leave_out"), leaked)
    assert (kept, left_out) == ([*HELDOUT[:4], HELDOUT[0]], [TRAIN[3][0]])
    check_unseen(synthetic(), nmt, sources(kept))  # what is left passes the refusal
    kept, left_out = leave_out_seen(synthetic(seen="leave_out", mode="kfold"), leaked)
    assert (kept, left_out) == (leaked[:5], [HELDOUT[0][0]])  # repeated across folds
    assert leave_out_seen(synthetic(), leaked) == (leaked, [])


def test_kfold_cross_translation_runs_as_a_stage(
    tmp_path, monkeypatch, ray_local, mlflow_uri
) -> None:
    """Two folds of a tiny generated split: each fold translated by a model trained on the
    other, the triplets in corpus order with the references as pe."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    # Room for empty outputs: the 4-step fold models translate many sentences to nothing (once,
    # on a loaded machine, 35 of 40), and the real set needs 16 translated ones.
    sizes = {"train": 60, "valid": 10, "test": 10, "heldout": 160}
    pairs = generate_splits(sizes, 0)
    write_corpus(tmp_path / "data/corpora/c", pairs)
    train_joint_bpe(pairs["train"] + pairs["heldout"], tmp_path / "data/bpe/c/bpe", 120)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["mlflow"]["experiment"] = "test-kfold"
    params["corpora"] = {"c": {"source": "generated", "sizes": sizes, "seed": 0}}
    params["nmt"]["corpora"] = ["c"]
    params["nmt"]["model"].update(d_model=16, n_heads=2, d_ff=32, enc_layers=1, dec_layers=1)
    params["nmt"]["train"].update(
        max_steps=4, max_tokens=400, warmup=2, log_every=2, validate_every=2, checkpoint_every=2
    )
    params["nmt"]["decode"].update(beam_size=2, max_len_b=3)
    params["synthetic_ape"].update(
        corpus="c", mode="kfold", folds=2, real={"train": 8, "valid": 4, "test": 4}, synthetic=0
    )  # no synthetic set: the 4-step models' output may fail every filter
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": mlflow_uri}
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "pipelines.stages.ape.synthetic_ape"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    heldout = pairs["heldout"]
    real = read_triplets(tmp_path / "data/ape/real", ("train", "valid", "test"))
    summary = json.loads((tmp_path / "results/synthetic_ape/summary.json").read_text())
    # A 4-step model may translate a sentence to nothing: the real set passes over it.
    taken = 16 + summary["real_passed_over_untranslated"]
    sources = [s for s, _, _ in real["train"] + real["valid"] + real["test"]]
    assert [pair for pair in heldout[:taken] if pair[0] in sources] == [
        (s, p) for s, _, p in real["train"] + real["valid"] + real["test"]
    ]
    for fold in ("fold0", "fold1"):
        assert (tmp_path / "results/synthetic_ape/cells" / fold / "last.pt").exists()
    assert summary["sets"]["real"]["train"]["triplets"] == 8
