"""Tests for ``learnable_sparsity.reporting.lvm_tables``: thesis Tables 5.1–5.3 beside the
reproduced latent-variable results."""

from __future__ import annotations

import csv
import io
import math
import statistics

import pytest

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.reporting.lvm_tables import lvm_table
from learnable_sparsity.reporting.published import paper_table
from learnable_sparsity.reporting.render import to_csv, to_markdown
from learnable_sparsity.reporting.table import ComparisonTable
from pipelines.lvm_experiments import LVM


def _lvm_table(experiment: str, *args: object, **kwargs: object) -> ComparisonTable:
    """The table of ``experiment`` with the spec of its record."""
    return lvm_table(experiment, LVM[experiment].table, *args, **kwargs)


def _csv_rows(table: ComparisonTable) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(to_csv(table))))


def _header(markdown: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith("| "))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


def test_lvm_rows_follow_the_thesis_order() -> None:
    for experiment, spec in ((name, e.table) for name, e in LVM.items()):
        published = [row["system"] for row in paper_table(spec.table_id)["rows"]]
        assert list(spec.methods.values()) == published, experiment


def test_lvm_table_mean_and_standard_error_over_seeds() -> None:
    results = {
        "unordered_set": [{"accuracy": 0.90, "decoder_calls": 4}],
        "sparsemax": [
            {"accuracy": 0.95, "decoder_calls": 1.0},
            {"accuracy": 0.97, "decoder_calls": 1.0},
            {"accuracy": 0.96, "decoder_calls": 1.3},
        ],
        "sfe": [{"accuracy": 0.93, "decoder_calls": 1}],
    }
    table = _lvm_table("ssvae", results, profile="paper", data="mnist")
    assert [row.system for row in table.rows] == [
        "SFE",
        "Sparse (sparsemax, proposed)",
        "Unordered set (Kool et al., 2020)",
    ]
    se = statistics.stdev([95.0, 97.0, 96.0]) / math.sqrt(3)
    text = to_markdown(table)
    assert f"| Sparse (sparsemax, proposed) | 96.00 ± {se:.2f} (n=3) | 96.87 ± 0.001 |" in text
    assert "mean ± standard error" in _header(text)[1]
    sparse = [r for r in _csv_rows(table) if r["system"].startswith("Sparse")]
    assert sparse[0]["spread_kind"] == "se"
    assert float(sparse[0]["spread"]) == pytest.approx(se)
    assert float(sparse[0]["diff"]) == pytest.approx(96.0 - 96.87)
    assert float(sparse[1]["published_spread"]) == pytest.approx(0.01)
    extra = [r for r in _csv_rows(table) if r["system"].startswith("Unordered")]
    assert [r["published"] for r in extra] == ["", ""]


def test_lvm_signal_game_reward_variants_and_bitvector_columns() -> None:
    game = _lvm_table(
        "signal_game",
        {"sfe_zero_one": [{"communication_success": 0.5, "decoder_calls": 1}]},
        profile="smoke",
        data="digits_game",
    )
    assert game.rows[0].system == "SFE (0/1)"
    assert game.rows[0].cells["communication_success"].references[0].value == pytest.approx(55.36)
    bits = _lvm_table(
        "bitvector_vae",
        {"topk_sparsemax": [{"latent_dim": 8, "nll_bits_per_dim": 3.0, "decoder_calls": 10}]},
        profile="smoke",
        data="digits",
    )
    assert [m.key for m in bits.metrics] == [
        f"{name}_D{dim}" for dim in (8, 32, 128) for name in ("nll_bits_per_dim", "decoder_calls")
    ]
    cells = bits.rows[0].cells
    assert cells["nll_bits_per_dim_D8"].values == (3.0,)
    assert cells["nll_bits_per_dim_D32"].values == ()
    assert cells["nll_bits_per_dim_D32"].references[0].value == pytest.approx(3.62)
    assert cells["nll_bits_per_dim_D32"].note is None  # not run, not collapsed


def test_collapsed_bitvector_runs_are_left_out_and_named() -> None:
    def run(nll: float, kl: float) -> dict:
        return {"latent_dim": 32, "nll_bits_per_dim": nll, "kl_nats": kl, "decoder_calls": 1}

    table = _lvm_table(
        "bitvector_vae",
        {"sfe": [run(2.18, 30.0), run(2.43, 0.01)], "gumbel": [run(2.43, 0.2)]},
        profile="smoke",
        data="digits",
    )
    sfe, gumbel = (row.cells["nll_bits_per_dim_D32"] for row in table.rows)
    assert sfe.values == (2.18,) and sfe.note is None
    assert gumbel.values == () and gumbel.note == "collapsed (KL < 1 nat)"
    assert "sfe D=32 seed #1" in table.caption and "gumbel D=32 seed #0" in table.caption


def test_unconverged_nll_estimates_are_named_in_the_caption() -> None:
    def run(nll: float, drift: float, dim: int = 32) -> dict:
        return {
            "latent_dim": dim,
            "nll_bits_per_dim": nll,
            "nll_estimate_drift": drift,
            "kl_nats": 20.0,
            "decoder_calls": 10,
        }

    topk = [run(2.27, 0.12), run(2.2, 0.005), run(2.6, 0.2, dim=128)]
    results = {"sfe": [run(2.18, 0.001)], "topk_sparsemax": topk}
    table = _lvm_table("bitvector_vae", results, profile="smoke", data="digits")
    assert (
        "not converged" in table.caption and "topk_sparsemax D=32 seed #0 (0.12)" in table.caption
    )
    assert "topk_sparsemax D=128 seed #0 (0.20)" in table.caption  # seeds counted per D
    assert "seed #1" not in table.caption and "sfe D=32" not in table.caption
    topk = table.rows[-1].cells["nll_bits_per_dim_D32"]
    assert topk.values == (2.27, 2.2)  # kept: overstated, not meaningless
    settled = {"sfe": [run(2.18, 0.001)]}
    assert "not converged" not in _lvm_table("bitvector_vae", settled, "smoke", "digits").caption


@pytest.mark.parametrize(
    ("experiment", "results", "match"),
    [
        ("ssvae", {"topk_sparsemax": []}, "topk_sparsemax"),
        ("signal_game", {"sfe": []}, "'sfe'"),
        ("ssvae", {"sfe": [{"accuracy": 94.0, "decoder_calls": 1}]}, "accuracy"),
        ("ssvae", {"sfe": [{"accuracy": 0.9}]}, "decoder_calls"),
        ("bitvector_vae", {"sfe": [{"nll_bits_per_dim": 3.0, "decoder_calls": 1}]}, "latent_dim"),
    ],
)
def test_lvm_table_rejects_bad_inputs(experiment: str, results: dict, match: str) -> None:
    with pytest.raises(LearnableSparsityError, match=match):
        _lvm_table(experiment, results, profile="smoke", data="digits")
