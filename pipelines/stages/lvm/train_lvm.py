"""DVC stages ``train_lvm@<experiment>``: the latent-variable experiments of sparse marginalization.

``python -m pipelines.stages.lvm.train_lvm <experiment>`` with experiment one of ``ssvae``
(semi-supervised VAE: test accuracy), ``signal_game`` (communication success) or ``bitvector_vae``
(test NLL in bits per dimension, for each D in ``bits``); see ``learnable_sparsity.lvm``. The grid
(method × seed, × D) runs as Ray tasks; each cell is one MLflow child run and keeps its checkpoints
in ``models/lvm/<experiment>/<cell>/`` (resumed after an interruption). A cell is fingerprinted with
the settings of its own run only, so changing one method's learning rate retrains its cells only.

Outputs: ``results/train_lvm/<experiment>.json`` (per method, one metric dict per seed; the
claims and tables stages read it), ``results/train_lvm/<experiment>/metrics.json`` (DVC metrics:
per method the test metric, mean and every seed, and the mean decoder calls and NELBO), the long
CSVs of its DVC plots in ``results/train_lvm/<experiment>/``: ``loss.csv`` and ``calls.csv``
(training loss and decoder calls per example of every cell over training: the claims read both)
and ``runs.csv`` (test metric and decoder calls of every cell), and
``reports/figures/lvm/<experiment>/*.png`` (metric against decoder calls; support over training).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from learnable_sparsity.checkpoints import LAST
from learnable_sparsity.data.datasets import load_game, load_images
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.lvm.methods import SPARSE_METHODS
from learnable_sparsity.lvm.settings import LvmCell
from learnable_sparsity.lvm.training import train_and_evaluate
from learnable_sparsity.precision import check_precision
from learnable_sparsity.reporting.figures import experiment_figures
from learnable_sparsity.settings import build, params_of
from pipelines.lvm_experiments import LVM
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, Grid, GridCell
from pipelines.scaffold.files import clear, read_json
from pipelines.scaffold.metrics import cell_metrics, split_seed
from pipelines.scaffold.plots import RUN, SERIES, curve_rows, long_csv
from pipelines.scaffold.stage import Stage, run_stage

LOADERS = {"images": load_images, "game": load_game}
# Averaged over seeds in the DVC metrics beside each experiment's headline test metric.
SUPPORTING_METRICS = ("decoder_calls", "test_nelbo")


def train_cell(run: CellRun) -> dict:
    """Ray task: train and evaluate one cell."""
    experiment = LVM[run.payload["experiment"]]
    task = experiment.task()
    settings = build(task.settings, run.payload["settings"], f"lvm.{experiment.name}")
    check_precision(settings.precision, run.device, f"lvm.{experiment.name}.precision")
    cell = LvmCell(**run.payload["cell"])
    result = train_and_evaluate(
        task.setup,
        settings,
        LOADERS[experiment.data](layout.image_data(settings.data)),
        cell,
        run.directory,
        name=f"{experiment.name}/{cell.key}",
        on_log=lambda step, metrics: run.log_metrics(metrics, step),
        before_checkpoint=run.flush,
        device=run.device,
    )
    run.log_metrics({f"final/{k}": v for k, v in result.metrics.items()}, step=0)
    run.run.log_artifact(run.directory / LAST, "checkpoint")
    return {"metrics": result.metrics, "curves": result.curves}


def lvm_metrics(results: dict[str, dict], headline: str) -> dict:
    """Per method (``D<bits>/<method>`` for the bit-vector VAE) the ``headline`` test metric,
    the mean and every seed, and the mean of each supporting metric the experiment reports."""
    names = (headline, *SUPPORTING_METRICS)
    values = {
        key: {name: result["metrics"][name] for name in names if name in result["metrics"]}
        for key, result in results.items()
    }
    return cell_metrics(values, per_seed=(headline,))


def curve_csv(results: dict[str, dict], curve: str) -> str:
    """A long CSV (step, series: the method, run: the cell, ``curve``) of one training curve of
    every cell (``loss``, ``decoder_calls``); a cell that did not record it adds no rows."""
    rows = [
        row
        for key, result in results.items()
        for row in curve_rows(zip(*result["curves"][curve], strict=True), curve, key)
    ]
    return long_csv(rows, ("step", SERIES, RUN, curve))


def runs_csv(results: dict[str, dict], headline: str) -> str:
    """A long CSV (series: the method, run: the cell, decoder_calls, ``headline``) of the test
    results of every cell."""
    columns = ("decoder_calls", headline)
    rows = [
        {SERIES: split_seed(key)[0], RUN: key, **{n: result["metrics"][n] for n in columns}}
        for key, result in results.items()
    ]
    return long_csv(rows, (SERIES, RUN, *columns))


def grid(stage: Stage, experiment: str) -> Grid:
    """The grid of ``experiment``: a model per cell, its checkpoints in
    ``models/lvm/<experiment>/<cell>``."""
    kind = LVM[experiment].data
    settings = stage.settings(f"lvm.{experiment}", LVM[experiment].task().settings)
    datasets = read_json(layout.IMAGES / "meta.json")
    if datasets.get(settings.data, {}).get("kind") != kind:
        raise LearnableSparsityError(
            f"{stage.params.source}: lvm.{experiment}.data is {settings.data!r}, which is not one "
            f"of the {kind} datasets of the images stage ({sorted(datasets)})"
        )
    cells = [
        GridCell(
            cell.key,
            {
                "experiment": experiment,
                "cell": asdict(cell),
                "settings": params_of(settings.for_cell(cell)),
            },
            inputs=(layout.image_data(settings.data),),
            data=(layout.image_data(settings.data),),
        )
        for cell in settings.cells()
    ]
    return Grid(train_cell, cells, layout.LVM_MODELS / experiment)


def main(stage: Stage, experiment: str) -> None:
    settings_class = LVM[experiment].task().settings
    settings = stage.settings(f"lvm.{experiment}", settings_class)
    grid_cells = settings.cells()
    by_key = stage.run_grid(grid(stage, experiment))
    clear(layout.figures("lvm") / experiment)
    methods: dict[str, list[dict]] = {}
    for cell in grid_cells:
        methods.setdefault(cell.method, []).append(by_key[cell.key]["metrics"])
    summary = {"experiment": experiment, "data": settings.data, "profile": stage.profile}
    stage.write_json(layout.lvm_results(experiment), {**summary, "methods": methods}, artifact="")
    metric, label = settings_class.HEADLINE
    stage.write_metrics(lvm_metrics(by_key, metric))
    for curve in layout.LVM_CURVE_FILES:
        stage.write_text(layout.lvm_curves(experiment, curve), curve_csv(by_key, curve))
    stage.write_text(layout.lvm_curves(experiment, "runs"), runs_csv(by_key, metric))
    runs = [{**asdict(c), **by_key[c.key]} for c in grid_cells]
    for name, figure in experiment_figures(runs, metric, label, SPARSE_METHODS).items():
        path = layout.figures("lvm") / experiment / f"{name}.png"
        stage.write_png(path, figure, artifact="figures")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=sorted(LVM))
    parser.add_argument("--verbose", action="store_true", help="tracebacks of errors")
    chosen = parser.parse_args().experiment
    run_stage(f"train_lvm/{chosen}", lambda stage: main(stage, chosen))
