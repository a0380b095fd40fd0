"""DVC stage ``analyze_heads``: the head analyses of "Adaptively Sparse Transformers".

For every trained NMT cell (a Ray task each), on the validation set with teacher forcing:
attention density per head, Jensen–Shannon head diversity per layer, head-role scores
(positional, BPE-merging, interrogation) and the heads whose score passes
``analysis.role_threshold``, plus attention heat maps of notable heads on one validation
sentence. From the training histories (driver): the α trajectories (heads that first move towards
softmax and then become sparser are flagged) and the final α per attention type and layer, with
a bimodality coefficient.

Outputs: ``results/analyze_heads/cells/<cell>/analysis.json`` (everything), ``heads.json`` (DVC
metrics: per cell JS per block, density per attention type, role counts, α statistics),
DVC plots ``plots/js/<cell>.csv`` (JS per block) and ``plots/alpha/<cell>_<block>_head<h>.csv``
(one α trajectory each: DVC draws one line per file), and PNG figures under
``reports/figures/heads/<corpus>/seed<seed>/``. Each cell's metrics and figures also go to the
MLflow run of the model's training (when that run is in the tracking store) and to a child run
of this stage.
"""

from __future__ import annotations

import csv
import io
import logging
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from matplotlib.figure import Figure
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from components.analysis import figures
from components.analysis.heads import (
    ATTENTION_TYPES,
    ROLES,
    analyze,
    bimodality_coefficient,
    roles,
    softmax_then_sparser,
    split_block,
)
from components.data.atomic import atomic_write_bytes, atomic_write_text
from components.data.bpe import WORD_START, BpeModel, word_ids
from components.errors import LearnableSparsityError
from components.nmt.trainer import load_weights
from pipelines import nmt_grid, tracking
from pipelines.io import read_corpus, read_json, write_json
from pipelines.nmt_grid import Cell
from pipelines.params import load_params
from pipelines.runner import run_params_grid
from pipelines.train_nmt import DONE

STAGE = "analyze_heads"
RESULTS = Path("results/analyze_heads")
PLOTS = RESULTS / "plots"
FIGURES = Path("reports/figures/heads")
log = logging.getLogger(__name__)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def _word_masks(
    pieces: Sequence[str], interrogatives: set[str], question_mark: str
) -> tuple[list[int], list[bool], list[bool]]:
    """Word index per piece, and whether the piece belongs to an interrogative word / is "?"."""
    words = word_ids(pieces)
    text: dict[int, str] = {}
    for piece, word in zip(pieces, words, strict=True):
        text[word] = text.get(word, "") + piece.removeprefix(WORD_START)
    interrogative = [text[w].lower() in interrogatives for w in words]
    question = [piece.removeprefix(WORD_START) == question_mark for piece in pieces]
    return words, interrogative, question


def _heatmaps(
    model: torch.nn.Module,
    example: tuple[list[int], list[int]],
    pieces: tuple[list[str], list[str]],
    heads: list[dict],
) -> dict[str, Figure]:
    """Attention of each of ``heads`` on one sentence (teacher forcing), a figure per type."""
    src = torch.tensor([example[0]])
    tgt_in = torch.tensor([[model.config.bos_id, *example[1]]])
    attention: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        model(src, tgt_in, attention=attention)
    source, target = pieces[0], ["<s>", *pieces[1]]
    axes = {
        "encoder.self": (source, source),
        "decoder.self": (target, target),
        "decoder.context": (target, source),
    }
    maps: dict[str, dict[str, torch.Tensor]] = {}
    for head in heads:
        title = f"{head['role']}: {head['block']} h{head['head']} ({head['confidence']:.2f})"
        maps.setdefault(head["attention"], {})[title] = attention[head["block"]][0, head["head"]]
    return {kind: figures.attention_heatmaps(m, *axes[kind]) for kind, m in maps.items()}


def analyze_cell(task: dict) -> dict:
    """Ray task: the head analysis of one trained cell and its heat-map figure."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", force=True)
    cell, settings = Cell(**task["cell"]), task["analysis"]
    bpe = BpeModel(cell.bpe_model)
    valid = read_corpus(cell.corpus_dir)["valid"][: settings["max_sentences"]]
    examples = nmt_grid.encode(bpe, valid)
    src_pieces = [bpe.encode(source) for source, _ in valid]
    tgt_pieces = [bpe.encode(target) for _, target in valid]
    interrogatives = {word.lower() for word in settings["interrogatives"]}
    src_masks = [_word_masks(p, interrogatives, settings["question_mark"]) for p in src_pieces]
    model = nmt_grid.build_model(task["model"], cell.variant, bpe.vocab_size)
    model.load_state_dict(load_weights(cell.checkpoint_dir, task["average_last"]))
    model.eval()
    result = analyze(
        model,
        examples,
        [m[0] for m in src_masks],
        [word_ids(p) for p in tgt_pieces],
        [m[1] for m in src_masks],
        [m[2] for m in src_masks],
        settings["max_tokens"],
    )
    alphas = {key: value.tolist() for key, value in model.alphas().items()}
    found = roles(result, alphas or None, settings["role_threshold"])
    # The strongest head of each role (above the threshold or not): reported and drawn on the
    # first validation question (it has "?" and, most likely, an interrogative word).
    ranked = roles(result, alphas or None, 0.0)
    best = [
        next(h for h in ranked if h["role"] == role)
        for role in ROLES
        if role in {h["role"] for h in ranked}
    ]
    index = next((i for i, m in enumerate(src_masks) if any(m[2])), 0)
    pieces = (src_pieces[index], tgt_pieces[index])
    heatmaps = {
        kind: _png(figure)
        for kind, figure in _heatmaps(model, examples[index], pieces, best).items()
    }
    log.info("%s: %d heads with a role", cell.key, len(found))
    return {
        "key": cell.key,
        "analysis": result,
        "roles": found,
        "best_heads": best,
        "alphas": alphas,
        "heatmaps": heatmaps,
    }


def _alpha_statistics(alphas: dict[str, list[float]]) -> dict[str, dict[str, float | None]]:
    """Mean, range and bimodality coefficient (None below 4 distinct values) of the final α per
    attention type."""
    out: dict[str, dict[str, float | None]] = {}
    for kind in ATTENTION_TYPES:
        values = [a for key, heads in alphas.items() if split_block(key)[0] == kind for a in heads]
        if values:
            bimodal = len(values) >= 4 and len(set(values)) > 1
            out[kind] = {
                "mean": statistics.fmean(values),
                "min": min(values),
                "max": max(values),
                "bimodality": bimodality_coefficient(values) if bimodal else None,
            }
    return out


def _flagged(history: list[dict]) -> list[tuple[str, int]]:
    """(block, head) of every α trajectory that first moves towards softmax, then sparser."""
    flagged = []
    for key in history[0]["alphas"]:
        for head in range(len(history[0]["alphas"][key])):
            if softmax_then_sparser([entry["alphas"][key][head] for entry in history]):
                flagged.append((key, head))
    return flagged


def _summary(result: dict, flagged: list) -> dict:
    blocks, found = result["analysis"]["blocks"], result["roles"]
    densities = result["analysis"]["densities"]
    return {
        "js": {key: block["js"] for key, block in blocks.items()},
        "mean_density": {kind: statistics.fmean(v) for kind, v in densities.items() if v},
        "roles": {role: sum(h["role"] == role for h in found) for role in ROLES},
        "best_heads": {
            head["role"]: {k: head[k] for k in ("block", "head", "alpha", "confidence")}
            for head in result["best_heads"]
        },
        "alpha": _alpha_statistics(result["alphas"]),
        "heads_towards_softmax_then_sparser": len(flagged),
    }


def _flat(key: str) -> str:
    return key.replace("/", "_")


def _series_csv(rows: list[tuple[object, object]], header: tuple[str, str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows([header, *rows])
    return out.getvalue()


def _training_run(client: MlflowClient, done: dict) -> str | None:
    """The MLflow run of the model's training, if it is in this tracking store."""
    run_id = done.get("mlflow_run_id")
    if run_id is None:
        return None
    try:
        client.get_run(run_id)
    except MlflowException:
        return None
    return run_id


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params()
    cells = nmt_grid.grid(params)
    settings = params.get("analysis", dict)
    for key in ("max_sentences", "max_tokens"):
        if params.get(f"analysis.{key}", int) < 1:
            raise LearnableSparsityError(f"{params.source}: analysis.{key} must be >= 1")
    if not 0 < params.get("analysis.role_threshold", float) <= 1:
        raise LearnableSparsityError(f"{params.source}: analysis.role_threshold must be in (0, 1]")
    params.get("analysis.interrogatives", list)
    params.get("analysis.question_mark", str)
    done = {}
    for cell in cells:
        path = cell.checkpoint_dir / DONE
        if not path.exists():
            raise LearnableSparsityError(f"{path} is missing: train the cell first (dvc repro)")
        done[cell.key] = read_json(path)

    uri = tracking.tracking_uri(Path.cwd())
    experiment = params.get("mlflow.experiment", str)
    tracking.prepare(uri, experiment)
    client = MlflowClient(uri)
    with tracking.stage_run(uri, experiment, STAGE, {"analysis": settings}) as stage:
        tasks = [
            {
                "cell": asdict(cell),
                "model": params.get("nmt.model", dict),
                "average_last": params.get("nmt.decode.average_last", int),
                "analysis": settings,
            }
            for cell in cells
        ]
        results = run_params_grid(analyze_cell, tasks, params, STAGE)
        shutil.rmtree(RESULTS / "cells", ignore_errors=True)
        shutil.rmtree(FIGURES, ignore_errors=True)
        shutil.rmtree(PLOTS, ignore_errors=True)
        metrics = {}
        for cell, result in zip(cells, results, strict=True):
            history = done[cell.key]["history"]["alphas"]
            flagged = _flagged(history) if history else []
            figure_dir = FIGURES / cell.corpus / f"seed{cell.seed}"
            paths = []
            for kind, png in result["heatmaps"].items():
                paths.append(figure_dir / f"heatmaps_{cell.variant}_{kind.replace('.', '_')}.png")
                atomic_write_bytes(paths[-1], png)
            if history:
                for kind, figure in figures.alpha_trajectory_figures(history, flagged).items():
                    paths.append(figure_dir / f"alpha_trajectories_{kind.replace('.', '_')}.png")
                    atomic_write_bytes(paths[-1], _png(figure))
                paths.append(figure_dir / "alpha_histograms.png")
                atomic_write_bytes(paths[-1], _png(figures.alpha_histograms(result["alphas"])))
                for key, heads in history[0]["alphas"].items():
                    for head in range(len(heads)):
                        rows = [(e["step"], e["alphas"][key][head]) for e in history]
                        name = f"{_flat(cell.key)}_{key.replace('.', '_')}_head{head}.csv"
                        atomic_write_text(
                            PLOTS / "alpha" / name, _series_csv(rows, ("step", "alpha"))
                        )
            summary = _summary(result, flagged)
            metrics[cell.key] = summary
            js_rows = [(key, value) for key, value in summary["js"].items() if value is not None]
            js_csv = _series_csv(js_rows, ("block", "js"))
            atomic_write_text(PLOTS / "js" / f"{_flat(cell.key)}.csv", js_csv)
            write_json(
                RESULTS / "cells" / cell.key / "analysis.json",
                {
                    **result["analysis"],
                    "roles": result["roles"],
                    "alphas": result["alphas"],
                    "flagged_heads": flagged,
                    "figures": [str(p) for p in paths],
                },
            )
            scalars = {
                tracking.metric_name("analysis", "js", key): value
                for key, value in summary["js"].items()
                if value is not None
            }
            scalars |= {
                tracking.metric_name("analysis", "density", kind): value
                for kind, value in summary["mean_density"].items()
            }
            training_run = _training_run(client, done[cell.key])
            if training_run is not None:
                logger = tracking.RunLogger(uri, training_run)
                logger.log_metrics(scalars, step=0)
                logger.flush()
                for path in paths:
                    logger.log_artifact(path, "analysis")
            child = tracking.RunLogger(uri, stage.child(cell.key, {"cell": asdict(cell)}))
            with child:
                child.log_metrics(scalars, step=0)
                child.log_dict(metrics[cell.key], "summary.json")
                for path in paths:
                    child.log_artifact(path, "figures")
        for corpus in sorted({cell.corpus for cell in cells}):
            for seed in sorted({cell.seed for cell in cells}):
                group = {
                    cell.variant: result["analysis"]
                    for cell, result in zip(cells, results, strict=True)
                    if (cell.corpus, cell.seed) == (corpus, seed)
                }
                figure_dir = FIGURES / corpus / f"seed{seed}"
                atomic_write_bytes(
                    figure_dir / "js_per_layer.png", _png(figures.js_per_layer(group))
                )
                density = figures.density_distributions(group)
                atomic_write_bytes(figure_dir / "density.png", _png(density))
                stage.log_artifact(figure_dir, f"figures/{corpus}/seed{seed}")
        write_json(RESULTS / "heads.json", metrics)
        stage.log_artifact(RESULTS / "heads.json")


if __name__ == "__main__":
    main()
