"""Tests for ``components.nmt.speed``: token counting, model state, the Table 4 layout."""

from __future__ import annotations

import pytest
import torch

from components.core.attention import NORMALIZERS
from components.errors import LearnableSparsityError
from components.nmt.search import beam_search
from components.nmt.speed import (
    Throughput,
    compare_variants,
    inference_throughput,
    speed_table,
    training_throughput,
)
from components.nmt.training import collate

PAD, BOS, EOS = 0, 2, 3
SPECIALS = {"pad_id": PAD, "bos_id": BOS, "eos_id": EOS}

# Batch A: targets of 3 and 1 tokens (+ eos each: 6 counted), sources of 3 and 2 tokens.
# Batch B: one target of 2 tokens (+ eos: 3 counted), one source of 4 tokens.
BATCH_A = collate([[5, 6, 7], [8, 9]], [[10, 11, 12], [13]], **SPECIALS)
BATCH_B = collate([[4, 5, 6, 7]], [[14, 15]], **SPECIALS)
SOURCES = [[4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in model.state_dict().items()}


@pytest.mark.parametrize("normalizer", list(NORMALIZERS))
def test_training_throughput_counts_non_pad_target_tokens(make_model, normalizer: str) -> None:
    model = make_model(normalizer)
    before = _state(model)
    # Warm-up step 0 uses A; the timed steps 1, 2, 3 cycle over B, A, B.
    result = training_throughput(model, [BATCH_A, BATCH_B], steps=3, warmup_steps=1, peak_lr=1.0)
    assert (result.tokens, result.source_tokens, result.sentences, result.steps) == (12, 13, 4, 3)
    assert result.seconds > 0
    assert result.tokens_per_second == pytest.approx(result.tokens / result.seconds)
    assert result.total_tokens_per_second == pytest.approx(25 / result.seconds)
    # The measurement trained the model (lr 1.0) but restored it: same parameters, mode, no grads.
    assert not model.training
    after = model.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)
    assert all(p.grad is None for p in model.parameters())


def test_training_throughput_keeps_train_mode(make_model) -> None:
    model = make_model().train()
    training_throughput(model, [BATCH_B], steps=1, warmup_steps=0)
    assert model.training


@pytest.mark.parametrize("normalizer", list(NORMALIZERS))
def test_inference_throughput_counts_generated_tokens(make_model, normalizer: str) -> None:
    model = make_model(normalizer).train()
    settings = {"beam_size": 2, "max_len_a": 1.0, "max_len_b": 2}
    result = inference_throughput(model, SOURCES, batch_size=2, **settings)
    assert model.training  # restored after decoding in eval mode
    model.eval()
    lengths = [
        len(hyp)
        for i in (0, 2)
        for hyp in beam_search(model, torch.tensor(SOURCES[i : i + 2]), **settings).tokens
    ]
    assert (result.tokens, result.source_tokens) == (sum(lengths), 16)
    assert (result.sentences, result.steps) == (4, 2)
    assert result.tokens > 0 and result.seconds > 0
    assert result.tokens_per_second == pytest.approx(result.tokens / result.seconds)
    assert result.sentences_per_second == pytest.approx(4 / result.seconds)


def test_throughput_to_dict_has_fields_and_rates() -> None:
    record = Throughput(tokens=30, source_tokens=10, sentences=4, steps=2, seconds=2.0).to_dict()
    assert record == {
        "tokens": 30,
        "source_tokens": 10,
        "sentences": 4,
        "steps": 2,
        "seconds": 2.0,
        "tokens_per_second": 15.0,
        "total_tokens_per_second": 20.0,
        "sentences_per_second": 2.0,
    }


def test_compare_variants_renders_table_4(make_model) -> None:
    models = {name: make_model(name) for name in NORMALIZERS}
    alphas = models["entmax_alpha"].alphas()
    rows = compare_variants(
        models, [BATCH_A], SOURCES[:2], train_steps=1, warmup_steps=0, beam_size=2, max_len_b=2
    )
    assert set(rows) == set(NORMALIZERS)
    assert all(rows[name]["train"].tokens == 6 for name in rows)  # identical inputs
    after = models["entmax_alpha"].alphas()
    assert all(torch.equal(alphas[key], after[key]) for key in alphas)  # learned α untouched
    lines = speed_table(rows, topk_k=2).splitlines()
    labels = [line.split(" | ")[0].removeprefix("| ") for line in lines[2:]]
    assert labels == ["Transformer (softmax)", "Sparsemax", "1.5-entmax", "α-entmax", "top-k (k=2)"]
    softmax = lines[2].split(" | ")
    assert softmax[2] == "1.00" and softmax[4].startswith("1.00")


def test_speed_table_ratios_against_softmax() -> None:
    def speed(tokens: int) -> Throughput:
        return Throughput(tokens=tokens, source_tokens=0, sentences=1, steps=1, seconds=1.0)

    rows = {
        "topk": {"train": speed(4800), "inference": speed(660)},
        "softmax": {"train": speed(4900), "inference": speed(700)},
        "sparsemax": {"train": speed(3920), "inference": speed(0)},
    }
    assert speed_table(rows) == (
        "| Model | Train tokens/s | Train ratio | Inference tokens/s | Inference ratio |\n"
        "|---|---:|---:|---:|---:|\n"
        "| Transformer (softmax) | 4,900 | 1.00 | 700 | 1.00 |\n"
        "| Sparsemax | 3,920 | 0.80 | 0 | 0.00 |\n"
        "| top-k | 4,800 | 0.98 | 660 | 0.94 |\n"
    )


def test_speed_table_rejects_incomplete_rows() -> None:
    row = {"train": Throughput(1, 0, 1, 1, 1.0), "inference": Throughput(1, 0, 1, 1, 1.0)}
    with pytest.raises(LearnableSparsityError, match="softmax row"):
        speed_table({"topk": row})
    with pytest.raises(LearnableSparsityError, match="unknown variant 'relu'"):
        speed_table({"softmax": row, "relu": row})
    with pytest.raises(LearnableSparsityError, match="'topk' lacks inference"):
        speed_table({"softmax": row, "topk": {"train": row["train"]}})


def test_compare_variants_rejects_unequal_models(make_model) -> None:
    with pytest.raises(LearnableSparsityError, match="'topk' differs from softmax"):
        compare_variants(
            {"softmax": make_model(), "topk": make_model("topk", d_ff=32)},
            [BATCH_A],
            SOURCES,
            train_steps=1,
            warmup_steps=0,
        )
    with pytest.raises(LearnableSparsityError, match="'topk' has normalizer 'sparsemax'"):
        compare_variants(
            {"softmax": make_model(), "topk": make_model("sparsemax")},
            [BATCH_A],
            SOURCES,
            train_steps=1,
            warmup_steps=0,
        )


def test_invalid_arguments_name_the_value(make_model) -> None:
    model = make_model()
    with pytest.raises(LearnableSparsityError, match="steps must be an integer >= 1, got 0"):
        training_throughput(model, [BATCH_A], steps=0, warmup_steps=0)
    with pytest.raises(LearnableSparsityError, match="at least one batch"):
        training_throughput(model, [], steps=1, warmup_steps=0)
    with pytest.raises(LearnableSparsityError, match="source sentence 1 is empty"):
        inference_throughput(model, [[4, 5], []])
    with pytest.raises(LearnableSparsityError, match="batch_size must be an integer >= 1"):
        inference_throughput(model, SOURCES, batch_size=0)
