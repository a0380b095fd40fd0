"""DVC stages ``train_lvm@<experiment>``: the latent-variable experiments of sparse marginalization.

``python -m pipelines.train_lvm <experiment>`` with experiment one of ``ssvae`` (semi-supervised
VAE: test accuracy), ``signal_game`` (communication success) or ``bitvector_vae`` (test NLL in
bits per dimension, for each D in ``bits``); see ``components.lvm``. The grid (method × seed, × D)
runs as Ray tasks; each cell is one MLflow child run and keeps its checkpoints in
``models/lvm/<experiment>/<cell>/`` (resumed after an interruption). A cell is fingerprinted with
the settings of its own run only, so changing one method's learning rate retrains its cells only.

Outputs: ``results/train_lvm/<experiment>.json`` (DVC metrics: per method, one metric dict per
seed), ``results/train_lvm/plots/<experiment>/<cell>.csv`` (training curves; DVC plots) and
``reports/figures/lvm/<experiment>/*.png`` (metric against decoder calls; support over training).
"""

from __future__ import annotations

import argparse
import csv
import io
from dataclasses import asdict

from components.checkpoints import LAST
from components.data.datasets import load_game, load_images
from components.errors import LearnableSparsityError
from components.lvm import bitvector_vae, signal_game, ssvae
from components.lvm.methods import SPARSE_METHODS
from components.lvm.training import Cell as LvmCell
from components.lvm.training import train_and_evaluate
from components.reporting.figures import experiment_figures
from components.settings import build, params_of
from pipelines.scaffold import layout
from pipelines.scaffold.stage import Cell, CellRun, Stage, clear, read_json, run_stage

# experiment → (its module with its setup, its settings class, the kind of data it reads)
EXPERIMENTS = {
    "ssvae": (ssvae, ssvae.SsvaeSettings, "images"),
    "signal_game": (signal_game, signal_game.SignalGameSettings, "game"),
    "bitvector_vae": (bitvector_vae, bitvector_vae.BitVectorVaeSettings, "images"),
}
LOADERS = {"images": load_images, "game": load_game}
RESULTS = layout.results("train_lvm")


def train_cell(run: CellRun) -> dict:
    """Ray task: train and evaluate one cell."""
    experiment = run.payload["experiment"]
    module, settings_class, kind = EXPERIMENTS[experiment]
    settings = build(settings_class, run.payload["settings"], f"lvm.{experiment}")
    cell = LvmCell(**run.payload["cell"])
    result = train_and_evaluate(
        module.setup,
        settings,
        LOADERS[kind](layout.image_data(settings.data)),
        cell,
        run.directory,
        name=f"{experiment}/{cell.key}",
        on_log=lambda step, metrics: run.log_metrics(metrics, step),
        before_checkpoint=run.flush,
    )
    run.log_metrics({f"final/{k}": v for k, v in result.metrics.items()}, step=0)
    run.run.log_artifact(run.directory / LAST, "checkpoint")
    return {"metrics": result.metrics, "curves": result.curves}


def curves_csv(curves: dict[str, list[list]]) -> str:
    """step, then one column per recorded curve (loss, decoder calls, support)."""
    columns = {
        name: dict(zip(*series, strict=True)) for name, series in curves.items() if series[0]
    }
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", *columns])
    for step in curves["loss"][0]:
        writer.writerow([step, *(values.get(step, "") for values in columns.values())])
    return out.getvalue()


def main(stage: Stage, experiment: str) -> None:
    _, settings_class, kind = EXPERIMENTS[experiment]
    settings = stage.settings(f"lvm.{experiment}", settings_class)
    datasets = read_json(layout.IMAGES / "meta.json")
    if datasets.get(settings.data, {}).get("kind") != kind:
        raise LearnableSparsityError(
            f"{stage.params.source}: lvm.{experiment}.data is {settings.data!r}, which is not one "
            f"of the {kind} datasets of the images stage ({sorted(datasets)})"
        )
    grid = settings.cells()
    cells = [
        Cell(
            cell.key,
            {
                "experiment": experiment,
                "cell": asdict(cell),
                "settings": params_of(settings.for_cell(cell)),
            },
            inputs=(layout.image_data(settings.data),),
            data=(layout.image_data(settings.data),),
        )
        for cell in grid
    ]
    results = stage.grid(train_cell, cells, store=layout.LVM_MODELS / experiment)
    clear(RESULTS / "plots" / experiment)
    clear(layout.figures("lvm") / experiment)
    methods: dict[str, list[dict]] = {}
    for cell, result in zip(grid, results, strict=True):
        methods.setdefault(cell.method, []).append(result["metrics"])
        name = f"{cell.key.replace('/', '_')}.csv"
        stage.write_text(RESULTS / "plots" / experiment / name, curves_csv(result["curves"]))
    summary = {"experiment": experiment, "data": settings.data, "profile": stage.profile}
    stage.write_json(RESULTS / f"{experiment}.json", {**summary, "methods": methods}, artifact="")
    runs = [{**asdict(c), **r} for c, r in zip(grid, results, strict=True)]
    metric, label = settings_class.HEADLINE
    for name, figure in experiment_figures(runs, metric, label, SPARSE_METHODS).items():
        path = layout.figures("lvm") / experiment / f"{name}.png"
        stage.write_png(path, figure, artifact="figures")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS))
    parser.add_argument("--verbose", action="store_true", help="tracebacks of errors")
    chosen = parser.parse_args().experiment
    run_stage(f"train_lvm/{chosen}", lambda stage: main(stage, chosen))
