"""Tests for ``learnable_sparsity.reporting.render`` and the comparability rules of
``learnable_sparsity.reporting.table``: Markdown, CSV and LaTeX output, not-comparable labels,
differences only where comparable, and the report index."""

from __future__ import annotations

import csv
import io
import statistics

import pytest

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.reporting.lvm_tables import lvm_table
from learnable_sparsity.reporting.nmt_tables import ast_bleu_table
from learnable_sparsity.reporting.render import (
    latex_escape,
    render_report,
    table_files,
    to_csv,
    to_latex,
    to_markdown,
)
from learnable_sparsity.reporting.table import (
    NOT_COMPARABLE,
    ComparisonTable,
    Metric,
    Provenance,
    Reference,
    Row,
    TableCell,
)
from pipelines.lvm_experiments import LVM

SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
BLEU = {"softmax": [29.5, 30.1, 29.9], "entmax_alpha": [30.0], "topk": [35.0, 36.0]}


def _csv_rows(table: ComparisonTable) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(to_csv(table))))


def _header(markdown: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith("| "))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


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
        rows=(Row("sys_a & b", {"m": TableCell((1.0, 3.0), (Reference("pub #1", 2.5),))}),),
        provenance=Provenance("smoke", ("smoke",)),
    )
    text = to_latex(table)
    for command in (r"\toprule", r"\midrule", r"\bottomrule", r"\label{tab:escape_test}"):
        assert command in text
    assert r"sys\_a \& b & 2.00 $\pm$ 1.41 (n=2) & 2.50 \\" in text
    assert r"Title with 100\% \& more" in text and r"Caption\_with\_underscores" in text


def test_latex_spells_out_comparison_signs() -> None:
    assert latex_escape("0.68 < 0.80 > 0.5") == r"0.68 $<$ 0.80 $>$ 0.5"


def test_a_note_is_shown_instead_of_a_missing_value_and_after_a_present_one() -> None:
    table = ComparisonTable(
        name="note_test",
        title="Notes",
        caption="",
        metrics=(Metric("m", "m", digits=0),),
        rows=(
            Row("empty", {"m": TableCell((), (), "not measurable")}),
            Row("zero", {"m": TableCell((0.0,), (), "best head below threshold")}),
        ),
        provenance=Provenance("smoke", ("smoke",)),
    )
    text = to_markdown(table)
    assert "| empty | not measurable |" in text
    assert "| zero | 0 (n=1) — best head below threshold |" in text


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


# ---------------------------------------------------------------------------- report


def test_report_links_tables_and_figures_relatively() -> None:
    tables = [
        ast_bleu_table(BLEU, profile="smoke", data="smoke"),
        lvm_table(
            "ssvae",
            LVM["ssvae"].table,
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


def test_report_opens_with_the_claims_section() -> None:
    claims = "## The papers' claims\n\n| Claim | Verdict |\n|---|---|\n| x | **reproduced** |\n"
    table = ast_bleu_table(BLEU, profile="smoke", data="smoke")
    text = render_report([table], [], claims)
    assert text.index("## The papers' claims") < text.index("## Tables")
    assert "## The papers' claims" not in render_report([table], [])
