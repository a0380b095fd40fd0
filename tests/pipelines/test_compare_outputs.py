"""`python -m pipelines.commands.compare_outputs` (the end of `make repro`): outputs against the
commit, per file and per verdict, on a small repository made here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from pipelines.commands import compare_outputs


def _claims(status: str, part: str, evidence: str) -> str:
    claim = {
        "id": "marg_ssvae_sampling_below",
        "status": status,
        "evidence": evidence,
        "numbers": {"sfe": {"status": part, "accuracy": 0.5}, "note": "text"},
    }
    return json.dumps({"claims": [claim]})


def _repository(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    files = {
        "results/claims/claims.json": _claims("reproduced", "reproduced", "sfe 0.41 < 0.52"),
        "results/train_lvm/ssvae.json": json.dumps({"sfe": {"acc": [0.25, 0.5]}, "flag": True}),
        "results/train_nmt/valid_nll.csv": "step,nll\n1,2.5\n2,1.25\n",
        "reports/tables/bleu.md": "| variant | BLEU |\n|---|---|\n| softmax | 47.17 |\n",
        "reports/figure.png": "PNG text",
        "results/same.json": "{}",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "outputs"], cwd=root, check=True)
    return root


def test_identical_outputs_say_so(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    assert compare_outputs.main(["--root", str(root)]) == 0
    text = (root / "results" / "comparison.md").read_text()
    assert "0 output file(s) differ; 0 verdict(s) moved: the outputs are the committed ones" in text


def test_numbers_and_verdicts_that_moved_are_measured_and_named(tmp_path: Path, capsys) -> None:
    root = _repository(tmp_path)
    (root / "results/train_lvm/ssvae.json").write_text(
        json.dumps({"sfe": {"acc": [0.25, 0.75]}, "flag": False})
    )
    (root / "results/train_nmt/valid_nll.csv").write_text("step,nll\n1,2.5\n2,1.5\n")
    (root / "reports/tables/bleu.md").write_text(
        "| variant | BLEU |\n|---|---|\n| softmax | 47.47 |\n"
    )
    (root / "reports/figure.png").write_text("PNG other")
    (root / "results/claims/claims.json").write_text(
        _claims("not reproduced", "not reproduced", "sfe 0.55 >= 0.52")
    )
    compare_outputs.main(["--root", str(root)])
    report = json.loads((root / "results" / "comparison.json").read_text())
    by_path = {entry["path"]: entry for entry in report["files"]}
    assert "results/same.json" not in by_path
    lvm = by_path["results/train_lvm/ssvae.json"]
    assert (lvm["kind"], lvm["numbers"], lvm["moved"]) == ("json", 2, 1)  # a bool is no number
    assert (lvm["max_abs"], lvm["max_rel"], lvm["max_abs_at"]) == (0.25, 0.5, "sfe.acc[1]")
    nll = by_path["results/train_nmt/valid_nll.csv"]
    assert (nll["moved"], nll["max_abs"], nll["max_abs_at"]) == (1, 0.25, "row 2 column 1")
    table = by_path["reports/tables/bleu.md"]
    assert table["changed_lines"] == 1 and abs(table["max_abs"] - 0.3) < 1e-9
    assert by_path["reports/figure.png"]["kind"] == "binary"
    [move] = report["moved_verdicts"]
    assert (move["run"], move["claim"]) == ("smoke", "marg_ssvae_sampling_below")
    assert (move["before"], move["after"]) == ("reproduced", "not reproduced")
    assert move["parts"] == {"sfe": ["reproduced", "not reproduced"]}
    printed = capsys.readouterr().out
    assert "5 output file(s) differ; 1 verdict(s) moved." in printed
    assert "**smoke `marg_ssvae_sampling_below`: reproduced → not reproduced**" in printed
    assert "before: sfe 0.41 < 0.52" in printed and "after: sfe 0.55 >= 0.52" in printed
    # comparing changes nothing that git tracks
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True
    )
    assert "comparison" not in status.stdout.decode()


def test_digests_in_text_are_names_not_numbers(tmp_path: Path) -> None:
    """dvc.lock's md5s changed with a stage: only the size that moved is a number that moved (a
    digest's digit runs read as numbers would be moves, "9e999" one to infinity)."""
    root = _repository(tmp_path)
    lock = root / "dvc.lock"
    lock.write_text("outs:\n- md5: 76434b01dda24b893257ca4e58254740.dir\n  size: 1000\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "add", "dvc.lock"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "lock"], cwd=root, check=True)
    lock.write_text("outs:\n- md5: 1f2a9e999d0b4c8d7e6f5a4b3c2d1e0f.dir\n  size: 1010\n")
    compare_outputs.main(["--root", str(root)])
    [entry] = json.loads((root / "results" / "comparison.json").read_text())["files"]
    assert (entry["path"], entry["numbers"], entry["moved"]) == ("dvc.lock", 1, 1)
    assert (entry["max_abs"], entry["max_abs_at"]) == (10, "line 3 number 0")
