"""The DVC stages, one module per stage of ``dvc.yaml`` (``python -m <module>`` is its ``cmd``),
grouped by the line of work they serve. Each is a short ``main`` on :mod:`pipelines.scaffold`;
none imports another (``tests/pipelines/test_stage_dependencies.py``)."""

from __future__ import annotations

LINES: dict[str, tuple[str, ...]] = {
    "nmt": ("corpora", "bpe", "train_nmt", "evaluate_nmt", "analyze_heads", "speed"),
    "lvm": ("images", "train_lvm"),
    "ape": ("synthetic_ape", "pretrain_bert", "train_ape", "evaluate_ape"),
    "report": ("benchmark_normalizers", "claims", "rejudge", "tables"),
}
MODULES: dict[str, str] = {
    stage: f"pipelines.stages.{line}.{stage}" for line, stages in LINES.items() for stage in stages
}


def module(stage: str) -> str:
    """The module of DVC stage ``stage`` (a ``foreach`` item's ``train_lvm@ssvae`` included)."""
    name = stage.partition("@")[0]
    if name not in MODULES:
        raise KeyError(f"no stage {name!r}: the stages are {sorted(MODULES)}")
    return MODULES[name]
