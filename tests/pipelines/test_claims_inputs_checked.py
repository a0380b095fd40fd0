"""The claims stage refuses inputs that are there but hold nothing, before it rewrites any
output (issue 47: an empty alpha_trajectories.json and an empty cells folder were judged)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learnable_sparsity.errors import LearnableSparsityError
from pipelines.stages.report.claims import check_inputs


@pytest.mark.parametrize("content", [{}, [], 3])
def test_an_empty_alpha_file_is_refused(tmp_path: Path, content: object) -> None:
    alphas = tmp_path / "alpha_trajectories.json"
    alphas.write_text(json.dumps(content))
    with pytest.raises(LearnableSparsityError, match=r"alpha_trajectories\.json holds no α"):
        check_inputs(alphas, tmp_path / "cells")


def test_an_empty_cells_folder_is_refused_and_absent_inputs_pass(tmp_path: Path) -> None:
    cells = tmp_path / "cells"
    check_inputs(tmp_path / "absent.json", cells)  # neither made: the claims are not measurable
    (cells / "toy" / "softmax" / "seed0").mkdir(parents=True)
    with pytest.raises(LearnableSparsityError, match=r"cells holds no cell's history\.json"):
        check_inputs(tmp_path / "absent.json", cells)
    (cells / "toy" / "softmax" / "seed0" / "history.json").write_text("{}")
    alphas = tmp_path / "alpha_trajectories.json"
    alphas.write_text(json.dumps({"toy/entmax/seed0": [{"step": 0, "alphas": {}}]}))
    check_inputs(alphas, cells)
