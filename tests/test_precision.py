"""``learnable_sparsity.precision``: the precision settings, their checks against the device, and
the TF32 mode and autocast they switch on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.lvm.ssvae import SsvaeSettings
from learnable_sparsity.nmt.grid import NmtSettings
from learnable_sparsity.precision import autocast, check_precision, matmul_precision
from learnable_sparsity.settings import SettingsError
from pipelines.scaffold.params import Params, deep_merge, load_params
from pipelines.scaffold.stage import Stage
from pipelines.scaffold.tracking.runs import flatten_params
from pipelines.stages.nmt import train_nmt

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.device("cuda")


def params_with(change: dict) -> Params:
    """The committed params with ``change`` merged in."""
    smoke = load_params(ROOT / "params.yaml")
    return Params(deep_merge(smoke.data, change), smoke.source)


def test_unknown_precisions_are_refused_naming_the_key() -> None:
    with pytest.raises(
        LearnableSparsityError,
        match=r"params\.yaml: nmt\.train\.precision must be one of 'float32', 'tf32', 'bf16', "
        r"got 'fp16'",
    ):
        params_with({"nmt": {"train": {"precision": "fp16"}}}).settings("nmt", NmtSettings)
    with pytest.raises(LearnableSparsityError, match=r"lvm\.ssvae\.precision must be one of"):
        params_with({"lvm": {"ssvae": {"precision": "half"}}}).settings("lvm.ssvae", SsvaeSettings)
    with pytest.raises(SettingsError, match=r"precision is 'fp16', which is not one of"):
        check_precision("fp16", "cpu")


def test_precisions_the_device_cannot_run_are_refused_naming_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TF32 on a CPU; bf16 on a GPU without it (a V100, compute capability 7.0)."""
    check_precision("bf16", "cpu")
    check_precision("float32", "cpu")
    with pytest.raises(
        SettingsError, match=r"^nmt\.train\.precision is 'tf32', which needs a CUDA"
    ):
        check_precision("tf32", "cpu", "nmt.train.precision")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Tesla V100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (7, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation: False)
    with pytest.raises(SettingsError, match=r"^ape\.train\.precision is 'bf16', which needs bf16"):
        check_precision("bf16", CUDA, "ape.train.precision")
    with pytest.raises(SettingsError, match=r"is 'tf32', which needs TF32 .* Tesla V100 lacks"):
        check_precision("tf32", CUDA)


@pytest.mark.parametrize("precision", ["float32", "tf32", "bf16"])
def test_tf32_is_on_for_the_block_only_and_only_on_cuda(precision: str) -> None:
    """The flags are the process's: set inside the block on a CUDA device (the flags exist
    without a GPU), restored after it, even after an error; untouched for a CPU run."""
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn)
    before = [flag.allow_tf32 for flag in flags]
    with pytest.raises(KeyError), matmul_precision(precision, CUDA):
        assert [flag.allow_tf32 for flag in flags] == [precision == "tf32"] * 2
        raise KeyError
    assert [flag.allow_tf32 for flag in flags] == before
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with matmul_precision(precision, torch.device("cpu")):
            assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before[0]


@pytest.mark.parametrize("precision", ["float32", "tf32", "bf16"])
def test_only_bf16_autocasts(precision: str) -> None:
    x = torch.ones(2, 2)
    with autocast(precision, torch.device("cpu")):
        assert (x @ x).dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)


def test_the_precision_reaches_the_mlflow_params_of_stage_and_cells() -> None:
    """The stage's parent run logs the sections it read, each cell's run its payload: both hold
    the precision (as ``nmt.train.precision`` and ``train.precision``)."""
    stage = Stage("train_nmt", params_with({"nmt": {"train": {"precision": "bf16"}}}), "")
    cells = train_nmt.grid(stage).cells
    assert flatten_params(cells[0].payload)["train.precision"] == "bf16"
    read = flatten_params({"nmt": stage._read["nmt"]})
    assert read["nmt.train.precision"] == "bf16"
