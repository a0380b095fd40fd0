r"""Training and inference throughput of the attention variants (EST, Zhao et al. 2019, Table 4).

Zhao et al. (2019, Table 4) compare the Transformer with softmax, sparsemax, 1.5-entmax,
α-entmax and top-k attention at one model size: training speed and inference speed (beam search,
128 sentences per batch) in tokens per second. Here every variant is the same
``learnable_sparsity.nmt.model.Transformer`` with a different ``normalizer``, so the comparison
isolates the attention normalizer; α-entmax runs with the model's own per-head α (its parameters).

What is counted:

* training — tokens = non-pad target tokens (y + eos, the tokens the loss is averaged over) of
  the timed updates; each update is the training loop's (``update``: forward, label-smoothed loss,
  backward, gradient clipping, Adam step). ``source_tokens`` counts the non-pad source tokens too.
* inference — tokens = generated target tokens, excluding bos and eos (the lengths of the
  hypotheses ``beam_search`` returns); ``source_tokens`` counts the non-pad source tokens. The
  search runs with ``fixed_length``: every hypothesis has the length limit of its sentence, so
  every variant generates the same tokens. Free-length search of the untrained models timed here
  let their lengths decide the ratio: on the smoke corpus α-entmax generated 3156 tokens where
  softmax generated 2117, and its 1.35× longer decoding read as 1.11× *more* tokens/s.

Throughput = tokens / seconds of wall-clock time (``time.perf_counter``), with
``torch.cuda.synchronize`` at both ends of the timed region when the model is on CUDA.

Precision (:mod:`learnable_sparsity.precision`): every measurement runs in one — float32, TF32
(CUDA only) or bf16 autocast — the training step's as ``train_step`` applies it, beam search's
under the same TF32 mode or autocast; :func:`applicable_precisions` says which a device runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch

from learnable_sparsity.core.registry import NORMALIZERS
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.batching import Batch, Example, batches_of, collate_examples, pad
from learnable_sparsity.nmt.model import Transformer, TransformerConfig
from learnable_sparsity.nmt.search import DecodeSettings
from learnable_sparsity.nmt.training import Update, build_optimizer, read_updates, update
from learnable_sparsity.precision import (
    Precision,
    autocast,
    matmul_precision,
    unsupported,
)
from learnable_sparsity.settings import Settings, SettingsError, setting
from learnable_sparsity.timing import check_count, interleaved_rounds, summarize

PHASES = ("train", "inference")


@dataclass(frozen=True)
class Throughput:
    """Tokens processed in ``seconds`` of wall-clock time.

    ``tokens`` are the counted target tokens (see the module docstring), ``source_tokens`` the
    non-pad source tokens, ``steps`` the timed updates (training) or ``beam_search`` calls
    (inference), ``sentences`` the sentence pairs (training) or source sentences (inference)
    processed in the timed region.
    """

    tokens: int
    source_tokens: int
    sentences: int
    steps: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        """Counted target tokens per second."""
        return self.tokens / self.seconds

    @property
    def total_tokens_per_second(self) -> float:
        """Source plus counted target tokens per second."""
        return (self.source_tokens + self.tokens) / self.seconds

    @property
    def sentences_per_second(self) -> float:
        """Sentences per second."""
        return self.sentences / self.seconds

    def to_dict(self) -> dict[str, float | int]:
        """The fields and the three rates as a JSON-ready dict."""
        return {
            **dataclasses.asdict(self),
            "tokens_per_second": self.tokens_per_second,
            "total_tokens_per_second": self.total_tokens_per_second,
            "sentences_per_second": self.sentences_per_second,
        }


def _device(model: Transformer) -> torch.device:
    return next(model.parameters()).device


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def _timer(device: torch.device) -> Iterator[list[float]]:
    """Yields a one-element list that holds the elapsed seconds once the block has run."""
    elapsed: list[float] = []
    _synchronize(device)
    start = time.perf_counter()
    yield elapsed
    _synchronize(device)
    elapsed.append(time.perf_counter() - start)


@contextmanager
def _training_session(
    model: Transformer,
    batches: Sequence[Batch],
    peak_lr: float,
    warmup: int,
    label_smoothing: float,
    clip_norm: float,
    precision: Precision,
) -> Iterator[Callable[[int], Batch]]:
    """Yields ``step_on(step)``: one update of the training loop (``update``: ``train_step``'s
    without its host syncs) in ``precision`` on ``batches[step % len(batches)]`` (moved to the
    model's device beforehand) with a fresh ``build_optimizer(model, peak_lr, warmup)``
    optimizer, returning the batch. At the end the updates' metrics are read, which raises on a
    non-finite one; afterwards the model is as it was found: parameters and buffers restored,
    gradients cleared, train/eval mode kept."""
    device, was_training = _device(model), model.training
    on_device = [Batch(*(t.to(device) for t in batch)) for batch in batches]
    saved = {key: value.detach().clone() for key, value in model.state_dict().items()}
    optimizer, scheduler = build_optimizer(model, peak_lr, warmup)
    updates: list[Update] = []

    def step_on(step: int) -> Batch:
        batch = on_device[step % len(on_device)]
        updates.append(
            update(
                model,
                batch,
                optimizer,
                scheduler,
                clip_norm,
                label_smoothing,
                precision=precision,
            )
        )
        return batch

    try:
        yield step_on
        read_updates(updates, 1, model.config.normalizer)
    finally:
        model.load_state_dict(saved)
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def _throughput(timed: Sequence[Batch], seconds: float, pad_id: int) -> Throughput:
    """The training throughput of the timed updates on ``timed`` batches."""
    return Throughput(
        tokens=sum(int((b.tgt_out != pad_id).sum()) for b in timed),
        source_tokens=sum(int((b.src != pad_id).sum()) for b in timed),
        sentences=sum(b.src.shape[0] for b in timed),
        steps=len(timed),
        seconds=seconds,
    )


def _timed_updates(
    step_on: Callable[[int], Batch], device: torch.device
) -> Callable[[], tuple[Batch, float]]:
    """A measurement of :func:`~learnable_sparsity.timing.interleaved_rounds`: each call makes
    the next update of a :func:`_training_session` (steps 0, 1, …: the warm-up ones, then the
    timed ones) and returns its batch and its seconds."""
    steps = itertools.count()

    def measure() -> tuple[Batch, float]:
        with _timer(device) as elapsed:
            batch = step_on(next(steps))
        return batch, elapsed[0]

    return measure


def training_round(
    models: Mapping[str, Transformer],
    batches: Sequence[Batch],
    *,
    steps: int,
    warmup_steps: int,
    seed: int = 0,
    peak_lr: float = 5e-4,
    warmup: int = 4000,
    label_smoothing: float = 0.1,
    clip_norm: float = 0.0,
    precision: Precision = "float32",
) -> dict[str, Throughput]:
    """Training throughput of every model, interleaved step by step, in ``precision``.

    Each model first makes ``warmup_steps`` untimed updates; then each of ``steps`` steps is a
    round of :func:`~learnable_sparsity.timing.interleaved_rounds`: every model makes one timed
    update, in an order shuffled afresh at every step (``seed``). Timing single steps side by
    side (tens of milliseconds apart) cancels changes of the machine's speed that last longer
    than a step; timing each model's steps in one block let a shared host's slow phase land on
    one model. The updates cycle over ``batches``, each model with its own fresh optimizer
    (:func:`_training_session`); tokens = non-pad target tokens (y + eos) of the timed updates.
    Every model is restored afterwards.
    """
    check_count("steps", steps, 1)
    check_count("warmup_steps", warmup_steps, 0)
    if not batches:
        raise LearnableSparsityError("training throughput needs at least one batch")

    with ExitStack() as stack:
        measures = {}
        for name, model in models.items():
            session = _training_session(
                model, batches, peak_lr, warmup, label_smoothing, clip_norm, precision
            )
            measures[name] = {"train": _timed_updates(stack.enter_context(session), _device(model))}
        measured = interleaved_rounds(
            measures,
            next(iter(models)),
            rounds=steps,
            warmup=warmup_steps,
            seed=seed,
            value=operator.itemgetter(1),
        )
    throughputs = {}
    for name, model in models.items():
        timed = [repeats[0] for repeats in measured.samples[name]["train"]]  # one repeat a step
        seconds = sum(elapsed for _, elapsed in timed)
        throughputs[name] = _throughput([batch for batch, _ in timed], seconds, model.config.pad_id)
    return throughputs


def training_throughput(
    model: Transformer,
    batches: Sequence[Batch],
    *,
    steps: int,
    warmup_steps: int,
    peak_lr: float = 5e-4,
    warmup: int = 4000,
    label_smoothing: float = 0.1,
    clip_norm: float = 0.0,
) -> Throughput:
    """Training throughput of one model: ``warmup_steps`` untimed, then ``steps`` timed
    ``train_step`` updates (:func:`training_round` of this model alone)."""
    return training_round(
        {"model": model},
        batches,
        steps=steps,
        warmup_steps=warmup_steps,
        peak_lr=peak_lr,
        warmup=warmup,
        label_smoothing=label_smoothing,
        clip_norm=clip_norm,
    )["model"]


def inference_throughput(
    model: Transformer,
    sources: Sequence[Sequence[int]],
    decode: DecodeSettings,
    *,
    batch_size: int = 128,
    warmup_batches: int = 1,
    precision: Precision = "float32",
) -> Throughput:
    """Inference throughput of batched beam search (``decode``) in eval mode without gradients,
    under ``precision``'s TF32 mode or autocast.

    ``sources`` (source ids without padding) are sorted by length (stable) and cut into batches
    of ``batch_size`` sentences (128 in Zhao et al.), padded and moved to the model's device
    before timing; the first ``warmup_batches`` batches are decoded once untimed, all with
    fixed-length search (see the module docstring). tokens = the generated target tokens,
    excluding bos and eos: the summed lengths of the hypotheses ``beam_search`` returns. The
    model's train/eval mode is restored afterwards.
    """
    check_count("batch_size", batch_size, 1)
    check_count("warmup_batches", warmup_batches, 0)
    if not sources:
        raise LearnableSparsityError("inference_throughput needs at least one source sentence")
    for i, source in enumerate(sources):
        if not source:
            raise LearnableSparsityError(f"source sentence {i} is empty")
    device, pad_id, was_training = _device(model), model.config.pad_id, model.training
    ordered = sorted(sources, key=len)
    padded = [
        pad(ordered[i : i + batch_size], pad_id).to(device)
        for i in range(0, len(ordered), batch_size)
    ]

    model.eval()
    try:
        with matmul_precision(precision, device), autocast(precision, device):
            for src in padded[:warmup_batches]:
                decode.search(model, src, fixed_length=True)
            with _timer(device) as elapsed:
                hypotheses = [
                    hyp
                    for src in padded
                    for hyp in decode.search(model, src, fixed_length=True).tokens
                ]
    finally:
        model.train(was_training)
    return Throughput(
        tokens=sum(map(len, hypotheses)),
        source_tokens=sum(map(len, sources)),
        sentences=len(sources),
        steps=len(padded),
        seconds=elapsed[0],
    )


def _comparable(model: Transformer) -> TransformerConfig:
    """The config with the attention-only settings blanked: equal for equally sized models."""
    return dataclasses.replace(model.config, normalizer="softmax", topk_k=1, alpha_init=1.5)


def _check_variants(models: Mapping[str, Transformer]) -> None:
    """``models`` maps variant names (``NORMALIZERS``, "softmax" required) to models whose
    normalizer is that variant and whose configs agree in everything else except top-k's k and
    the initial α, on one device."""
    if "softmax" not in models:
        raise LearnableSparsityError(f"the softmax baseline is missing, got {sorted(models)}")
    reference = _comparable(models["softmax"])
    devices = {str(_device(model)) for model in models.values()}
    if len(devices) != 1:
        raise LearnableSparsityError(f"all variants must be on one device, got {sorted(devices)}")
    for name, model in models.items():
        if model.config.normalizer != name:
            raise LearnableSparsityError(
                f"variant {name!r} has normalizer {model.config.normalizer!r}"
            )
        if _comparable(model) != reference:
            raise LearnableSparsityError(
                f"variant {name!r} differs from softmax in more than the attention normalizer"
            )


def interleaved_variants(
    models: Mapping[str, Transformer],
    batches: Sequence[Batch],
    sources: Sequence[Sequence[int]],
    decode: DecodeSettings,
    *,
    rounds: int,
    train_steps: int,
    warmup_steps: int,
    batch_size: int = 128,
    seed: int = 0,
    on_round: Callable[[int], None] | None = None,
    precision: Precision = "float32",
) -> list[dict[str, dict[str, Throughput]]]:
    """``rounds`` rounds of training and inference throughput of every variant on identical
    inputs (``models`` as :func:`_check_variants` describes), in ``precision``. Each round times
    the variants' training interleaved step by step (:func:`training_round`, the order shuffled
    afresh at every step; ``training_throughput``'s optimizer defaults, no clipping), then each
    variant's beam search (:func:`inference_throughput`) in an order shuffled afresh every
    round; every measurement warms up on its own. All orders come from ``random.Random(seed)``;
    the ratio of a variant to softmax is taken within a round (:func:`summarize_rounds`).
    ``on_round(i)`` is called after round ``i``. Returns per round
    {variant: {"train": …, "inference": …}}.
    """
    check_count("rounds", rounds, 1)
    _check_variants(models)
    rng = random.Random(seed)
    measured = []
    for index in range(rounds):
        train = training_round(
            models,
            batches,
            steps=train_steps,
            warmup_steps=warmup_steps,
            seed=rng.getrandbits(64),
            precision=precision,
        )
        order = list(models)
        rng.shuffle(order)
        inference = {
            name: inference_throughput(
                models[name], sources, decode, batch_size=batch_size, precision=precision
            )
            for name in order
        }
        measured.append(
            {name: {"train": train[name], "inference": inference[name]} for name in models}
        )
        if on_round is not None:
            on_round(index)
    return measured


@dataclass(frozen=True, kw_only=True)
class SpeedSettings(Settings):
    """The speed table's protocol (params ``speed``): every variant of ``variants`` (softmax
    included, the baseline) is timed once per round, train (step by step side by side) and
    inference, ``rounds`` rounds in orders shuffled with ``seed``, with ``threads`` torch threads:
    ``train_steps`` updates (after ``warmup_steps`` untimed ones) on token batches of
    ``max_tokens``, and beam search over the first ``infer_sentences`` test sources in batches
    of ``batch_sentences`` (Zhao et al.: 128), decoded as the evaluation decodes. ``model``:
    the architecture timed, or None for the trained models' (``nmt.model``): EST timed its
    IWSLT architecture, not the Transformer-Base of its WMT runs. ``precisions``: the
    arithmetic of each set of rounds (:mod:`learnable_sparsity.precision`; float32 first, the
    baseline of the others; one the device does not run is reported as not applicable)."""

    corpus: str
    variants: tuple[str, ...] = setting(distinct=True)
    precisions: tuple[Precision, ...] = setting(("float32",), distinct=True)
    rounds: int = setting(3, at_least=1)
    seed: int = setting(0, at_least=0)
    threads: int = setting(2, at_least=1)
    train_steps: int = setting(10, at_least=1)
    warmup_steps: int = setting(3, at_least=0)
    max_tokens: int = setting(2500, at_least=1)
    infer_sentences: int = setting(128, at_least=1)
    batch_sentences: int = setting(128, at_least=1)
    model: TransformerConfig | None = None

    def validate(self) -> None:
        unknown = [v for v in self.variants if v not in NORMALIZERS]
        if unknown or "softmax" not in self.variants:
            raise SettingsError(
                "variants", f"must include softmax and only name {list(NORMALIZERS)}"
            )
        if self.precisions[:1] != ("float32",):
            raise SettingsError(
                "precisions",
                f"must start with 'float32' (the baseline), got {list(self.precisions)}",
            )


def applicable_precisions(
    precisions: Sequence[Precision], device: torch.device | str
) -> dict[str, str | None]:
    """Each of ``precisions`` with None where ``device`` runs it, else why not (TF32 on a CPU:
    not applicable)."""
    return {precision: unsupported(precision, device) for precision in precisions}


def speed_inputs(
    config: TransformerConfig,
    train: Sequence[Example],
    test: Sequence[Example],
    settings: SpeedSettings,
    device: torch.device | str = "cpu",
) -> tuple[dict[str, Transformer], list[Batch], list[list[int]]]:
    """What :func:`measure_precisions` times: one model per variant of ``settings`` — ``config``
    (vocabulary set) with the variant's normalizer and the same initial weights (seed 0) — on
    ``device``, the first token batches of ``train`` (seed 0) and the sources of the first
    ``settings.infer_sentences`` of ``test``. Untrained weights suffice: throughput depends on the
    shapes, and the fixed-length search generates the same tokens with every variant."""
    models = {}
    for variant in settings.variants:
        torch.manual_seed(0)  # the same initial weights for every variant
        models[variant] = Transformer(dataclasses.replace(config, normalizer=variant)).to(device)
    needed = settings.train_steps + settings.warmup_steps
    indices = batches_of(train, settings.max_tokens, seed=0)[:needed]
    batches = [collate_examples(train, batch, models["softmax"]) for batch in indices]
    sources = [source for source, _ in test[: settings.infer_sentences]]
    return models, batches, sources


def precision_round(
    models: Mapping[str, Transformer],
    batches: Sequence[Batch],
    sources: Sequence[Sequence[int]],
    decode: DecodeSettings,
    settings: SpeedSettings,
    precisions: Sequence[Precision],
    index: int,
    on_precision: Callable[[str, dict[str, dict[str, Throughput]]], None] | None = None,
) -> dict[str, dict[str, dict[str, Throughput]]]:
    """Round ``index`` of every precision in ``precisions``: one :func:`interleaved_variants`
    round each (order seed ``settings.seed + index``), the precisions in an order shuffled by
    ``random.Random(settings.seed + index)``, so that a ratio to float32 is taken between
    measurements made minutes apart, not a whole set of rounds apart. Returns precision →
    {variant: {"train": …, "inference": …}}; ``on_precision(precision, that)`` gets each as it
    is measured."""
    order = list(precisions)
    random.Random(settings.seed + index).shuffle(order)
    measured = {}
    for precision in order:
        (measured[precision],) = interleaved_variants(
            models,
            batches,
            sources,
            decode,
            rounds=1,
            train_steps=settings.train_steps,
            warmup_steps=settings.warmup_steps,
            batch_size=settings.batch_sentences,
            seed=settings.seed + index,
            precision=precision,
        )
        if on_precision is not None:
            on_precision(precision, measured[precision])
    return {precision: measured[precision] for precision in precisions}


def measure_precisions(
    config: TransformerConfig,
    train: Sequence[Example],
    test: Sequence[Example],
    settings: SpeedSettings,
    decode: DecodeSettings,
    on_round: Callable[[int], None] | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, dict]:
    """``settings.rounds`` rounds of :func:`precision_round` over the precisions of ``settings``
    that ``device`` runs, on :func:`speed_inputs` (``on_round(i)`` called after round ``i``);
    summarized by :func:`summarize_precisions`."""
    applicable = applicable_precisions(settings.precisions, device)
    runnable = [precision for precision, reason in applicable.items() if reason is None]
    models, batches, sources = speed_inputs(config, train, test, settings, device)
    rounds: dict[str, list] = {precision: [] for precision in runnable}
    for index in range(settings.rounds):
        measured = precision_round(models, batches, sources, decode, settings, runnable, index)
        for precision, variants in measured.items():
            rounds[precision].append(variants)
        if on_round is not None:
            on_round(index)
    return summarize_precisions(rounds, applicable)


def summarize_precisions(
    rounds: Mapping[str, Sequence[Mapping[str, Mapping[str, Throughput]]]],
    applicable: Mapping[str, str | None],
) -> dict[str, dict]:
    """Per precision of ``applicable`` (precision → None, or why the device does not run it):
    ``{"rows": summarize_rounds(rounds[precision])}`` or ``{"not_applicable": why}``. Beside
    float32 each row also holds, per phase, ``<phase>_ratio_to_float32`` — the median over
    rounds of its tokens/s over the same variant's float32 tokens/s *in the same round* — with
    ``<phase>_ratio_to_float32_quartiles``, ``<phase>_ratio_to_float32_relative_spread`` and
    ``ratio_to_float32_each_round``, over the rounds both have measured (none yet: no ratio)."""
    measured: dict[str, dict] = {}
    for precision, reason in applicable.items():
        if reason is not None:
            measured[precision] = {"not_applicable": f"{precision} {reason}"}
        elif rounds[precision]:
            measured[precision] = {"rows": summarize_rounds(rounds[precision])}
    for precision, result in measured.items():
        done = min(len(rounds.get("float32", ())), len(rounds.get(precision, ())))
        if precision == "float32" or "rows" not in result or done == 0:
            continue
        for row in result["rows"]:
            variant = row["variant"]
            per_round = {
                name: {
                    phase: [r[variant][phase].tokens_per_second for r in rounds[name][:done]]
                    for phase in PHASES
                }
                for name in ("float32", precision)
            }
            summary = summarize(per_round, "float32")[precision]
            for phase in PHASES:
                row[f"{phase}_ratio_to_float32"] = summary[phase].ratio
                row[f"{phase}_ratio_to_float32_quartiles"] = list(summary[phase].ratio_quartiles)
                row[f"{phase}_ratio_to_float32_relative_spread"] = summary[phase].relative_spread
                row.setdefault("ratio_to_float32_each_round", {})[phase] = list(
                    summary[phase].ratios
                )
    return measured


def summarize_rounds(rounds: Sequence[Mapping[str, Mapping[str, Throughput]]]) -> list[dict]:
    """JSON-ready rows, one per variant (in the rounds' order), of repeated measurements.

    Each round measures every variant, so the ratio of a variant's tokens/s to softmax's *in the
    same round* cancels what drifts between rounds (load, clock); per phase a row holds
    ``tokens_per_second_each_round``, ``ratio_to_softmax_each_round``, the median round's
    :class:`Throughput`, ``<phase>_ratio_to_softmax`` (the median of the per-round ratios) and,
    from :class:`learnable_sparsity.timing.RatioSummary`, ``<phase>_ratio_quartiles``,
    ``<phase>_ratio_range``, ``<phase>_relative_spread`` (IQR ÷ median) and ``<phase>_noisy``
    (relative spread above ``learnable_sparsity.timing.NOISY_RELATIVE_SPREAD``, or too few rounds).
    """
    speeds = {
        variant: {phase: [r[variant][phase].tokens_per_second for r in rounds] for phase in PHASES}
        for variant in rounds[0]
    }
    summary = summarize(speeds, "softmax")
    rows = []
    for variant in rounds[0]:
        row: dict = {"variant": variant}
        for phase in PHASES:
            per_round = summary[variant][phase]
            order = sorted(range(len(rounds)), key=lambda i: per_round.values[i])
            row[phase] = rounds[order[len(rounds) // 2]][variant][phase].to_dict()
            row[f"{phase}_ratio_to_softmax"] = per_round.ratio
            row[f"{phase}_ratio_quartiles"] = list(per_round.ratio_quartiles)
            row[f"{phase}_ratio_range"] = list(per_round.ratio_range)
            row[f"{phase}_relative_spread"] = per_round.relative_spread
            row[f"{phase}_noisy"] = per_round.noisy
            row.setdefault("tokens_per_second_each_round", {})[phase] = list(per_round.values)
            row.setdefault("ratio_to_softmax_each_round", {})[phase] = list(per_round.ratios)
        rows.append(row)
    return rows
