"""Tests for ``components.reporting.tables``: published numbers, comparability labels, renderers
and the four builders."""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path

import pytest

from components.errors import LearnableSparsityError
from components.reporting.tables import (
    LVM_SPECS,
    NOT_COMPARABLE,
    Cell,
    ComparisonTable,
    Metric,
    Provenance,
    Reference,
    Row,
    ast_bleu_table,
    head_summary_table,
    latex_escape,
    lvm_table,
    paper_table,
    render_report,
    speed_comparison_table,
    table_files,
    to_csv,
    to_latex,
    to_markdown,
)

REFERENCE_YAML = Path("/work/shared/reference/paper_results.yaml")
PACKAGED_YAML = Path(__file__).resolve().parents[2] / "components/reporting/paper_results.yaml"
SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
BLEU = {"softmax": [29.5, 30.1, 29.9], "entmax_alpha": [30.0], "topk": [35.0, 36.0]}


def _csv_rows(table: ComparisonTable) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(to_csv(table))))


def _header(markdown: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith("| "))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


# ---------------------------------------------------------------------------- published numbers


def test_paper_table_reads_tables_and_in_text_results() -> None:
    assert paper_table("ast_mt_bleu")["rows"][0]["bleu_iwslt17_de_en"] == pytest.approx(29.79)
    speeds = paper_table("ast_training_speed")["rows"]
    assert {r["system"]: r["relative_train_speed_pct"] for r in speeds} == {
        "alpha-entmax": 75,
        "1.5-entmax": 90,
    }


def test_paper_table_returns_a_copy() -> None:
    paper_table("ast_mt_bleu")["rows"].clear()
    assert paper_table("ast_mt_bleu")["rows"]


def test_unknown_table_id_lists_the_known_ids() -> None:
    with pytest.raises(LearnableSparsityError, match="no_such_table") as error:
        paper_table("no_such_table")
    assert "ast_mt_bleu" in str(error.value) and "ast_positional_heads" in str(error.value)


@pytest.mark.skipif(not REFERENCE_YAML.exists(), reason="the shared reference is not checked out")
def test_packaged_yaml_is_a_verbatim_copy_of_the_reference() -> None:
    assert PACKAGED_YAML.read_bytes() == REFERENCE_YAML.read_bytes()


# ---------------------------------------------------------------------------- rendering


def test_markdown_shows_mean_std_n_published_and_provenance() -> None:
    table = ast_bleu_table(BLEU, profile="paper", data="iwslt17_de_en", signature=SIGNATURE)
    text = to_markdown(table)
    std = statistics.stdev(BLEU["softmax"])
    assert f"| Transformer (softmax) | 29.83 ± {std:.2f} (n=3) | 29.79 | 35.30 | +0.04 |" in text
    assert "| α-entmax | 30.00 (n=1) | 29.90 | 35.50 | +0.10 |" in text  # n = 1: no ±
    assert "| top-k | 35.50 ± 0.71 (n=2) | — | 35.60 |  |" in text
    assert f"- sacreBLEU signature: `{SIGNATURE}`" in text
    assert "- seeds (n per cell): 1–3" in text
    assert "- profile: paper" in text


def test_csv_has_one_line_per_system_metric_and_reference() -> None:
    table = ast_bleu_table(BLEU, profile="paper", data="iwslt17_de_en", signature=SIGNATURE)
    rows = _csv_rows(table)
    assert len(rows) == 3 * 2  # three variants, two published columns (AST iwslt17, EST)
    softmax = [r for r in rows if r["system"] == "Transformer (softmax)"]
    ast, est = softmax
    assert ast["values"] == "29.5;30.1;29.9" and ast["n"] == "3"
    assert float(ast["mean"]) == pytest.approx(29.833333, abs=1e-6)
    assert float(ast["spread"]) == pytest.approx(statistics.stdev(BLEU["softmax"]))
    assert ast["spread_kind"] == "std"
    assert float(ast["published"]) == pytest.approx(29.79)
    assert float(ast["diff"]) == pytest.approx(29.833333 - 29.79, abs=1e-6)
    assert (ast["profile"], ast["data"], ast["published_data"]) == (
        "paper",
        "iwslt17_de_en",
        "iwslt17_de_en",
    )
    assert est["published_data"] == "iwslt14_de_en" and est["diff"] == ""


def test_latex_is_booktabs_and_escaped() -> None:
    assert latex_escape(r"a_b & 5% $x #1 {y} ~ ^ \ ± α") == (
        r"a\_b \& 5\% \$x \#1 \{y\} \textasciitilde{} \textasciicircum{} \textbackslash{}"
        r" $\pm$ $\alpha$"
    )
    table = ComparisonTable(
        name="escape_test",
        title="Title with 100% & more",
        caption="Caption_with_underscores.",
        metrics=(Metric("m", "m_1"),),
        rows=(Row("sys_a & b", {"m": Cell((1.0, 3.0), (Reference("pub #1", 2.5),))}),),
        provenance=Provenance("smoke", ("smoke",)),
    )
    text = to_latex(table)
    for command in (r"\toprule", r"\midrule", r"\bottomrule", r"\label{tab:escape_test}"):
        assert command in text
    assert r"sys\_a \& b & 2.00 $\pm$ 1.41 (n=2) & 2.50 \\" in text
    assert r"Title with 100\% \& more" in text and r"Caption\_with\_underscores" in text


# ---------------------------------------------------------------------------- comparability


@pytest.mark.parametrize("profile", ["smoke", "ci"])
def test_non_paper_profiles_are_labelled_not_comparable(profile: str) -> None:
    table = ast_bleu_table(BLEU, profile=profile, data="smoke", signature=SIGNATURE)
    markdown = to_markdown(table)
    reproduced = [h for h in _header(markdown) if "reproduced" in h]
    assert reproduced and all(
        f"{profile} profile on smoke — {NOT_COMPARABLE}" in h for h in reproduced
    )
    assert NOT_COMPARABLE in table.full_caption()
    assert not any("Δ" in h for h in _header(markdown))
    assert all(row["diff"] == "" for row in _csv_rows(table))
    # For generated data every AST column is shown for reference, plus EST's de-en column.
    assert sum("(AST Table 4.1)" in h for h in _header(markdown)) == 4
    latex = to_latex(table)
    assert "Delta" not in latex and NOT_COMPARABLE in latex


def test_paper_profile_on_other_data_shows_no_difference() -> None:
    table = ast_bleu_table(BLEU, profile="paper", data="my_corpus")
    markdown = to_markdown(table)
    assert not any("Δ" in h for h in _header(markdown))
    assert NOT_COMPARABLE not in markdown
    assert "shown for reference only" in table.full_caption()


def test_paper_profile_with_matching_data_differences_each_matching_reference() -> None:
    table = ast_bleu_table({"topk": [36.0, 35.6]}, profile="paper", data="iwslt14_de_en")
    row = _csv_rows(table)[-1]
    assert row["reference"].endswith("(EST Table 4)")
    assert float(row["diff"]) == pytest.approx(35.8 - 35.6)
    assert "Δ vs published iwslt14_de_en (EST Table 4)" in _header(to_markdown(table))[-1]


# ---------------------------------------------------------------------------- builders


SPEED_ROWS = [
    {"variant": "softmax", "train_tokens_per_second": 1000, "inference_tokens_per_second": 200},
    {"variant": "softmax", "train_tokens_per_second": 1200, "inference_tokens_per_second": 100},
    {"variant": "entmax_alpha", "train_tokens_per_second": 250, "inference_tokens_per_second": 20},
    {"variant": "entmax_alpha", "train_tokens_per_second": 600, "inference_tokens_per_second": 20},
]


def test_speed_ratios_from_rounds_and_from_published_numbers() -> None:
    table = speed_comparison_table(SPEED_ROWS, profile="paper", device="cpu", data="iwslt14_de_en")
    cells = {row.system: row.cells for row in table.rows}
    alpha = cells["α-entmax"]
    assert alpha["train_ratio"].values == pytest.approx((0.25, 0.5))  # round i / softmax round i
    assert alpha["inference_ratio"].values == pytest.approx((0.1, 0.2))
    assert alpha["train_speed"].values == (250.0, 600.0)
    est, ast = alpha["train_ratio"].references
    assert est.value == pytest.approx(13 / 49) and ast.value == pytest.approx(0.75)
    assert alpha["inference_ratio"].references[0].value == pytest.approx(0.6 / 7.0)
    assert alpha["train_speed"].references[0].value == pytest.approx(13000)
    assert cells["Transformer (softmax)"]["train_ratio"].values == (1.0, 1.0)
    diff = {
        (r["metric"], r["reference"]): r["diff"]
        for r in _csv_rows(table)
        if r["system"] == "α-entmax"
    }
    assert float(diff["train_ratio", est.column]) == pytest.approx(0.375 - 13 / 49)
    assert diff["train_ratio", ast.column] == ""  # AST's in-text speed: no data set attached
    assert diff["train_speed", est.column] == ""  # absolute speeds are hardware-dependent


def test_speed_table_lists_entmax15_against_ast_in_text_speed() -> None:
    rows = [
        {"variant": "entmax15", "train_tokens_per_second": 90, "inference_tokens_per_second": 9},
        {"variant": "softmax", "train_tokens_per_second": 100, "inference_tokens_per_second": 10},
    ]
    table = speed_comparison_table(rows, profile="smoke", device="cpu", data="smoke")
    assert [row.system for row in table.rows] == ["Transformer (softmax)", "1.5-entmax"]
    est, ast = table.rows[1].cells["train_ratio"].references
    assert est.value == pytest.approx(40 / 49) and ast.value == pytest.approx(0.9)
    assert "- device: cpu" in to_markdown(table)


def test_speed_table_needs_softmax_and_matching_rounds() -> None:
    with pytest.raises(LearnableSparsityError, match="softmax"):
        speed_comparison_table(SPEED_ROWS[2:], profile="smoke", device="cpu", data="smoke")
    with pytest.raises(LearnableSparsityError, match="rounds"):
        speed_comparison_table(SPEED_ROWS[1:], profile="smoke", device="cpu", data="smoke")
    with pytest.raises(LearnableSparsityError, match="inference_tokens_per_second"):
        speed_comparison_table(
            [{"variant": "softmax", "train_tokens_per_second": 1}],
            profile="smoke",
            device="cpu",
            data="smoke",
        )


ROLES = [
    {
        "role": "positional_prev",
        "variant": "entmax_alpha",
        "block": "encoder.self.layer0",
        "layer": 0,
        "head": 1,
        "alpha": 1.5,
        "confidence": 0.95,
    },
    {
        "role": "positional_prev",
        "variant": "entmax_alpha",
        "block": "encoder.self.layer1",
        "layer": 1,
        "head": 2,
        "alpha": 1.9,
        "confidence": 0.97,
    },
    {
        "role": "positional_prev",
        "variant": "entmax_alpha",
        "block": "decoder.self.layer0",
        "layer": 0,
        "head": 0,
        "alpha": 1.2,
        "confidence": 0.91,
    },
    {
        "role": "bpe_merge",
        "variant": "softmax",
        "block": "encoder.self.layer0",
        "layer": 0,
        "head": 3,
        "alpha": None,
        "confidence": 0.85,
    },
]
JS = {
    "softmax": {"decoder.self.layer0": [0.1, 0.2], "encoder.self.layer1": 0.3},
    "entmax_alpha": {"encoder.self.layer0": 0.5},
}


def test_head_summary_js_per_block_and_role_counts() -> None:
    js, roles = head_summary_table(JS, ROLES, profile="paper", data="wmt14_en_de")
    assert [row.system for row in js.rows] == [
        "encoder.self.layer0",
        "encoder.self.layer1",
        "decoder.self.layer0",
    ]
    assert [m.key for m in js.metrics] == ["softmax", "entmax_alpha"]
    assert "| decoder.self.layer0 | 0.150 ± 0.071 (n=2) | — |" in to_markdown(js)
    cells = {row.system: row.cells for row in roles.rows}
    prev = cells["α-entmax — positional (previous token)"]
    assert prev["heads"].values == (3.0,) and prev["heads"].references[0].value == 4
    assert prev["median_confidence"].values == pytest.approx((95.0,))
    assert prev["median_confidence"].references[0].value == pytest.approx(95.9)
    bpe = cells["α-entmax — BPE merging"]["median_confidence"].references[0]
    assert bpe.value == pytest.approx((88.5 + 89.8) / 2)
    softmax_prev = cells["Transformer (softmax) — positional (previous token)"]
    assert softmax_prev["heads"].values == (0.0,)
    diffs = {(r["system"], r["metric"]): r["diff"] for r in _csv_rows(roles)}
    assert float(diffs["α-entmax — positional (previous token)", "heads"]) == pytest.approx(-1)


def test_head_summary_rejects_unknown_blocks_and_roles() -> None:
    with pytest.raises(LearnableSparsityError, match=r"encoder\.cross"):
        head_summary_table(
            {"softmax": {"encoder.cross.layer0": 0.1}}, [], profile="smoke", data="smoke"
        )
    with pytest.raises(LearnableSparsityError, match="'copy'"):
        head_summary_table(JS, [{**ROLES[0], "role": "copy"}], profile="smoke", data="smoke")


def test_lvm_rows_follow_the_thesis_order() -> None:
    for experiment, spec in LVM_SPECS.items():
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
    table = lvm_table("ssvae", results, profile="paper", data="mnist")
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
    game = lvm_table(
        "signal_game",
        {"sfe_zero_one": [{"communication_success": 0.5, "decoder_calls": 1}]},
        profile="smoke",
        data="digits_game",
    )
    assert game.rows[0].system == "SFE (0/1)"
    assert game.rows[0].cells["communication_success"].references[0].value == pytest.approx(55.36)
    bits = lvm_table(
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


@pytest.mark.parametrize(
    ("experiment", "results", "match"),
    [
        ("vae", {"sfe": []}, "experiment"),
        ("ssvae", {"topk_sparsemax": []}, "topk_sparsemax"),
        ("signal_game", {"sfe": []}, "'sfe'"),
        ("ssvae", {"sfe": [{"accuracy": 94.0, "decoder_calls": 1}]}, "accuracy"),
        ("ssvae", {"sfe": [{"accuracy": 0.9}]}, "decoder_calls"),
        ("bitvector_vae", {"sfe": [{"nll_bits_per_dim": 3.0, "decoder_calls": 1}]}, "latent_dim"),
    ],
)
def test_lvm_table_rejects_bad_inputs(experiment: str, results: dict, match: str) -> None:
    with pytest.raises(LearnableSparsityError, match=match):
        lvm_table(experiment, results, profile="smoke", data="digits")


# ---------------------------------------------------------------------------- report


def test_report_links_tables_and_figures_relatively() -> None:
    tables = [
        ast_bleu_table(BLEU, profile="smoke", data="smoke"),
        lvm_table(
            "ssvae",
            {"sfe": [{"accuracy": 0.9, "decoder_calls": 1}]},
            profile="smoke",
            data="digits",
        ),
    ]
    text = render_report(tables, [("α trajectories", "figures/alpha.png")])
    for table in tables:
        for path in table_files(table):
            assert f"]({path})" in text
    assert "![α trajectories](figures/alpha.png)" in text
    assert "http" not in text and "<script" not in text
    assert text.count(NOT_COMPARABLE) >= 2 * 3  # header, caption and provenance of each table


@pytest.mark.parametrize("path", ["/abs/fig.png", "https://cdn.example/x.png", "../fig.png"])
def test_report_rejects_non_relative_figure_paths(path: str) -> None:
    with pytest.raises(LearnableSparsityError, match="figure path"):
        render_report([], [("figure", path)])


def test_report_rejects_duplicate_table_names() -> None:
    table = ast_bleu_table(BLEU, profile="smoke", data="smoke")
    with pytest.raises(LearnableSparsityError, match="duplicate"):
        render_report([table, table], [])
