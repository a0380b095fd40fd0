"""What one NMT update costs the host, counted on the CPU: the optimizer's operations (each one
a kernel launch on a GPU) and the reads that make the host wait for the device (host syncs).

On a GPU the Transformer-base step is host-bound: the per-tensor Adam loop launches about ten
kernels per parameter tensor, and every read of a device value (``.item()``, ``bool(t)``,
``.tolist()``, a shape that depends on the data) stalls the host until the device's queue
drains. The CPU has neither cost, so both are counted here by what would incur them:

- operations: every aten operation dispatched during ``optimizer.step()``
  (``TorchDispatchMode``), except the reads of Adam's step counts, which torch keeps in host
  memory for the foreach implementation (no kernel, no sync; the fused one reads none);
- syncs: every dispatched read of a value (``aten._local_scalar_dense``: ``item``, ``float``,
  ``int``, ``bool``), every operation whose output size depends on the data (``nonzero``,
  boolean indexing, ...), and every ``tolist``/``numpy``/``cpu`` call; the CPU run takes the
  device's code path (:func:`~learnable_sparsity.nmt.training.reads_are_free` patched).
"""

from __future__ import annotations

import importlib
import random
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from learnable_sparsity.nmt import training
from learnable_sparsity.nmt.batching import Batch, collate
from learnable_sparsity.nmt.model import Transformer
from tests.tiny_transformer import PAD, tiny_model

aten = torch.ops.aten
ADAM = importlib.import_module("torch.optim.adam")  # the package's name is the class's
BOS, EOS = 2, 3  # the tiny vocabulary's (tests/nmt/test_nmt_training.py)

# Operations whose output size is read from the data (a sync on a GPU).
DATA_DEPENDENT_SHAPES = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
}

# Python-level reads of a tensor's values that do not dispatch an operation on the CPU.
READ_METHODS = ("tolist", "numpy", "cpu", "__array__")


class StepCost(TorchDispatchMode):
    """Counts the dispatched aten operations and the host syncs among them (module docstring);
    ``host_resident``: tensors whose reads are host reads wherever the parameters are."""

    def __init__(self, host_resident: set[int]) -> None:
        super().__init__()
        self.host_resident = host_resident
        self.operations = 0
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            if id(args[0]) not in self.host_resident:
                self.syncs.append(f"read of a value {_caller()}")
                self.operations += 1
        else:
            self.operations += 1
            boolean_index = func is aten.index.Tensor and any(
                index is not None and index.dtype == torch.bool for index in args[1]
            )
            if func in DATA_DEPENDENT_SHAPES or boolean_index:
                self.syncs.append(f"{func}, sized by the data, {_caller()}")
        return func(*args, **kwargs)


def _caller() -> str:
    """Where the project's code (or torch's autograd, at a backward) asked for the read."""
    for frame in traceback.extract_stack()[::-1]:
        if "/learnable_sparsity/" in frame.filename or "/torch/autograd/" in frame.filename:
            return f"at {Path(frame.filename).name}:{frame.lineno}"
    return "outside the project"


@contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[StepCost]:
    """A :class:`StepCost` over the block, the CPU taking the device's code path; the step
    counts that Adam reads (through torch's ``_get_value``) count as host memory."""
    cost = StepCost(set())
    get_value = ADAM._get_value

    def host_read(step):
        cost.host_resident.add(id(step))
        return get_value(step)

    with monkeypatch.context() as patch:
        patch.setattr(training, "reads_are_free", lambda device: False, raising=False)
        patch.setattr(ADAM, "_get_value", host_read)
        for name in READ_METHODS:
            patch.setattr(torch.Tensor, name, _counted(getattr(torch.Tensor, name), name, cost))
        with cost:
            yield cost


def _counted(method: Callable, name: str, cost: StepCost) -> Callable:
    def read(*args, **kwargs):
        cost.syncs.append(f"Tensor.{name} {_caller()}")
        return method(*args, **kwargs)

    return read


def _batch(seed: int, n: int = 16) -> Batch:
    """A copy task batch: sentences of 2-6 ids from 4..19, target = source."""
    rng = random.Random(seed)
    sentences = [[rng.randrange(4, 20) for _ in range(rng.randrange(2, 7))] for _ in range(n)]
    return collate(sentences, sentences, pad_id=PAD, bos_id=BOS, eos_id=EOS)


def _model(layers: int, normalizer: str = "entmax_alpha") -> Transformer:
    return tiny_model(normalizer, enc_layers=layers, dec_layers=layers, training=True)


def _optimizer_operations(model: Transformer) -> int:
    """The operations of the library's Adam step on ``model`` (state initialised beforehand:
    the first step also allocates it)."""
    optimizer, _ = training.build_optimizer(model, 1e-3, warmup=4, weight_decay=0.01)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    steps = {id(state["step"]) for state in optimizer.state.values()}
    with StepCost(steps) as cost:
        optimizer.step()
    return cost.operations


def test_the_optimizer_step_costs_the_same_for_any_number_of_parameter_tensors() -> None:
    """The Adam step launches a fixed number of operations per parameter group, however many
    tensors the group holds: the per-tensor loop (≈ 10 per tensor) is gone."""
    small, large = _model(1), _model(3)
    tensors = (len(list(small.parameters())), len(list(large.parameters())))
    assert tensors[1] > tensors[0] + 20
    operations = (_optimizer_operations(small), _optimizer_operations(large))
    assert operations[0] == operations[1], (tensors, operations)
    assert operations[1] < tensors[0], (tensors, operations)


# The normalizers whose CPU code is their GPU code. The CPU solvers of the entmax family stop
# their bisections when every row has converged, a read per iteration; on a GPU the Triton
# kernels (learnable_sparsity.core.fused_triton) solve them without one.
SAME_ON_THE_HOST = ["softmax", "topk"]


@pytest.mark.parametrize("normalizer", SAME_ON_THE_HOST)
def test_an_update_reads_nothing_back_from_the_device(
    monkeypatch: pytest.MonkeyPatch, normalizer: str
) -> None:
    """The loop's update (:func:`~learnable_sparsity.nmt.training.update`: forward, loss,
    backward, clipping, Adam, schedule) has no host sync; the counter sees the checked one."""
    model = _model(2, normalizer)
    optimizer, scheduler = training.build_optimizer(model, 1e-3, warmup=4)
    settings = {"clip_norm": 1.0, "label_smoothing": 0.1, "precision": "float32"}
    training.update(model, [_batch(0), _batch(1)], optimizer, scheduler, **settings)
    with counting(monkeypatch) as cost:
        update = training.update(model, [_batch(2), _batch(3)], optimizer, scheduler, **settings)
    assert cost.syncs == []
    with counting(monkeypatch) as cost:  # the counter sees the one read of a window
        (metrics,) = training.read_updates([update], 2, "v")
    assert len(cost.syncs) == 1 and cost.syncs[0].startswith("Tensor.tolist at training.py")
    assert metrics["tokens"] > 0
    with counting(monkeypatch) as cost:  # and the eager step's checks
        training.train_step(model, _batch(4), optimizer, scheduler, 1.0, 0.1, step=3, variant="v")
    assert cost.syncs


def _train_syncs(monkeypatch: pytest.MonkeyPatch, steps: int, tmp_path: Path) -> list[str]:
    """The syncs of a whole run of ``steps`` updates that logs, validates and checkpoints only
    at its end."""
    rng = random.Random(0)
    examples = [
        (s, s[::-1])
        for s in ([rng.randrange(4, 20) for _ in range(rng.randrange(2, 8))] for _ in range(60))
    ]
    settings = training.TrainingSettings(
        max_steps=steps,
        max_tokens=60,
        warmup=2,
        peak_lr=3e-3,
        log_every=100,
        validate_every=100,
        checkpoint_every=100,
        seed=1,
    )
    model = _model(1, "softmax")
    with counting(monkeypatch) as cost:
        training.train(
            model, examples, examples[:8], settings, checkpoint_dir=tmp_path, variant="v"
        )
    return cost.syncs


def test_steps_between_logs_add_no_host_sync(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A run of 5 updates syncs exactly as often as a run of 2: only the final log, validation
    and checkpoint read from the device, never an update between them."""
    two = _train_syncs(monkeypatch, 2, tmp_path / "two")
    five = _train_syncs(monkeypatch, 5, tmp_path / "five")
    assert two, "the counter sees the log, validation and checkpoint reads"
    assert len(five) == len(two), (sorted(set(five) - set(two)), len(five), len(two))


def test_the_multi_tensor_adam_takes_the_per_tensor_step() -> None:
    """Three updates with the library's Adam leave the parameters and moments bit for bit where
    torch's per-tensor loop (the implementation before) leaves them; a checkpoint of either
    resumes under the library's implementation."""
    runs = []
    for per_tensor in (False, True):
        model = _model(2, "entmax_alpha")
        optimizer, scheduler = training.build_optimizer(model, 1e-2, warmup=2, weight_decay=0.1)
        if per_tensor:
            for group in optimizer.param_groups:
                group["foreach"], group["fused"] = False, False
        for step in range(3):
            training.train_step(
                model, _batch(step), optimizer, scheduler, 1.0, 0.1, step=step, variant="v"
            )
        runs.append((model, optimizer))
    (model, optimizer), (reference, per_tensor) = runs
    assert optimizer.param_groups[0]["foreach"] and not per_tensor.param_groups[0]["foreach"]
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q), name
    for state, expected in zip(optimizer.state.values(), per_tensor.state.values(), strict=True):
        assert all(torch.equal(state[key], expected[key]) for key in expected)
    fresh, _ = training.build_optimizer(_model(2, "entmax_alpha"), 1e-2, warmup=2)
    training.load_optimizer_state(fresh, per_tensor.state_dict())
    assert [g["foreach"] for g in fresh.param_groups] == [True] * len(fresh.param_groups)
    for state, expected in zip(fresh.state.values(), per_tensor.state.values(), strict=True):
        assert all(torch.equal(state[key], expected[key]) for key in expected)
