"""A stage's declared inputs: the ``deps`` of its ``dvc.yaml`` entry that another stage writes.

``dvc repro`` runs a stage only once its inputs are there; a stage run alone (``python -m
pipelines.<stage>``, in a fresh clone, say) must not silently compute on part of them — the
claims stage's gates, for one, would vanish with a missing curve file. :func:`require_inputs`
refuses before any work, naming each missing input and the stage that writes it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from learnable_sparsity.errors import MissingInputError
from pipelines.scaffold.imports import ROOT

_ITEM = re.compile(r"\$\{item\}")


def _path(entry: str | dict[str, Any]) -> str:
    """The path of a ``deps``/``outs`` entry (a string, or a one-key mapping with options)."""
    return entry if isinstance(entry, str) else next(iter(entry))


def stages(dvc_yaml: Path) -> dict[str, dict[str, list[str]]]:
    """Stage name (``name`` or ``name@item`` of a ``foreach``) → its ``deps`` and ``outs``."""
    found = {}
    for name, entry in yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"].items():
        items = entry.get("foreach")
        body = entry.get("do", entry)
        for item in items if items is not None else [None]:
            paths = {key: [_path(e) for e in body.get(key, [])] for key in ("deps", "outs")}
            if item is not None:
                paths = {k: [_ITEM.sub(str(item), p) for p in v] for k, v in paths.items()}
            found[name if item is None else f"{name}@{item}"] = paths
    return found


def declared_inputs(stage: str, dvc_yaml: Path = ROOT / "dvc.yaml") -> dict[str, str]:
    """The inputs of ``stage`` that other stages write: path → the stage that writes it (a dep
    equal to, or inside, another stage's output)."""
    every = stages(dvc_yaml)
    if stage not in every:
        return {}
    writers = {out: name for name, paths in every.items() for out in paths["outs"]}
    inputs = {}
    for dep in every[stage]["deps"]:
        for out, writer in writers.items():
            if writer != stage and (dep == out or dep.startswith(f"{out}/")):
                inputs[dep] = writer
    return inputs


def require_inputs(stage: str, root: Path = ROOT) -> None:
    """Raise :class:`MissingInputError` naming every declared input of ``stage`` (a DVC stage
    name) that is missing under ``root``, and the stage that writes it."""
    if not (root / "dvc.yaml").is_file():  # not a checkout of the project (a sweep's trial)
        return
    missing = {
        dep: writer
        for dep, writer in declared_inputs(stage, root / "dvc.yaml").items()
        if not (root / dep).exists()
    }
    if missing:
        listed = "; ".join(f"{dep} (written by stage {writer})" for dep, writer in missing.items())
        makers = " ".join(sorted(set(missing.values())))
        raise MissingInputError(
            f"{stage} reads what is not here: {listed}. Run `dvc repro {stage}`, or the stages "
            f"that write them first (`dvc repro {makers}`)"
        )
