"""Tests for ``learnable_sparsity.nmt.speed``: token counting, model state, rounds and ratios."""

from __future__ import annotations

import pytest
import torch

from learnable_sparsity.core.attention import NORMALIZERS
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt import speed
from learnable_sparsity.nmt.batching import collate
from learnable_sparsity.nmt.search import DecodeSettings, beam_search
from learnable_sparsity.nmt.speed import (
    SpeedSettings,
    Throughput,
    inference_throughput,
    interleaved_variants,
    measure_precisions,
    summarize_rounds,
    training_round,
    training_throughput,
)
from learnable_sparsity.settings import SettingsError, build

PAD, BOS, EOS = 0, 2, 3
SPECIALS = {"pad_id": PAD, "bos_id": BOS, "eos_id": EOS}

# Batch A: targets of 3 and 1 tokens (+ eos each: 6 counted), sources of 3 and 2 tokens.
# Batch B: one target of 2 tokens (+ eos: 3 counted), one source of 4 tokens.
BATCH_A = collate([[5, 6, 7], [8, 9]], [[10, 11, 12], [13]], **SPECIALS)
BATCH_B = collate([[4, 5, 6, 7]], [[14, 15]], **SPECIALS)
SOURCES = [[4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]
DECODE = DecodeSettings(beam_size=2, max_len_a=1.0, max_len_b=2, length_penalty=0.6)


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
    """Fixed-length search: every variant generates ⌊a · src_len + b⌋ tokens per sentence, the
    same tokens whatever the (untrained) model prefers."""
    model = make_model(normalizer).train()
    result = inference_throughput(model, SOURCES, DECODE, batch_size=2)
    assert model.training  # restored after decoding in eval mode
    model.eval()
    settings = {"beam_size": 2, "max_len_a": 1.0, "max_len_b": 2, "length_penalty_exponent": 0.6}
    lengths = [
        len(hyp)
        for i in (0, 2)
        for hyp in beam_search(
            model, torch.tensor(SOURCES[i : i + 2]), **settings, fixed_length=True
        ).tokens
    ]
    assert lengths == [len(source) + 2 for source in SOURCES]
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


def test_every_variant_is_timed_on_identical_inputs(make_model) -> None:
    models = {name: make_model(name) for name in NORMALIZERS}
    alphas = models["entmax_alpha"].alphas()
    rows = interleaved_variants(
        models, [BATCH_A], SOURCES[:2], DECODE, rounds=1, train_steps=1, warmup_steps=0
    )[0]
    assert set(rows) == set(NORMALIZERS)
    assert all(rows[name]["train"].tokens == 6 for name in rows)  # identical inputs
    after = models["entmax_alpha"].alphas()
    assert all(torch.equal(alphas[key], after[key]) for key in alphas)  # learned α untouched


def _speed(tokens: int) -> Throughput:
    return Throughput(tokens=tokens, source_tokens=0, sentences=1, steps=1, seconds=1.0)


def test_ratios_pair_each_round_with_the_softmax_of_the_same_round() -> None:
    # Round 2 ran on a slower machine state: every variant lost half its speed.
    rounds = [
        {
            "softmax": {"train": _speed(1000), "inference": _speed(100)},
            "topk": {"train": _speed(900), "inference": _speed(80)},
        },
        {
            "softmax": {"train": _speed(500), "inference": _speed(50)},
            "topk": {"train": _speed(450), "inference": _speed(40)},
        },
        {
            "softmax": {"train": _speed(1000), "inference": _speed(100)},
            "topk": {"train": _speed(950), "inference": _speed(90)},
        },
    ]
    rows = {row["variant"]: row for row in summarize_rounds(rounds)}
    topk = rows["topk"]
    assert topk["ratio_to_softmax_each_round"]["train"] == [0.9, 0.9, 0.95]
    assert topk["train_ratio_to_softmax"] == 0.9  # the median of the per-round ratios
    assert topk["inference_ratio_to_softmax"] == 0.8
    assert topk["tokens_per_second_each_round"]["train"] == [900.0, 450.0, 950.0]
    assert topk["train"]["tokens"] == 900  # the median round's measurement
    assert rows["softmax"]["train_ratio_to_softmax"] == 1.0
    # the spread of the per-round ratios: quartiles, range, IQR ÷ median, and the noisy flag
    assert topk["train_ratio_quartiles"] == pytest.approx([0.9, 0.925])
    assert topk["train_ratio_range"] == [0.9, 0.95]
    assert topk["train_relative_spread"] == pytest.approx(0.025 / 0.9)
    assert topk["train_noisy"] is False
    assert topk["inference_ratio_quartiles"] == pytest.approx([0.8, 0.85])
    assert topk["inference_noisy"] is False  # 0.05 / 0.8 = 6% of the median
    assert rows["softmax"]["inference_relative_spread"] == 0.0


def test_a_wide_spread_of_per_round_ratios_is_flagged_noisy() -> None:
    rounds = [
        {
            "softmax": {"train": _speed(1000), "inference": _speed(100)},
            "topk": {"train": _speed(tokens), "inference": _speed(90)},
        }
        for tokens in (600, 900, 1200)
    ]
    topk = {row["variant"]: row for row in summarize_rounds(rounds)}["topk"]
    assert topk["train_ratio_to_softmax"] == 0.9
    assert topk["train_relative_spread"] == pytest.approx(0.3 / 0.9) and topk["train_noisy"]
    assert not topk["inference_noisy"]
    two_rounds = {row["variant"]: row for row in summarize_rounds(rounds[:2])}["topk"]
    assert two_rounds["inference_noisy"]  # too few rounds to know the spread


def test_training_is_interleaved_step_by_step_in_a_new_order(make_model, monkeypatch) -> None:
    """Every timed step runs every variant once, in an order shuffled at every step: a change of
    the machine's speed that outlasts a step falls on all variants alike."""
    variants = ("softmax", "sparsemax", "topk")
    models = {name: make_model(name) for name in variants}
    before = {name: _state(model) for name, model in models.items()}
    calls: list[str] = []
    real_step = speed.update

    def spy(model, *args, **kwargs):
        calls.append(model.config.normalizer)
        return real_step(model, *args, **kwargs)

    monkeypatch.setattr(speed, "update", spy)
    result = training_round(models, [BATCH_A, BATCH_B], steps=6, warmup_steps=1, seed=0)
    warmup, timed = calls[:3], calls[3:]
    assert sorted(warmup) == sorted(variants) and len(timed) == 6 * 3
    steps = [timed[3 * i : 3 * (i + 1)] for i in range(6)]
    assert all(sorted(step) == sorted(variants) for step in steps)
    assert len({tuple(step) for step in steps}) > 1  # a new order at every step
    for name in variants:
        assert result[name].steps == 6 and result[name].tokens == 3 * (3 + 6)  # B, A, B, A, …
        after = _state(models[name])
        assert all(torch.equal(before[name][key], after[key]) for key in after)  # restored


def test_interleaved_variants_measure_every_variant_each_round(make_model) -> None:
    models = {name: make_model(name) for name in ("softmax", "entmax_alpha")}
    seen: list[int] = []
    rounds = interleaved_variants(
        models,
        [BATCH_A],
        SOURCES[:2],
        DECODE,
        rounds=3,
        train_steps=2,
        warmup_steps=0,
        seed=1,
        on_round=seen.append,
    )
    assert seen == [0, 1, 2] and len(rounds) == 3
    for measured in rounds:
        assert set(measured) == set(models)
        assert all(measured[v]["train"].tokens == 12 for v in models)  # 2 steps of batch A
        assert all(measured[v]["inference"].sentences == 2 for v in models)
    rows = {row["variant"]: row for row in summarize_rounds(rounds)}
    assert len(rows["entmax_alpha"]["ratio_to_softmax_each_round"]["train"]) == 3


def test_speed_settings_need_the_softmax_baseline() -> None:
    with pytest.raises(SettingsError, match="variants must include softmax"):
        SpeedSettings(corpus="c", variants=("topk",))
    with pytest.raises(SettingsError, match="variants lists \\['topk'\\] more than once"):
        SpeedSettings(corpus="c", variants=("softmax", "topk", "topk"))


def test_speed_settings_may_name_their_own_architecture() -> None:
    base = {"corpus": "c", "variants": ["softmax"]}
    assert build(SpeedSettings, base, "speed").model is None
    iwslt = {"d_model": 512, "n_heads": 4, "d_ff": 1024, "pre_norm": False, "dropout": 0.4}
    model = build(SpeedSettings, {**base, "model": iwslt}, "speed").model
    assert (model.n_heads, model.d_ff, model.pre_norm, model.dropout) == (4, 1024, False, 0.4)
    with pytest.raises(SettingsError, match=r"speed\.model\.d_model must be divisible by n_heads"):
        build(SpeedSettings, {**base, "model": {"n_heads": 3}}, "speed")
    with pytest.raises(SettingsError, match=r"speed\.model has unknown keys \['heads'\]"):
        build(SpeedSettings, {**base, "model": {"heads": 4}}, "speed")


@pytest.mark.parametrize(
    ("normalizer", "overrides", "refusal"),
    [
        ("topk", {"d_ff": 32}, "'topk' differs from softmax"),
        ("sparsemax", {}, "'topk' has normalizer 'sparsemax'"),
    ],
)
def test_unequal_models_are_refused(make_model, normalizer, overrides, refusal) -> None:
    models = {"softmax": make_model(), "topk": make_model(normalizer, **overrides)}
    with pytest.raises(LearnableSparsityError, match=refusal):
        interleaved_variants(
            models, [BATCH_A], SOURCES, DECODE, rounds=1, train_steps=1, warmup_steps=0
        )


def test_invalid_arguments_name_the_value(make_model) -> None:
    model = make_model()
    with pytest.raises(LearnableSparsityError, match="steps must be an integer >= 1, got 0"):
        training_throughput(model, [BATCH_A], steps=0, warmup_steps=0)
    with pytest.raises(LearnableSparsityError, match="at least one batch"):
        training_throughput(model, [], steps=1, warmup_steps=0)
    with pytest.raises(LearnableSparsityError, match="source sentence 1 is empty"):
        inference_throughput(model, [[4, 5], []], DECODE)
    with pytest.raises(LearnableSparsityError, match="batch_size must be an integer >= 1"):
        inference_throughput(model, SOURCES, DECODE, batch_size=0)


def test_measure_precisions_times_each_precision_the_device_runs(make_config) -> None:
    """On the CPU: float32 and bf16 in every round (bf16 rows with their ratios to float32 of
    the same round), TF32 reported as not applicable; the precisions must start with the float32
    baseline."""
    examples = [([4 + i % 10, 5, 6], [7, 8 + i % 5]) for i in range(12)]
    settings = SpeedSettings(
        corpus="tiny", variants=("softmax", "entmax_alpha"), rounds=2, train_steps=1,
        warmup_steps=0, max_tokens=20, infer_sentences=3, batch_sentences=2,
        precisions=("float32", "tf32", "bf16"),
    )  # fmt: skip
    seen: list[int] = []
    measured = measure_precisions(
        make_config("softmax"), examples, examples, settings, DECODE, on_round=seen.append
    )
    assert seen == [0, 1] and list(measured) == ["float32", "tf32", "bf16"]
    assert "needs a CUDA device" in measured["tf32"]["not_applicable"]
    float32, bf16 = measured["float32"]["rows"], measured["bf16"]["rows"]
    assert [row["variant"] for row in bf16] == ["softmax", "entmax_alpha"]
    assert all(row["inference"]["sentences"] == 3 for row in float32 + bf16)  # infer_sentences
    for row, baseline in zip(bf16, float32, strict=True):
        for phase in ("train", "inference"):
            ours = row["tokens_per_second_each_round"][phase]
            theirs = baseline["tokens_per_second_each_round"][phase]
            ratios = [a / b for a, b in zip(ours, theirs, strict=True)]  # round by round
            assert row["ratio_to_float32_each_round"][phase] == pytest.approx(ratios)
            assert row[f"{phase}_ratio_to_float32"] == pytest.approx(sum(ratios) / 2)
    assert "train_ratio_to_float32" not in float32[0]
    with pytest.raises(SettingsError, match=r"precisions must start with 'float32'"):
        SpeedSettings(corpus="c", variants=("softmax",), precisions=("bf16", "float32"))
