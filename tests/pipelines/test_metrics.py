"""DVC metrics (``pipelines.scaffold.metrics``): numbers only, a mean and every seed for the
headline numbers, and each stage's metrics built from small fake results."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from learnable_sparsity.errors import LearnableSparsityError
from pipelines.cells.heads import head_metrics
from pipelines.scaffold.metrics import (
    cell_metrics,
    check_scalar_metrics,
    nested,
    scalar_summary,
    split_seed,
)
from pipelines.stages.ape.evaluate_ape import ape_metrics_summary
from pipelines.stages.ape.synthetic_ape import triplet_metrics
from pipelines.stages.lvm.train_lvm import lvm_metrics

REPO = Path(__file__).resolve().parents[2]


def test_scalar_summary_is_the_mean_then_every_seed() -> None:
    assert scalar_summary({1: 3.0, 0: 1.0}) == {"mean": 2.0, "seed0": 1.0, "seed1": 3.0}
    with pytest.raises(ValueError):
        scalar_summary({})


def test_split_seed_and_nested() -> None:
    assert split_seed("smoke/softmax/seed12") == ("smoke/softmax", 12)
    with pytest.raises(ValueError):
        split_seed("smoke/softmax")
    assert nested({"a/b": 1, "a/c": 2, "d": 3}) == {"a": {"b": 1, "c": 2}, "d": 3}


def test_cell_metrics_groups_seeds_per_seed_only_for_headline_numbers() -> None:
    cells = {
        "smoke/softmax/seed0": {"bleu": 40.0, "chrf": 60.0, "js": None},
        "smoke/softmax/seed1": {"bleu": 42.0, "chrf": 62.0, "js": None},
        "smoke/topk/seed0": {"bleu": 30.0, "chrf": 50.0, "js": 0.5},
    }
    assert cell_metrics(cells, per_seed=("bleu",)) == {
        "smoke": {
            "softmax": {"bleu": {"mean": 41.0, "seed0": 40.0, "seed1": 42.0}, "chrf": 61.0},
            "topk": {"bleu": {"mean": 30.0, "seed0": 30.0}, "chrf": 50.0, "js": 0.5},
        }
    }


@pytest.mark.parametrize(
    "bad", [{"a": [1.0]}, {"a": {"b": "signature"}}, {"a": None}, {"a": {"b": {"c": (1,)}}}]
)
def test_check_scalar_metrics_refuses_lists_strings_and_none(bad: dict) -> None:
    with pytest.raises(LearnableSparsityError, match=r"stage\.a"):
        check_scalar_metrics(bad, "stage")


def test_check_scalar_metrics_accepts_nested_numbers_and_booleans() -> None:
    check_scalar_metrics({"a": {"b": 1, "c": 2.5, "d": True}, "e": 0})


def test_every_stage_builds_scalar_metrics_from_its_results() -> None:
    role = {"measurable": True, "count": 2, "matched": 10, "heads": [["x", 1], ["y", 2]]}
    heads = {
        "js": {"encoder.self.layer0": 0.2, "encoder.self.layer1": 0.4, "decoder.self.layer0": None},
        "mean_density": {"encoder.self": 0.5, "decoder.self": 0.7},
        "source_language": "en",
        "roles": {"bpe_merge": role, "interrogation": {"measurable": False, "count": None}},
        "alpha": {"encoder.self": {"mean": 1.3, "min": 1.1, "max": 1.5, "bimodality": 0.4}},
    }
    built = head_metrics(heads)
    assert built["js/all"] == pytest.approx(0.3) and built["js/encoder_self"] == pytest.approx(0.3)
    assert built["heads_with_role"] == 2 and built["alpha/encoder_self"] == 1.3
    lvm = {
        f"D32/sparsemap/seed{s}": {"metrics": {"nll_bits_per_dim": s, "decoder_calls": 4.0}}
        for s in (0, 1)
    }
    scores = {
        "data": "data/ape/real",
        "cells": {"low_resource/scratch/seed0": {"test": {"ter": 30.0, "tokenized_bleu": 50.0}}},
        "do_nothing": {"test": {"ter": 35.0, "tokenized_bleu": 45.0}},
        "signatures": {"ter": "nrefs:1|case:mixed"},
    }
    ter = {"triplets": 3, "corpus_ter": 20.0, "signature": "tok:tercom", "quantiles": {"10": 0}}
    summary = {
        "sets": {"real": {"test": ter}},
        "left_out_seen": 0,
        "real_passed_over_untranslated": 1,
        "filters": {"candidates": 5, "dropped": {"x": 1}},
    }
    for metrics in (
        cell_metrics({"smoke/entmax_alpha/seed0": built}),
        lvm_metrics(lvm, "nll_bits_per_dim"),
        ape_metrics_summary(scores),
        triplet_metrics(summary),
    ):
        check_scalar_metrics(metrics)
    assert lvm_metrics(lvm, "nll_bits_per_dim")["D32"]["sparsemap"] == {
        "nll_bits_per_dim": {"mean": 0.5, "seed0": 0.0, "seed1": 1.0},
        "decoder_calls": 4.0,
    }
    assert ape_metrics_summary(scores)["low_resource"]["scratch"]["test"]["ter"] == 30.0


def test_dvc_yaml_declares_only_metrics_json_files_as_metrics() -> None:
    """The scheme at the top of dvc.yaml: every stage's metrics are results/<stage>/metrics.json."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    declared = [
        next(iter(entry)) if isinstance(entry, dict) else entry
        for stage in stages.values()
        for entry in stage.get("do", stage).get("metrics", [])
    ]
    assert declared and all(path.endswith("/metrics.json") for path in declared)
