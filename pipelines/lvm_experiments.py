"""The latent-variable experiments, one record each: what every stage needs to know about one.

Stage ``train_lvm@<name>`` trains the record's task (its settings class, with the headline metric
``HEADLINE``, and its ``setup``) on params ``lvm.<name>``; the claims stage reads the results of
every record and ``claims.yaml`` names records by their key; the tables stage prints each
record's table beside the thesis'. ``dvc.yaml``'s ``foreach`` of ``train_lvm`` and the sections of
``params.yaml`` under ``lvm`` hold these keys (``tests/pipelines/test_experiments.py``). Adding
an experiment: ``docs/adding-an-experiment.md``.

The task is imported only when the training stage asks for it (``LvmExperiment.task()``): it
needs torch, and the claims and tables stages, which read the rest of the record, do not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from learnable_sparsity.reporting.lvm_tables import LvmMetric, LvmTableSpec

if TYPE_CHECKING:
    from learnable_sparsity.lvm.settings import LvmSettings


class LvmTask(NamedTuple):
    """An experiment's code: its settings class (params ``lvm.<name>``) and its ``setup``
    (:data:`learnable_sparsity.lvm.training.SetupFn`)."""

    settings: type[LvmSettings]
    setup: Callable[..., Any]


@dataclass(frozen=True)
class LvmExperiment:
    """One latent-variable experiment: its key (the ``foreach`` item of ``train_lvm``, the
    section of ``lvm`` in the params, the name of its results), the task that trains it, the kind
    of images-stage data set it reads (``images`` or ``game``) and its table beside the thesis'."""

    name: str
    task: Callable[[], LvmTask]  # imports the experiment's module (and torch) when called
    data: Literal["images", "game"]
    table: LvmTableSpec


def _ssvae() -> LvmTask:
    from learnable_sparsity.lvm import ssvae

    return LvmTask(ssvae.SsvaeSettings, ssvae.setup)


def _signal_game() -> LvmTask:
    from learnable_sparsity.lvm import signal_game

    return LvmTask(signal_game.SignalGameSettings, signal_game.setup)


def _bitvector_vae() -> LvmTask:
    from learnable_sparsity.lvm import bitvector_vae

    return LvmTask(bitvector_vae.BitVectorVaeSettings, bitvector_vae.setup)


# Row labels the thesis' tables share.
_MC_SYSTEMS = {
    "sfe": "SFE",
    "sfe_plus": "SFE+",
    "nvil": "NVIL",
    "gumbel": "Gumbel",
    "st_gumbel": "ST Gumbel",
}
_MARGINALIZATION = {
    "dense": "Dense (softmax, exact marginalization)",
    "sparsemax": "Sparse (sparsemax, proposed)",
}
_UNORDERED_SET = {"unordered_set": "Unordered set (Kool et al., 2020)"}
_CALLS = "decoder_calls"

LVM: dict[str, LvmExperiment] = {
    experiment.name: experiment
    for experiment in (
        LvmExperiment(
            "ssvae",
            _ssvae,
            "images",
            LvmTableSpec(
                "marg_ssvae_mnist",
                "Semi-supervised VAE on MNIST (thesis Table 5.1)",
                "mnist",
                {
                    **{k: _MC_SYSTEMS[k] for k in ("sfe", "sfe_plus", "nvil")},
                    "sum_and_sample": "Sum&Sample",
                    **{k: _MC_SYSTEMS[k] for k in ("gumbel", "st_gumbel")},
                    **_MARGINALIZATION,
                },
                _UNORDERED_SET,
                (
                    LvmMetric("accuracy", "accuracy (%)", True, "accuracy", "accuracy_se"),
                    LvmMetric(_CALLS, "decoder calls", False, _CALLS, "decoder_calls_se"),
                ),
            ),
        ),
        LvmExperiment(
            "signal_game",
            _signal_game,
            "game",
            LvmTableSpec(
                "marg_signal_game",
                "Emergent communication game (thesis Table 5.2)",
                "egg_imagenet",
                {
                    "sfe_nll": "SFE (NLL)",
                    "sfe_zero_one": "SFE (0/1)",
                    "sfe_plus": "SFE+ (0/1)",
                    **{k: _MC_SYSTEMS[k] for k in ("nvil", "gumbel", "st_gumbel")},
                    **_MARGINALIZATION,
                },
                {"sum_and_sample": "Sum&Sample", **_UNORDERED_SET},
                (
                    LvmMetric(
                        "communication_success",
                        "communication success (%)",
                        True,
                        "communication_success",
                        "communication_success_pm",
                    ),
                    LvmMetric(_CALLS, "decoder calls", False, _CALLS, "decoder_calls_pm"),
                ),
            ),
        ),
        LvmExperiment(
            "bitvector_vae",
            _bitvector_vae,
            "images",
            LvmTableSpec(
                "marg_bitvector_vae_fmnist",
                "Bit-vector VAE on Fashion-MNIST (thesis Table 5.3)",
                "fashion_mnist",
                {
                    **_MC_SYSTEMS,
                    "topk_sparsemax": "Top-k sparsemax",
                    "sparsemap": "SparseMAP",
                    "sparsemap_budget": "SparseMAP (w/ budget)",
                },
                {},
                (
                    LvmMetric("nll_bits_per_dim", "NLL bits/dim", False, "nll_bits_per_dim"),
                    LvmMetric(_CALLS, "decoder calls", False, None),
                ),
                per_latent_dim=True,
            ),
        ),
    )
}
