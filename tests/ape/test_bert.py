"""The smoke BERT: cased WordPiece vocabulary, BERT masking, masked-LM pre-training, loading."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants as hub_constants
from transformers import BertForMaskedLM, BertModel

from learnable_sparsity.ape.bert import load_bert, load_bert_tokenizer
from learnable_sparsity.ape.pretrain import (
    IGNORE_INDEX,
    PretrainSettings,
    mask_tokens,
    pretrain_mlm,
)
from learnable_sparsity.ape.wordpiece import SPECIAL_TOKENS, train_wordpiece
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.hf.attention import register
from learnable_sparsity.settings import SettingsError

torch.set_num_threads(1)

# Both monolingual sides of a tiny synthetic German–English corpus (with accents and casing).
_DE = [
    f"{s} {v} {o} ."
    for s, v, o in itertools.product(
        ("Das Haus", "Der Müller", "Die Straße"), ("ist", "wäre"), ("groß", "schön", "hier")
    )
]
_EN = [
    f"{s} {v} {o} ."
    for s, v, o in itertools.product(
        ("the haus", "the miller", "a café"), ("is", "was"), ("big", "nice", "here")
    )
]
TEXTS = _DE + _EN  # 36 sentences

TINY = PretrainSettings(
    vocab_size=200,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    max_length=16,
    steps=80,
    batch_size=8,
    lr=5e-3,
    warmup=8,
    log_every=10,
    seed=0,
)


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(TEXTS, TINY.vocab_size)


@pytest.fixture(scope="module")
def pretrained(tokenizer):
    logged: list[tuple[int, float]] = []
    model = pretrain_mlm(
        TEXTS, tokenizer, TINY, on_log=lambda step, loss: logged.append((step, loss))
    )
    return model, logged


# --------------------------------------------------------------------------- vocabulary


def test_wordpiece_is_cased_keeps_accents_and_has_bert_special_tokens(tokenizer) -> None:
    assert tokenizer.tokenize("Haus") != tokenizer.tokenize("haus")
    assert tokenizer.convert_tokens_to_string(tokenizer.tokenize("Straße café Müller")) == (
        "Straße café Müller"
    )
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tokenizer.pad_token, tokenizer.unk_token, tokenizer.cls_token) == SPECIAL_TOKENS[:3]
    assert (tokenizer.sep_token, tokenizer.mask_token) == SPECIAL_TOKENS[3:]
    ids = tokenizer("Das Haus")["input_ids"]
    assert (ids[0], ids[-1]) == (tokenizer.cls_token_id, tokenizer.sep_token_id)


def test_wordpiece_round_trips_through_save_pretrained(tokenizer, tmp_path) -> None:
    tokenizer.save_pretrained(tmp_path)
    loaded = load_bert_tokenizer(str(tmp_path))
    assert loaded.get_vocab() == tokenizer.get_vocab()
    sentence = "Das Haus haus Straße café ."
    assert loaded(sentence)["input_ids"] == tokenizer(sentence)["input_ids"]
    assert loaded.tokenize("Haus") != loaded.tokenize("haus")


def test_wordpiece_ids_are_the_same_in_every_process(tmp_path) -> None:
    # The tokenizers trainer numbers pieces differently from process to process.
    script = (
        "import json, sys\n"
        "from learnable_sparsity.ape.wordpiece import train_wordpiece\n"
        f"texts = {TEXTS!r}\n"
        "print(json.dumps(train_wordpiece(texts * 3, 200).get_vocab(), sort_keys=True))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    runs = [
        subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        for _ in range(3)
    ]
    vocabularies = {run.stdout for run in runs}
    assert all(run.returncode == 0 for run in runs) and len(vocabularies) == 1


def test_wordpiece_refuses_a_vocabulary_of_special_tokens_only() -> None:
    with pytest.raises(LearnableSparsityError, match="vocab_size"):
        train_wordpiece(TEXTS, len(SPECIAL_TOKENS))


# --------------------------------------------------------------------------- masking


def test_mask_tokens_follows_bert_statistics() -> None:
    vocab, mask_id, pad_id = 30_000, 4, 0
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, vocab, (400, 256), generator=generator)
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True  # [CLS] … [SEP]
    input_ids[:, 200:] = pad_id  # padding is special too
    special[:, 200:] = True
    masked, labels = mask_tokens(input_ids, special, vocab, mask_id, 0.15, generator)

    selected = labels != IGNORE_INDEX
    eligible = int((~special).sum())  # 400 · 198 = 79 200
    n = int(selected.sum())
    # Binomial(79 200, 0.15): σ of the fraction ≈ 0.0013; 0.01 is ~8σ.
    assert abs(n / eligible - 0.15) < 0.01
    assert not selected[special].any()
    assert torch.equal(labels[selected], input_ids[selected])
    assert torch.equal(masked[~selected], input_ids[~selected])
    # Within the ~11 900 selected: σ of a fraction ≤ √(0.25 / 11 900) ≈ 0.0046; 0.025 is >5σ.
    # A random token equals the original or [MASK] with probability 2/V ≈ 7e-5: negligible.
    to_mask = (masked[selected] == mask_id).float().mean().item()
    kept = (masked[selected] == input_ids[selected]).float().mean().item()
    assert abs(to_mask - 0.8) < 0.025
    assert abs(kept - 0.1) < 0.025
    assert abs((1 - to_mask - kept) - 0.1) < 0.025


def test_mask_tokens_is_reproducible_with_a_seeded_generator() -> None:
    input_ids = torch.randint(5, 100, (4, 30), generator=torch.Generator().manual_seed(1))
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    runs = [
        mask_tokens(input_ids, special, 100, 4, 0.15, torch.Generator().manual_seed(7))
        for _ in range(2)
    ]
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


# --------------------------------------------------------------------------- pre-training


def test_settings_are_validated() -> None:
    fields = {**TINY.__dict__}
    with pytest.raises(SettingsError, match="hidden_size"):
        PretrainSettings(**{**fields, "num_heads": 3})
    with pytest.raises(SettingsError, match="warmup"):
        PretrainSettings(**{**fields, "warmup": TINY.steps + 1})
    with pytest.raises(SettingsError, match="mask_probability"):
        PretrainSettings(**{**fields, "mask_probability": 1.0})


def test_pretraining_lowers_the_masked_lm_loss(pretrained, tokenizer) -> None:
    model, logged = pretrained
    assert [step for step, _ in logged] == list(range(10, 81, 10))
    first, last = logged[0][1], logged[-1][1]
    assert first > 0.8 * torch.log(torch.tensor(float(len(tokenizer)))).item()  # near uniform
    assert last < 0.5 * first
    assert not model.training


def test_pretraining_is_deterministic_given_the_seed(tokenizer) -> None:
    short = PretrainSettings(**{**TINY.__dict__, "steps": 6, "warmup": 2})
    runs = []
    for caller_seed in (1, 2):  # the caller's global RNG state must not matter ...
        torch.manual_seed(caller_seed)
        runs.append(pretrain_mlm(TEXTS, tokenizer, short))
        # ... nor be changed: the next draw is the one the caller's seed gives.
        assert torch.equal(
            torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(caller_seed))
        )
    other = pretrain_mlm(TEXTS, tokenizer, PretrainSettings(**{**short.__dict__, "seed": 1}))
    a, b, c = (run.state_dict() for run in (*runs, other))
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert not all(torch.equal(a[key], c[key]) for key in a)


def test_pretraining_interrupted_and_resumed_ends_with_the_same_weights(
    tokenizer, tmp_path
) -> None:
    # Batches of 5 from 8 texts: the interruption (after step 3) falls inside an epoch.
    settings = PretrainSettings(
        **{**TINY.__dict__, "steps": 6, "warmup": 2, "batch_size": 5, "checkpoint_every": 3}
    )
    whole = pretrain_mlm(TEXTS, tokenizer, settings, checkpoint_dir=tmp_path / "whole")

    def crash_after_step_4(step: int, _loss: float) -> None:
        if step == 4:
            raise KeyboardInterrupt

    logged = PretrainSettings(**{**settings.__dict__, "log_every": 1})
    with pytest.raises(KeyboardInterrupt):
        pretrain_mlm(
            TEXTS, tokenizer, logged, checkpoint_dir=tmp_path / "cut", on_log=crash_after_step_4
        )
    saved_steps: list[int] = []
    resumed = pretrain_mlm(
        TEXTS,
        tokenizer,
        settings,
        checkpoint_dir=tmp_path / "cut",
        before_checkpoint=saved_steps.append,
    )
    assert saved_steps == [6]  # resumed at step 3: only the final save remained
    for (name, a), (_, b) in zip(
        whole.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_pretraining_refuses_a_text_without_tokens(tokenizer) -> None:
    with pytest.raises(LearnableSparsityError, match="text 1"):
        pretrain_mlm(["Das Haus", "   "], tokenizer, TINY)
    with pytest.raises(LearnableSparsityError, match="text 0"):
        pretrain_mlm(["[UNK] 你"], tokenizer, TINY)  # unknown pieces only


# --------------------------------------------------------------------------- loading


def test_load_bert_round_trips_a_saved_directory(pretrained, tokenizer, tmp_path) -> None:
    model, _ = pretrained
    model.save_pretrained(tmp_path)
    batch = tokenizer(TEXTS[:4], padding=True, return_tensors="pt")
    loaded = load_bert(str(tmp_path), model_class=BertForMaskedLM).eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)
        encoder = load_bert(str(tmp_path)).eval()  # the default: the encoder alone
        assert isinstance(encoder, BertModel)
        hidden = model.bert(**batch).last_hidden_state
        assert torch.equal(encoder(**batch).last_hidden_state, hidden)


@pytest.mark.parametrize("load", [load_bert, load_bert_tokenizer])
def test_load_offline_names_the_model_the_cache_and_hf_hub_offline(
    load, tmp_path, monkeypatch
) -> None:
    # huggingface_hub reads HF_HUB_OFFLINE once, at import, into constants.HF_HUB_OFFLINE.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    name = "learnable-sparsity-tests/no-such-bert"
    with pytest.raises(LearnableSparsityError) as error:
        load(name, cache_dir=str(tmp_path))
    message = str(error.value)
    assert name in message and str(tmp_path) in message and "HF_HUB_OFFLINE=1" in message


def test_load_offline_names_the_default_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(LearnableSparsityError, match=str(tmp_path / "hub")):
        load_bert("learnable-sparsity-tests/no-such-bert")


def test_load_bert_names_a_missing_directory(tmp_path) -> None:
    missing = str(tmp_path / "no-bert")
    with pytest.raises(LearnableSparsityError, match="no-bert"):
        load_bert(missing)


# --------------------------------------------------------------------------- sparse attention


@pytest.mark.parametrize("implementation", ["sparsemax", "entmax15"])
def test_pretrained_bert_runs_with_sparse_attention(pretrained, tokenizer, implementation) -> None:
    register()
    model, _ = pretrained
    batch = tokenizer(TEXTS[:3], ["x", "Das Haus ist hier", "a"], padding=True, return_tensors="pt")
    original = model.config._attn_implementation
    try:
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            out = model(**batch, output_attentions=True)
    finally:
        model.set_attn_implementation(original)
    assert torch.isfinite(out.logits).all()
    padded = batch["attention_mask"][:, None, None, :] == 0
    for probs in out.attentions:
        assert (probs.masked_select(padded) == 0).all()
    if implementation == "sparsemax":  # 1.5-entmax of these small scores need not be sparse
        assert any((probs.masked_select(~padded) == 0).any() for probs in out.attentions)
