"""DVC stages ``train_lvm@<experiment>``: the latent-variable experiments of sparse marginalization.

``python -m pipelines.train_lvm <experiment>`` with experiment one of

* ``ssvae`` — semi-supervised VAE (M2): test accuracy of π(z|x), ELBO, decoder calls;
* ``signal_game`` — the signalling game: communication success on test games, decoder calls;
* ``bitvector_vae`` — bit-vector VAE for each D in ``bits``: test NLL in bits per dimension by
  importance sampling, decoder calls.

The grid (method × seed, × D for the bit-vector VAE) runs as Ray tasks; each cell is one MLflow
child run (step metrics, final metrics, curves). A finished cell is kept in
``models/lvm/<experiment>/<cell>/done.json`` with the fingerprint of its settings and data, so
changing one method's settings retrains only its cells.

Outputs: ``results/train_lvm/<experiment>.json`` (DVC metrics: per method, one metric dict per
seed, for the ``tables`` stage), ``results/train_lvm/plots/<experiment>/<cell>.csv`` (training
curves; DVC plots) and figures ``reports/figures/lvm/<experiment>/*.png`` (metric against
decoder calls; support size over training for the sparse methods).
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from components.data.atomic import atomic_write_bytes, atomic_write_text
from components.data.images import binarize, quantize
from components.errors import LearnableSparsityError
from components.lvm import bitvector_vae, signal_game, ssvae
from components.lvm.methods import METHODS, SPARSE_METHODS, Method, build_method
from components.lvm.training import History, StepFn, fit
from components.reporting.figures import metric_against_decoder_calls, support_over_training
from pipelines import tracking
from pipelines.images import OUT as IMAGES
from pipelines.images import load_game, load_images
from pipelines.io import code_digest, fingerprint, read_json, write_json
from pipelines.params import Params, load_params
from pipelines.runner import run_params_grid

EXPERIMENTS = ("ssvae", "signal_game", "bitvector_vae")
# The headline metric of each experiment: (key in the metric dict, label, higher is better).
HEADLINE = {
    "ssvae": ("accuracy", "test accuracy", True),
    "signal_game": ("communication_success", "communication success", True),
    "bitvector_vae": ("nll_bits_per_dim", "test NLL (bits/dim)", False),
}
# Signalling-game method names that fix the SFE reward (the thesis ran SFE with both).
GAME_REWARDS = {"sfe_nll": ("sfe", "nll"), "sfe_zero_one": ("sfe", "zero_one")}
# The code a trained cell depends on: a change retrains every cell.
LVM_CODE = (
    "components/core/normalizers.py",
    "components/core/marginalize.py",
    "components/core/sparsemap.py",
    "components/core/estimators.py",
    "components/lvm/__init__.py",
    "components/lvm/methods.py",
    "components/lvm/training.py",
    "components/lvm/ssvae.py",
    "components/lvm/signal_game.py",
    "components/lvm/bitvector_vae.py",
)
MODELS = Path("models/lvm")
RESULTS = Path("results/train_lvm")
FIGURES = Path("reports/figures/lvm")
DONE = "done.json"
LAST = "last.pt"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LvmCell:
    """One cell: ``method`` with ``seed`` (and ``bits`` = D for the bit-vector VAE)."""

    experiment: str
    method: str
    seed: int
    bits: int | None = None

    @property
    def key(self) -> str:
        prefix = "" if self.bits is None else f"D{self.bits}/"
        return f"{prefix}{self.method}/seed{self.seed}"


def _base_method(experiment: str, name: str) -> tuple[str, str]:
    """(core method name, reward) of a method named in params."""
    if experiment == "signal_game" and name in GAME_REWARDS:
        return GAME_REWARDS[name]
    return name, "nll"


def grid(params: Params, experiment: str) -> list[LvmCell]:
    """The cells of ``lvm.<experiment>``: methods × seeds (× bits), validated."""
    section = f"lvm.{experiment}"
    methods = params.get(f"{section}.methods", list)
    seeds = params.get(f"{section}.seeds", list)
    latent = "bits" if experiment == "bitvector_vae" else "categorical"
    for name in methods:
        base, _ = _base_method(experiment, name)
        if base not in METHODS[latent]:
            extra = GAME_REWARDS if experiment == "signal_game" else {}
            known = sorted({*METHODS[latent], *extra})
            raise LearnableSparsityError(
                f"{params.source}: {section}.methods has {name!r}; choose from {known}"
            )
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise LearnableSparsityError(f"{params.source}: {section}.seeds has {seed!r}")
    if not methods or not seeds:
        raise LearnableSparsityError(f"{params.source}: {section}.methods/seeds is empty")
    bits = params.get(f"{section}.bits", list) if experiment == "bitvector_vae" else [None]
    return [LvmCell(experiment, m, s, d) for d in bits for m in methods for s in seeds]


# Positive integers every experiment needs, and the per-method tables (a "default" entry plus
# per-method overrides), checked before any cell runs.
COUNTS = ("steps", "batch_size", "log_every", "checkpoint_every")
PER_METHOD = {"ssvae": ("lr",), "signal_game": ("lr", "entropy_coef"), "bitvector_vae": ("lr",)}


def check_settings(params: Params, experiment: str) -> None:
    """Raise naming the key of ``lvm.<experiment>`` that is missing or out of range."""
    section = f"lvm.{experiment}"
    for key in COUNTS:
        if params.get(f"{section}.{key}", int) < 1:
            raise LearnableSparsityError(f"{params.source}: {section}.{key} must be >= 1")
    for key in PER_METHOD[experiment]:
        table = params.get(f"{section}.{key}", dict)
        for name, value in table.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise LearnableSparsityError(
                    f"{params.source}: {section}.{key}.{name} is {value!r}, not a number >= 0"
                )
        params.get(f"{section}.{key}.default", (int, float))


def _batch(n: int, size: int, generator: torch.Generator) -> Tensor:
    return torch.randint(n, (size,), generator=generator)


# Each setup returns (model, method, step function, final evaluation).
Setup = tuple[torch.nn.Module, Method, StepFn, Callable[[], dict[str, float]]]


def _ssvae(settings: dict, cell: LvmCell, generator: torch.Generator) -> Setup:
    data = load_images(settings["data"])
    labelled, unlabelled = data.semi_supervised(settings["labelled_fraction"], cell.seed)
    model = ssvae.SSVAE(
        data.pixels,
        latent_dim=settings["latent_dim"],
        classifier_hidden=tuple(settings["classifier_hidden"]),
        hidden=tuple(settings["hidden"]),
    )
    method = build_method(
        cell.method, "categorical", gumbel_rate=settings["gumbel_rate"], nvil_features=data.pixels
    )
    size, pretrain = settings["batch_size"], settings["pretrain_steps"]

    def step_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        picked = _batch(len(labelled), size, generator)
        x_l = binarize(labelled.images[picked], generator)
        batch_labelled = (x_l, labelled.labels[picked])
        batch_unlabelled = None
        if step >= pretrain:  # pre-training: the labelled loss only (as in the thesis)
            x_u = unlabelled.images[_batch(len(unlabelled), size, generator)]
            batch_unlabelled = binarize(x_u, generator)
        return ssvae.loss(
            model,
            method,
            batch_unlabelled,
            batch_labelled,
            step,
            classifier_weight=settings["classifier_weight"],
            generator=generator,
        )

    def evaluate() -> dict[str, float]:
        fixed = torch.Generator().manual_seed(1234)
        x = binarize(data.test.images, fixed)
        with torch.no_grad():
            nelbo = -ssvae.elbo(model, method, x, fixed).mean()
        return {"accuracy": ssvae.accuracy(model, x, data.test.labels), "test_nelbo": float(nelbo)}

    return model, method, step_fn, evaluate


def _signal_game(settings: dict, cell: LvmCell, generator: torch.Generator) -> Setup:
    splits = load_game(settings["data"])
    features = splits.train.features.shape[1]
    model = signal_game.SignalGame(
        features,
        vocab_size=settings["vocab_size"],
        hidden=settings["hidden"],
        embedding=settings["embedding"],
    )
    base, reward = _base_method("signal_game", cell.method)
    method = build_method(
        base, "categorical", gumbel_rate=settings["gumbel_rate"], nvil_features=features
    )
    entropy_coef = settings["entropy_coef"].get(cell.method, settings["entropy_coef"]["default"])

    def step_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        games = signal_game.sample_games(
            splits.train.features,
            splits.train.concepts,
            settings["batch_size"],
            settings["candidates"],
            generator,
        )
        return signal_game.loss(
            model,
            method,
            games,
            step,
            entropy_coef=entropy_coef,
            reward=reward,
            generator=generator,
        )

    def evaluate() -> dict[str, float]:
        fixed = torch.Generator().manual_seed(1234)
        games = signal_game.sample_games(
            splits.test.features,
            splits.test.concepts,
            settings["test_games"],
            settings["candidates"],
            fixed,
        )
        return {"communication_success": signal_game.success(model, games)}

    return model, method, step_fn, evaluate


def _bitvector_vae(settings: dict, cell: LvmCell, generator: torch.Generator) -> Setup:
    data = load_images(settings["data"])
    train = quantize(data.train.images, data.levels)
    test = quantize(data.test.images[: settings["test_examples"]], data.levels)
    model = bitvector_vae.BitVectorVAE(
        data.pixels, cell.bits, data.levels, settings["hidden"], settings["rank"]
    )
    method = build_method(
        cell.method,
        "bits",
        k=settings["topk"],
        gumbel_rate=settings["gumbel_rate"],
        nvil_features=data.pixels,
    )

    def step_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        x = train[_batch(len(train), settings["batch_size"], generator)]
        return bitvector_vae.loss(model, method, x, step, generator)

    def evaluate() -> dict[str, float]:
        fixed = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            nll = bitvector_vae.nll_bits_per_dim(
                model, method, test, settings["importance_samples"], fixed
            )
        return {"nll_bits_per_dim": float(nll.mean()), "latent_dim": cell.bits}

    return model, method, step_fn, evaluate


SETUPS = {"ssvae": _ssvae, "signal_game": _signal_game, "bitvector_vae": _bitvector_vae}


def train_cell(task: dict) -> dict:
    """Ray task: train and evaluate one cell."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", force=True)
    cell, settings = LvmCell(**task["cell"]), task["settings"]
    torch.manual_seed(cell.seed)
    generator = torch.Generator().manual_seed(cell.seed)
    model, method, step_fn, evaluate = SETUPS[cell.experiment](settings, cell, generator)
    lr = settings["lr"].get(cell.method, settings["lr"]["default"])
    optimizer = torch.optim.Adam([*model.parameters(), *method.parameters()], lr=lr)
    name = f"{cell.experiment}/{cell.key}"
    checkpoint = MODELS / cell.experiment / cell.key / LAST
    step, history = 0, History()
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        if state["fingerprint"] == task["fingerprint"]:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            _load_method_state(method, state["method"])
            generator.set_state(state["generator"])
            torch.set_rng_state(state["rng"])
            step, history = state["step"], state["history"]
            log.info("%s: resuming from %s at step %d", name, checkpoint, step)
    with tracking.RunLogger(task["mlflow_uri"], task["run_id"]) as run:
        start, first = time.perf_counter(), step

        def on_log(at: int, metrics: dict[str, float]) -> None:
            run.log_metrics({tracking.metric_name(k): v for k, v in metrics.items()}, at)
            eta = (time.perf_counter() - start) / (at + 1 - first) * (settings["steps"] - at - 1)
            log.info(
                "%s: step %d/%d loss %.4f ETA %.0fs",
                name,
                at + 1,
                settings["steps"],
                metrics["loss"],
                eta,
            )

        while step < settings["steps"]:
            part = fit(
                step_fn,
                optimizer,
                min(settings["checkpoint_every"], settings["steps"] - step),
                method=name,
                log_every=settings["log_every"],
                on_log=on_log,
                start_step=step,
            )
            history.steps += part.steps
            history.records += part.records
            step = min(step + settings["checkpoint_every"], settings["steps"])
            state = {
                "fingerprint": task["fingerprint"],
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "method": _method_state(method),
                "generator": generator.get_state(),
                "rng": torch.get_rng_state(),
                "step": step,
                "history": history,
            }
            buffer = io.BytesIO()
            torch.save(state, buffer)
            atomic_write_bytes(checkpoint, buffer.getvalue())
        seconds = time.perf_counter() - start
        model.eval()
        metrics = evaluate()
        calls = history.series("decoder_calls")[1]
        metrics |= {
            "decoder_calls": statistics.fmean(calls),
            "train_seconds": seconds,
            "seconds_per_step": seconds / settings["steps"],
        }
        if history.series("support")[1]:
            metrics["support"] = statistics.fmean(history.series("support")[1])
        run.log_metrics({tracking.metric_name("final", k): v for k, v in metrics.items()}, 0)
    curves = {name: history.series(name) for name in ("loss", "decoder_calls", "support")}
    return {"key": cell.key, "metrics": metrics, "curves": curves}


def _method_state(method: Method) -> dict[str, Any]:
    """What a method learns or accumulates: the NVIL network, the SFE moving average."""
    state: dict[str, Any] = {}
    if method.nvil_baseline is not None:
        state["nvil_baseline"] = method.nvil_baseline.state_dict()
    if method.moving_average is not None:
        state["moving_average"] = (method.moving_average.mean, method.moving_average.count)
    return state


def _load_method_state(method: Method, state: dict[str, Any]) -> None:
    if method.nvil_baseline is not None:
        method.nvil_baseline.load_state_dict(state["nvil_baseline"])
    if method.moving_average is not None:
        method.moving_average.mean, method.moving_average.count = state["moving_average"]


def _curve_csv(curves: dict[str, tuple[list[int], list[float]]]) -> str:
    steps = curves["loss"][0]
    columns = {
        name: dict(zip(*series, strict=True)) for name, series in curves.items() if series[0]
    }
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", *columns])
    for step in steps:
        writer.writerow([step, *(values.get(step, "") for values in columns.values())])
    return out.getvalue()


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def main(experiment: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params()
    cells = grid(params, experiment)
    check_settings(params, experiment)
    settings = params.get(f"lvm.{experiment}", dict)
    data_meta = read_json(IMAGES / "meta.json")
    if settings["data"] not in data_meta:
        raise LearnableSparsityError(
            f"{params.source}: lvm.{experiment}.data is {settings['data']!r}, not one of the "
            f"datasets of the images stage ({sorted(data_meta)})"
        )
    data_digest = fingerprint(data_meta[settings["data"]])
    code = code_digest(LVM_CODE)
    uri = tracking.tracking_uri(Path.cwd())
    mlflow_experiment = params.get("mlflow.experiment", str)
    tracking.prepare(uri, mlflow_experiment)
    stage_name = f"train_lvm/{experiment}"
    with tracking.stage_run(uri, mlflow_experiment, stage_name, {"lvm": settings}) as stage:
        tasks, reused = [], []
        for cell in cells:
            digest = fingerprint(settings, asdict(cell), data_digest, code)
            done = MODELS / experiment / cell.key / DONE
            if done.exists() and read_json(done)["fingerprint"] == digest:
                reused.append(read_json(done)["result"])
                continue
            tasks.append(
                {
                    "cell": asdict(cell),
                    "settings": settings,
                    "fingerprint": digest,
                    "mlflow_uri": uri,
                    "run_id": stage.child(cell.key, {"cell": asdict(cell), **settings}),
                }
            )
        log.info("%s: %d cells to train, %d reused", experiment, len(tasks), len(reused))
        trained = run_params_grid(train_cell, tasks, params, stage_name)
        for task, result in zip(tasks, trained, strict=True):
            write_json(
                MODELS / experiment / result["key"] / DONE,
                {"fingerprint": task["fingerprint"], "result": result},
            )
        by_key = {r["key"]: r for r in [*reused, *trained]}
        results = [by_key[cell.key] for cell in cells]
        shutil.rmtree(RESULTS / "plots" / experiment, ignore_errors=True)
        shutil.rmtree(FIGURES / experiment, ignore_errors=True)
        methods: dict[str, list[dict]] = {}
        for cell, result in zip(cells, results, strict=True):
            methods.setdefault(cell.method, []).append(result["metrics"])
            flat = cell.key.replace("/", "_")
            curve = _curve_csv(result["curves"])
            atomic_write_text(RESULTS / "plots" / experiment / f"{flat}.csv", curve)
        summary = {
            "experiment": experiment,
            "data": settings["data"],
            "profile": params.get("profile", str),
            "methods": methods,
        }
        write_json(RESULTS / f"{experiment}.json", summary)
        key, label, _ = HEADLINE[experiment]
        groups = sorted({cell.bits for cell in cells}, key=lambda b: b or 0)
        for bits in groups:
            suffix = "" if bits is None else f"_D{bits}"
            chosen = [(c, r) for c, r in zip(cells, results, strict=True) if c.bits == bits]
            points = {
                c.method: (
                    [r["metrics"]["decoder_calls"] for d, r in chosen if d.method == c.method],
                    [r["metrics"][key] for d, r in chosen if d.method == c.method],
                )
                for c, _ in chosen
            }
            figure = metric_against_decoder_calls(points, label)
            path = FIGURES / experiment / f"decoder_calls{suffix}.png"
            atomic_write_bytes(path, _png(figure))
            stage.log_artifact(path, "figures")
            support = {
                c.method: r["curves"]["support"]
                for c, r in chosen
                if c.method in SPARSE_METHODS and c.seed == cells[0].seed
            }
            if support:
                path = FIGURES / experiment / f"support{suffix}.png"
                atomic_write_bytes(path, _png(support_over_training(support)))
                stage.log_artifact(path, "figures")
        stage.log_artifact(RESULTS / f"{experiment}.json")
        stage.set_tags({"cells_trained": str(len(tasks)), "cells_reused": str(len(reused))})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=EXPERIMENTS)
    main(parser.parse_args().experiment)
