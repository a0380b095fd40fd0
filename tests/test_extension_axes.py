"""Each extension axis has one registry that everything reads: a normalizer added through
``learnable_sparsity.core.registry`` alone trains an NMT step, gets its rows in the NMT tables
and in the benchmarks' lists; a latent-variable experiment added to
``pipelines.lvm_experiments.LVM`` alone is checked by the preflight (docs/adding-an-experiment.md
counts the sites)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from learnable_sparsity.core.attention import MultiHeadAttention
from learnable_sparsity.core.normalizers import sparsemax
from learnable_sparsity.core.registry import NORMALIZERS, Normalizer, registered
from learnable_sparsity.nmt.batching import collate
from learnable_sparsity.nmt.grid import NmtSettings
from learnable_sparsity.nmt.training import build_optimizer, train_step
from learnable_sparsity.reporting.nmt_tables import (
    ast_bleu_table,
    head_summary_table,
    speed_comparison_table,
)
from learnable_sparsity.reporting.render import to_markdown
from pipelines import lvm_experiments as experiments
from pipelines.commands import preflight
from pipelines.scaffold.params import Params, deep_merge
from pipelines.stages.report import benchmark_normalizers
from tests.conftest import load_script
from tests.tiny_transformer import PAD, tiny_model

ROOT = Path(__file__).resolve().parents[1]
NAME = "sharp_sparsemax"
LABEL = "sharp sparsemax (toy)"


def sharp_sparsemax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None):
    """sparsemax(2x): a toy normalizer, sparser than sparsemax."""
    return sparsemax(2 * x, dim=dim, mask=mask)


@pytest.fixture
def toy() -> Iterator[Normalizer]:
    with registered(Normalizer(NAME, sharp_sparsemax, LABEL)) as normalizer:
        yield normalizer
    assert NAME not in NORMALIZERS


def test_a_registered_normalizer_trains_an_nmt_step(toy: Normalizer) -> None:
    model = tiny_model(NAME, seed=0, training=True, dropout=0.0, attention_dropout=0.0)
    assert all(block.normalizer == NAME for block in model.attention_blocks().values())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer, scheduler = build_optimizer(model, 1e-2, warmup=1)
    g = torch.Generator().manual_seed(0)
    sentences = [torch.randint(4, 20, (n,), generator=g).tolist() for n in (3, 5, 2)]
    batch = collate(sentences, sentences, pad_id=PAD, bos_id=2, eos_id=3)
    metrics = train_step(model, batch, optimizer, scheduler, 1.0, 0.0, step=0, variant=NAME)
    assert torch.isfinite(torch.tensor(metrics["nll"]))
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    probs = MultiHeadAttention(8, 2, NAME)(torch.randn(1, 4, 8), return_probs=True).probs
    assert torch.allclose(probs.sum(-1), torch.ones(1, 2, 4)) and (probs == 0).any()


def test_the_nmt_params_accept_a_registered_normalizer(toy: Normalizer) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params = deep_merge(params, {"nmt": {"variants": ["softmax", NAME]}})
    settings = Params(params, "params.yaml").settings("nmt", NmtSettings)
    assert {cell.variant for cell in settings.cells()} == {"softmax", NAME}


def test_the_nmt_tables_give_a_registered_normalizer_a_row_without_published_numbers(
    toy: Normalizer,
) -> None:
    bleu = ast_bleu_table({"softmax": [30.0], NAME: [31.0]}, "smoke", "iwslt17_de_en")
    rows = {row.system: row for row in bleu.rows}
    assert list(rows) == ["Transformer (softmax)", LABEL]
    assert all(ref.value is None for ref in rows[LABEL].cells["bleu"].references)
    assert any(
        ref.value is not None for ref in rows["Transformer (softmax)"].cells["bleu"].references
    )
    speeds = [
        {
            "variant": variant,
            "train_tokens_per_second": 1000.0 * ratio,
            "inference_tokens_per_second": 500.0 * ratio,
            "train_ratio_to_softmax": ratio,
            "inference_ratio_to_softmax": ratio,
        }
        for variant, ratio in (("softmax", 1.0), (NAME, 0.9))
    ]
    speed = speed_comparison_table(speeds, "smoke", "cpu", "iwslt17_de_en")
    assert [row.system for row in speed.rows] == ["Transformer (softmax)", LABEL]
    js, _ = head_summary_table(
        {NAME: {"encoder.self.layer0": 0.1}}, {}, {}, "smoke", "iwslt17_de_en"
    )
    for table in (bleu, speed, js):
        assert LABEL in to_markdown(table)


def test_the_normalizer_benchmark_times_a_registered_normalizer(toy: Normalizer) -> None:
    pytest.importorskip("entmax", reason="the benchmark compares with the entmax package (dev)")
    candidates = benchmark_normalizers._candidates()
    assert NAME in candidates
    fn, oracle, _ = candidates[NAME]
    x = torch.randn(4, 8, dtype=torch.float64)
    assert torch.equal(oracle(x), sharp_sparsemax(x))
    assert torch.equal(fn(x.float(), None), sharp_sparsemax(x.float()))


def test_the_gpu_transformer_benchmark_lists_every_registered_normalizer() -> None:
    bench = load_script("benchmarks/gpu/transformer.py")
    assert tuple(NORMALIZERS) == bench.VARIANTS


# --------------------------------------------------------------------------- LVM experiments


def test_a_registered_lvm_experiment_reaches_the_preflight(monkeypatch: pytest.MonkeyPatch) -> None:
    """A toy experiment: the semi-supervised VAE's record under another key, with its section."""
    monkeypatch.setitem(
        experiments.LVM, "toy", dataclasses.replace(experiments.LVM["ssvae"], name="toy")
    )
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    toy_section = {**base["lvm"]["ssvae"], "precision": "bf16"}
    assert "lvm.toy" in preflight.sections()
    assert preflight.precision_of()["lvm.toy"] == ("precision",)

    params = Params(deep_merge(base, {"lvm": {"toy": toy_section}}), "p.yaml")
    checks = {check.what: check for check in preflight.settings_checks(params)}
    assert checks["params lvm.toy"].ok
    precision = {check.what: check for check in preflight.precision_checks(params)}
    assert "params lvm.toy.precision" in precision

    broken = Params(deep_merge(base, {"lvm": {"toy": {**toy_section, "seeds": []}}}), "p.yaml")
    checks = {check.what: check for check in preflight.settings_checks(broken)}
    assert not checks["params lvm.toy"].ok
    assert "lvm.toy" in checks["params lvm.toy"].detail
