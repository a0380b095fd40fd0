"""One training step of every model on every device: "cpu", and "cuda" where torch sees one.

Why: the other tests train on the CPU, where the sparse normalizers run the fused C++ kernels; on
CUDA they run the Triton kernels, and a tensor made without ``device=``, a CPU
generator asked to sample on the GPU or optimizer state left on the host only shows up there.
One step per model and variant catches those, and is cheap enough to run on every machine.

Each step is the project's own: :func:`learnable_sparsity.nmt.training.train_step` (with
:func:`~learnable_sparsity.nmt.training.build_optimizer`) for the NMT Transformer, under every
normalizer of ``NORMALIZERS`` (α-entmax with its learned α per head), and for the APE model;
:func:`learnable_sparsity.lvm.training.fit` over one step of each latent-variable experiment's
``loss``. After the step: the loss is finite; every parameter got a finite gradient, non-zero except
where the model makes it zero (below), and every parameter with a required non-zero gradient
changed; parameters, gradients, buffers, optimizer state and the model's output are on the
device.

Exempt from the non-zero gradient: the key projections' biases. Every normalizer here is
invariant to adding a constant to a query's row of scores, and a key bias b adds the same
⟨q, b⟩ to every key of query q, so its gradient is zero in exact arithmetic (rounding noise).

Latent-variable experiments run every method each supports (its settings' ``KNOWN_METHODS``:
9 for the semi-supervised VAE, 11 for the signalling game, counting SFE with the nll and the
0/1 reward, 8 for the bit-vector VAE): all 28 steps take about 0.3 s on 2 CPU cores. They
call the experiment's ``loss`` on batches moved to the device, sampling from a generator on the
device; not the experiment's ``setup``, whose step function draws the batches on the host from
the same generator that the estimators sample with on the model's device (so it runs on the
CPU only).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from transformers import BertConfig, BertModel, BertTokenizerFast

from learnable_sparsity.ape.model import ApeConfig, build_ape_model, joint_input, target_ids
from learnable_sparsity.ape.wordpiece import SPECIAL_TOKENS
from learnable_sparsity.core.attention import NORMALIZERS
from learnable_sparsity.data.images import binarize, quantize
from learnable_sparsity.data.signal_game import GameData
from learnable_sparsity.lvm import bitvector_vae, signal_game, ssvae
from learnable_sparsity.lvm.bitvector_vae import BitVectorVaeSettings
from learnable_sparsity.lvm.methods import Method, build_method
from learnable_sparsity.lvm.signal_game import Games, SignalGameSettings
from learnable_sparsity.lvm.ssvae import SsvaeSettings
from learnable_sparsity.lvm.training import StepFn, fit
from learnable_sparsity.nmt.batching import Batch, Example, collate_examples
from learnable_sparsity.nmt.training import TrainingSettings, build_optimizer, train, train_step
from learnable_sparsity.settings import SettingsError
from tests.conftest import DEVICES
from tests.tiny_transformer import VOCAB, tiny_model


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Each device the machine has: the CPU always, CUDA when torch can use it."""
    return torch.device(request.param)


# --------------------------------------------------------------------------- shared checks


def _is_key_bias(name: str) -> bool:
    """A key projection's bias (NMT ``k_proj.bias``, BERT ``key.bias``): zero gradient by the
    normalizers' shift invariance (module docstring)."""
    return name.endswith(("k_proj.bias", "key.bias"))


def _snapshot(named: Iterable[tuple[str, nn.Parameter]]) -> dict[str, Tensor]:
    return {name: p.detach().clone() for name, p in named}


def assert_trained(
    named: Iterable[tuple[str, nn.Parameter]],
    before: dict[str, Tensor],
    exempt: Callable[[str], bool] = _is_key_bias,
) -> None:
    """Every parameter has a finite gradient; each one not ``exempt`` has a non-zero gradient
    and moved away from its value in ``before``."""
    named = list(named)
    assert named and named[0][0] in before, "no parameters, or not those of the snapshot"
    for name, p in named:
        assert p.grad is not None, f"{name} got no gradient"
        assert bool(torch.isfinite(p.grad).all()), f"{name} has a non-finite gradient"
        if exempt(name):
            continue
        assert bool(p.grad.any()), f"{name} got an all-zero gradient"
        assert not torch.equal(p.detach(), before[name]), f"{name} did not change"


def _optimizer_tensors(optimizer: Optimizer) -> Iterator[tuple[str, Tensor]]:
    """The optimizer's state tensors, without Adam's ``step`` counters: torch keeps those on
    the host by design (unless ``capturable``/``fused``), wherever the parameters are."""
    for index, state in enumerate(optimizer.state.values()):
        for key, value in state.items():
            if isinstance(value, Tensor) and key != "step":
                yield f"optimizer state {index}.{key}", value


def assert_on_device(
    device: torch.device,
    named: Iterable[tuple[str, nn.Parameter]],
    buffers: Iterable[tuple[str, Tensor]],
    optimizer: Optimizer,
    outputs: Iterable[tuple[str, Tensor]],
) -> None:
    """Parameters, their gradients, buffers, optimizer state and ``outputs`` are on ``device``."""
    tensors: list[tuple[str, Tensor]] = []
    for name, p in named:
        tensors.append((f"parameter {name}", p))
        if p.grad is not None:
            tensors.append((f"gradient of {name}", p.grad))
    tensors += [(f"buffer {name}", b) for name, b in buffers]
    tensors += [*_optimizer_tensors(optimizer), *outputs]
    assert any(name.startswith("optimizer") for name, _ in tensors), "the optimizer has no state"
    misplaced = [f"{name} on {t.device}" for name, t in tensors if t.device.type != device.type]
    assert not misplaced, f"not on {device}: {misplaced}"


# --------------------------------------------------------------------------- seq2seq models


def seq2seq_step(model: nn.Module, batch: Batch, device: torch.device, variant: str) -> None:
    """One :func:`train_step` of ``model`` (already on ``device``) on ``batch``, then every
    check of the module docstring; the model's output is caught by a forward hook."""
    batch = batch.to(device)
    optimizer, scheduler = build_optimizer(model, 1e-3, warmup=1)
    before = _snapshot(model.named_parameters())
    outputs: list[Tensor] = []
    hook = model.register_forward_hook(lambda _module, _inputs, output: outputs.append(output))
    try:
        metrics = train_step(model, batch, optimizer, scheduler, 1.0, 0.1, step=1, variant=variant)
    finally:
        hook.remove()
    assert torch.isfinite(torch.tensor(metrics["loss"])), metrics
    assert metrics["tokens"] == int((batch.tgt_out != model.config.pad_id).sum())
    assert_trained(model.named_parameters(), before)
    logits = [(f"logits {i}", output) for i, output in enumerate(outputs)]
    assert len(logits) == 1
    assert_on_device(device, model.named_parameters(), model.named_buffers(), optimizer, logits)


def _alpha_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters() if name.endswith("alpha_logit")]


def _copy_examples(n: int = 8, seed: int = 0) -> list[Example]:
    """Copy task: ``n`` sentences of 2–6 ordinary ids (4 … VOCAB − 1), target = source."""
    rng = random.Random(seed)
    sentences = [[rng.randrange(4, VOCAB) for _ in range(rng.randint(2, 6))] for _ in range(n)]
    return [(s, list(s)) for s in sentences]


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_nmt_transformer_step(device: torch.device, normalizer: str) -> None:
    """The tiny Transformer of tests/nmt (2+2 layers, d 32, dropout on; top-k keeps 2 keys;
    α-entmax heads start at α = 1.2 and 1.8), one step of the copy task."""
    model = tiny_model(normalizer, seed=0).to(device)
    examples = _copy_examples()
    alphas = _alpha_names(model)
    assert bool(alphas) == (normalizer == "entmax_alpha"), alphas
    seq2seq_step(model, collate_examples(examples, range(len(examples)), model), device, normalizer)
    for alpha in model.alphas().values():
        assert alpha.device.type == device.type
        assert bool(((alpha > 1.01) & (alpha < 2.0)).all()), alpha


class _InterruptedError(Exception):
    """Stands for a killed process."""


def test_nmt_training_resumes_identically(device: torch.device, tmp_path: Path) -> None:
    """``learnable_sparsity.nmt.training.train`` of α-entmax on the device, stopped after its first
    checkpoint and resumed from it (loaded onto the device, its random states restored —
    the CPU's and, on a GPU, every CUDA device's, which dropout draws from there), ends with the
    weights of the straight run."""
    examples = _copy_examples()
    settings = TrainingSettings(
        max_steps=4, max_tokens=64, warmup=2, peak_lr=3e-3, log_every=1, validate_every=2,
        checkpoint_every=2, keep_checkpoints=2,
    )  # fmt: skip

    def run(directory: Path, on_log: Callable[[int, dict], None] | None = None) -> nn.Module:
        model = tiny_model("entmax_alpha", seed=0).to(device)
        train(model, examples, examples, settings, checkpoint_dir=directory, variant="v",
              on_log=on_log)  # fmt: skip
        return model

    def interrupt(step: int, _: dict) -> None:
        if step == 2:
            raise _InterruptedError

    straight = run(tmp_path / "straight")
    with pytest.raises(_InterruptedError):
        run(tmp_path / "resumed", interrupt)
    resumed = run(tmp_path / "resumed")
    for (name, a), b in zip(
        straight.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


LETTERS = "abcdefgh"
# (src, mt, pe) triplets over LETTERS: segments of at most 6 WordPiece tokens.
TRIPLETS = [("a b c", "a bd", "a bad"), ("h", "e f", "e f"), ("c d", "c d", "c ed")]


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizerFast:
    """A WordPiece tokenizer over BERT's special tokens, LETTERS and their "##" pieces (no
    download)."""
    words = [*SPECIAL_TOKENS, *LETTERS, *(f"##{c}" for c in LETTERS)]
    return BertTokenizerFast(vocab={word: i for i, word in enumerate(words)})


def tiny_bert(tokenizer: BertTokenizerFast) -> BertModel:
    """A random BERT: 2 layers of width 32, 4 heads, feed-forward 64, 16 positions."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        pad_token_id=tokenizer.pad_token_id,
    )
    return BertModel(config, add_pooling_layer=False)


# "bert" (the paper's model) under every normalizer, started from BERT with CA ← SA, and the
# dual-source baseline with learned α (its two encoders and two context attentions).
APE_CASES = [("bert", name) for name in NORMALIZERS] + [("dual_source", "entmax_alpha")]


@pytest.mark.parametrize(("architecture", "attention"), APE_CASES)
def test_ape_model_step(
    device: torch.device, tokenizer: BertTokenizerFast, architecture: str, attention: str
) -> None:
    """One step of the APE model built from a tiny random BERT on three (src, mt, pe)
    triplets; "topk" keeps 2 keys, α-entmax starts at AST's random α per head."""
    flags = {"bert_encoder": True, "bert_decoder": True, "ca_init_sa": True}
    config = ApeConfig(
        architecture=architecture,
        attention=attention,
        topk_k=2,
        **(flags if architecture == "bert" else {}),
    )
    torch.manual_seed(1)
    model = build_ape_model(config, tiny_bert(tokenizer), tokenizer).to(device)
    assert bool(_alpha_names(model)) == (attention == "entmax_alpha")
    examples = [(joint_input(tokenizer, s, m), target_ids(tokenizer, pe)) for s, m, pe in TRIPLETS]
    batch = collate_examples(examples, range(len(examples)), model)
    seq2seq_step(model, batch, device, f"{architecture}/{attention}")


# --------------------------------------------------------------------------- latent variables

PIXELS, CLASSES, LEVELS, BITS, BATCH = 16, 4, 4, 6, 8
FEATURES, CONCEPTS, CANDIDATES, SYMBOLS = 8, 6, 4, 8


class LvmStep(NamedTuple):
    """A latent-variable experiment on a device: its model, its method and one step's loss."""

    model: nn.Module
    method: Method
    step_fn: StepFn


def _method(name: str, latent: str, features: int) -> Method:
    """``name`` with small state: a 16-unit NVIL baseline, k = 4 for top-k sparsemax / unordered
    set (the defaults elsewhere)."""
    k = 4 if name in ("topk_sparsemax", "unordered_set") else None
    return build_method(name, latent, k=k, nvil_features=features, nvil_hidden=16, nvil_layers=1)


def _images(n: int, seed: int) -> Tensor:
    """``n`` random images [n, PIXELS] of LEVELS grey levels in [0, 1], drawn on the host."""
    levels = torch.randint(LEVELS, (n, PIXELS), generator=torch.Generator().manual_seed(seed))
    return levels / (LEVELS - 1)


def ssvae_step(name: str, device: torch.device, generator: torch.Generator) -> LvmStep:
    """M2 with a 16-unit classifier, inference and generative network and a 2-d h: an
    unlabelled and a labelled batch, binarised on the device."""
    torch.manual_seed(0)
    model = ssvae.SSVAE(PIXELS, CLASSES, latent_dim=2, classifier_hidden=(16,), hidden=(16,))
    model, method = model.to(device), _method(name, "categorical", PIXELS).to(device)
    unlabelled, labelled = _images(BATCH, 1).to(device), _images(BATCH, 2).to(device)
    labels = (torch.arange(BATCH) % CLASSES).to(device)

    def step_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        batch = (binarize(labelled, generator), labels)
        x = binarize(unlabelled, generator)
        return ssvae.loss(model, method, x, batch, step, generator=generator)

    return LvmStep(model, method, step_fn)


def signal_game_step(name: str, device: torch.device, generator: torch.Generator) -> LvmStep:
    """The game with a 16-unit sender, 8 symbols and 4 candidates: games drawn on the host (as
    the experiment does), moved to the device."""
    torch.manual_seed(0)
    model = signal_game.SignalGame(FEATURES, SYMBOLS, hidden=16, embedding=8).to(device)
    method_name, reward = signal_game.method_and_reward(name)
    method = _method(method_name, "categorical", FEATURES).to(device)
    host = torch.Generator().manual_seed(3)
    data = GameData(
        torch.randn(4 * CONCEPTS, FEATURES, generator=host),
        torch.arange(4 * CONCEPTS) % CONCEPTS,
        tuple(f"concept{c}" for c in range(CONCEPTS)),
    )
    drawn = signal_game.sample_games(data.features, data.concepts, BATCH, CANDIDATES, host)
    games = Games(drawn.candidates.to(device), drawn.target.to(device))

    def step_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        return signal_game.loss(model, method, games, step, reward=reward, generator=generator)

    return LvmStep(model, method, step_fn)


def bitvector_vae_step(name: str, device: torch.device, generator: torch.Generator) -> LvmStep:
    """D = 6 bits, a 16-unit encoder and decoder with a full linear head over 4 grey levels."""
    torch.manual_seed(0)
    model = bitvector_vae.BitVectorVAE(PIXELS, BITS, LEVELS, hidden=16).to(device)
    method = _method(name, "bits", PIXELS).to(device)
    x = quantize(_images(BATCH, 4), LEVELS).to(device)

    def step_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        return bitvector_vae.loss(model, method, x, step, generator)

    return LvmStep(model, method, step_fn)


LVM_EXPERIMENTS: dict[str, tuple[tuple[str, ...], Callable[..., LvmStep]]] = {
    "ssvae": (SsvaeSettings.KNOWN_METHODS, ssvae_step),
    "signal_game": (SignalGameSettings.KNOWN_METHODS, signal_game_step),
    "bitvector_vae": (BitVectorVaeSettings.KNOWN_METHODS, bitvector_vae_step),
}
LVM_CASES = [
    pytest.param(experiment, name, id=f"{experiment}-{name}")
    for experiment, (methods, _) in LVM_EXPERIMENTS.items()
    for name in methods
]


def _named_parameters(setup: LvmStep) -> list[tuple[str, nn.Parameter]]:
    """The model's parameters and the method's (the NVIL baseline network), by name."""
    named = list(setup.model.named_parameters())
    if setup.method.nvil_baseline is not None:
        named += [(f"nvil.{n}", p) for n, p in setup.method.nvil_baseline.named_parameters()]
    return named


@pytest.mark.parametrize(("experiment", "name"), LVM_CASES)
def test_latent_variable_step(device: torch.device, experiment: str, name: str) -> None:
    """One :func:`fit` step (Adam over the model and method parameters, as
    ``train_and_evaluate``) of ``experiment`` with method ``name``."""
    generator = torch.Generator(device=device).manual_seed(0)
    setup = LVM_EXPERIMENTS[experiment][1](name, device, generator)
    named = _named_parameters(setup)
    optimizer = torch.optim.Adam([p for _, p in named], lr=1e-2)
    before = _snapshot(named)
    losses: list[Tensor] = []

    def step_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        loss, metrics = setup.step_fn(step)
        losses.append(loss)
        return loss, dict(metrics)

    history = fit(step_fn, optimizer, 1, method=f"{experiment}/{name}", log_every=1)
    assert len(losses) == 1 and history.steps == [0]
    assert torch.isfinite(torch.tensor(history.records[0]["loss"])), history.records
    assert_trained(named, before, exempt=lambda _: False)
    assert_on_device(device, named, setup.model.named_buffers(), optimizer, [("loss", losses[0])])


# --------------------------------------------------------------------------- precision

# bf16 against float32 on one step: each bf16 rounding is off by at most u = 2⁻⁸ relative, and the
# gradient of a step meets about 32 of them in sequence (forward and backward through 4 blocks of
# attention and feed-forward matmuls), so the linear bound 32·u = 2⁻³ holds it. Measured on the
# CPU, gradients of the whole model in norm: NMT 2.5e-2 (softmax, α-entmax) to 5.7e-2 (top-k,
# whose cut moves); latent-variable steps 5.6e-3 (SSVAE dense) to 1.4e-2 (top-k sparsemax).
BF16_STEP_TOLERANCE = 2.0**-3


def _gradient(named: Iterable[tuple[str, nn.Parameter]]) -> Tensor:
    return torch.cat([p.grad.flatten().float() for _, p in named])


def _relative(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_nmt_step_in_bf16_matches_float32(device: torch.device, normalizer: str) -> None:
    """One ``train_step`` with ``precision="bf16"`` (no dropout: the same step as float32's):
    the logits are bf16, the loss, gradients and α float32 and finite, the gradient within
    :data:`BF16_STEP_TOLERANCE` of the float32 step's and not equal to it (autocast ran)."""
    examples = _copy_examples()
    gradients, logits = {}, {}
    outputs: list[Tensor] = []
    for precision in ("float32", "bf16"):
        model = tiny_model(normalizer, seed=0, dropout=0.0).to(device)
        batch = collate_examples(examples, range(len(examples)), model).to(device)
        optimizer, scheduler = build_optimizer(model, 1e-3, warmup=1)
        hook = model.register_forward_hook(lambda _module, _inputs, out: outputs.append(out))
        metrics = train_step(
            model, batch, optimizer, scheduler, 1.0, 0.1, step=1, variant=normalizer,
            precision=precision,
        )  # fmt: skip
        hook.remove()
        logits[precision] = outputs[-1]
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(a.dtype == torch.float32 for a in model.alphas().values())
        gradients[precision] = _gradient(model.named_parameters())
    assert logits["bf16"].dtype == torch.bfloat16 and logits["float32"].dtype == torch.float32
    assert bool(torch.isfinite(gradients["bf16"]).all())
    error = _relative(gradients["bf16"], gradients["float32"])
    assert 0 < error <= BF16_STEP_TOLERANCE, f"bf16 gradient off by {error:.2e}"


# Latent-variable methods whose step draws nothing that bf16 could change (exact
# marginalization, SparseMAP, top-k sparsemax).
DETERMINISTIC_LVM = [
    ("ssvae", "dense"),
    ("ssvae", "sparsemax"),
    ("signal_game", "sparsemax"),
    ("bitvector_vae", "sparsemap"),
    ("bitvector_vae", "topk_sparsemax"),
]


@pytest.mark.parametrize(("experiment", "name"), DETERMINISTIC_LVM)
def test_latent_variable_step_in_bf16_matches_float32(
    device: torch.device, experiment: str, name: str
) -> None:
    """One :func:`fit` step with ``precision="bf16"``: a float32 finite loss, gradients within
    :data:`BF16_STEP_TOLERANCE` of the float32 step's and not equal to them."""
    gradients = {}
    for precision in ("float32", "bf16"):
        generator = torch.Generator(device=device).manual_seed(0)
        setup = LVM_EXPERIMENTS[experiment][1](name, device, generator)
        named = _named_parameters(setup)
        optimizer = torch.optim.Adam([p for _, p in named], lr=1e-2)
        history = fit(setup.step_fn, optimizer, 1, method=name, precision=precision)
        assert math.isfinite(history.records[0]["loss"])
        gradients[precision] = _gradient(named)
    assert bool(torch.isfinite(gradients["bf16"]).all())
    error = _relative(gradients["bf16"], gradients["float32"])
    assert 0 < error <= BF16_STEP_TOLERANCE, f"bf16 gradient off by {error:.2e}"


def test_training_refuses_a_precision_the_device_cannot_run(tmp_path: Path) -> None:
    """TF32 on the CPU: the NMT loop names the setting before any step."""
    settings = TrainingSettings(
        max_steps=1, max_tokens=64, warmup=1, peak_lr=1e-3, precision="tf32"
    )
    with pytest.raises(SettingsError, match=r"^precision is 'tf32', which needs a CUDA device"):
        train(tiny_model("softmax"), _copy_examples(), _copy_examples(), settings,
              checkpoint_dir=tmp_path, variant="v")  # fmt: skip
    assert not list(tmp_path.iterdir())
