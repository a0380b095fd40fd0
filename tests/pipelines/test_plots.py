"""DVC plots: the long CSVs the stages write, the templates of ``.dvc/plots`` and the top-level
``plots:`` of ``dvc.yaml``, drawn by ``dvc plots show/diff --json`` in a temporary repository."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from dvc_render.vega import VegaRenderer

from learnable_sparsity.errors import LearnableSparsityError
from pipelines.cells.heads import js_csv
from pipelines.commands import plots_page
from pipelines.scaffold.plots import curves_csv, read_curves
from pipelines.stages.lvm.train_lvm import curve_csv, runs_csv
from pipelines.stages.nmt.train_nmt import alpha_csv
from tests.loopback import LoopbackServer

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / ".dvc" / "plots"
DVC = Path(sys.executable).with_name("dvc")
VARIANTS = ("softmax", "entmax_alpha")
LVM = {
    "ssvae": "accuracy",
    "signal_game": "communication_success",
    "bitvector_vae": "nll_bits_per_dim",
}


def _history(seed: int) -> dict:
    return {
        "train": [{"step": s, "loss": 5.0 - s / 10 - seed} for s in (10, 20)],
        "valid": [{"step": 20, "valid_nll": 2.0 + seed}],
        "alphas": [
            {"step": s, "alphas": {"encoder.self.layer0": [1.1, 1.5], "decoder.self.layer0": [1.2]}}
            for s in (10, 20)
        ],
    }


def _histories(seeds: tuple[int, ...]) -> dict[str, dict]:
    return {f"smoke/{v}/seed{s}": _history(s) for v in VARIANTS for s in seeds}


def _lvm(methods: tuple[str, ...], headline: str) -> dict[str, dict]:
    return {
        f"{method}/seed{seed}": {
            "metrics": {headline: 0.5 + seed / 10, "decoder_calls": 1.0 + index},
            "curves": {
                "loss": [[10, 20], [3.0, 2.0 - seed / 10]],
                "decoder_calls": [[10, 20], [2.0 + index, 1.0 + index]],
            },
        }
        for index, method in enumerate(methods)
        for seed in (0, 1)
    }


def test_long_csvs_have_one_row_per_point_with_series_and_run(tmp_path: Path) -> None:
    histories = _histories((0, 1))
    text = curves_csv(histories, "train", "loss")
    assert text.splitlines()[0] == "step,series,run,loss"
    (tmp_path / "loss.csv").write_text(text, encoding="utf-8")
    curves = read_curves(tmp_path / "loss.csv", "loss")
    assert set(curves) == {"smoke/softmax", "smoke/entmax_alpha"}
    assert curves["smoke/softmax"]["smoke/softmax/seed1"] == [(10.0, 3.0), (20.0, 2.0)]
    alphas = alpha_csv({key: history["alphas"] for key, history in histories.items()})
    assert alphas.splitlines()[0] == "step,facet,series,run,alpha"
    assert len(alphas.splitlines()) == 1 + len(histories) * 2 * 3  # steps × heads
    js = js_csv({"smoke/softmax/seed0": {"js": {"encoder.self.layer0": 0.1, "x": None}}})
    assert js.splitlines()[1] == "encoder.self.layer0,smoke/softmax,smoke/softmax/seed0,0.1"
    lvm = _lvm(("dense", "sparsemax"), "accuracy")
    assert curve_csv(lvm, "loss").splitlines()[1] == "10,dense,dense/seed0,3.0"
    calls = curve_csv(lvm, "decoder_calls").splitlines()
    assert calls[0] == "step,series,run,decoder_calls"
    assert calls[-1] == "20,sparsemax,sparsemax/seed1,2.0"
    assert runs_csv(lvm, "accuracy").splitlines()[:2] == [
        "series,run,decoder_calls,accuracy",
        "dense,dense/seed0,1.0,0.5",
    ]


@pytest.mark.parametrize("template", sorted(TEMPLATES.glob("*.json")), ids=lambda p: p.name)
def test_templates_are_vega_lite_with_the_dvc_anchors(template: Path) -> None:
    text = template.read_text(encoding="utf-8")
    spec = json.loads(text)
    assert "vega-lite" in spec["$schema"] and spec["data"] == {"values": "<DVC_METRIC_DATA>"}
    for anchor in ("<DVC_METRIC_X>", "<DVC_METRIC_Y>", "<DVC_METRIC_TITLE>"):
        assert f'"{anchor}"' in text
    encoding = spec.get("spec", spec)["encoding"]
    assert encoding["color"]["field"] == "series"
    assert "rev" in {encoding.get(c, {}).get("field") for c in ("strokeDash", "shape")}


def _top_level_plots() -> list[dict]:
    return yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["plots"]


def test_every_top_level_plot_draws_a_stage_output_with_a_committed_template() -> None:
    dvc_yaml = (REPO / "dvc.yaml").read_text(encoding="utf-8")
    for entry in _top_level_plots():
        ((name, plot),) = entry.items()
        assert (TEMPLATES / f"{plot['template']}.json").exists(), name
        for path in plot["y"]:
            stage_path = path.replace("ssvae", "${item}").replace("signal_game", "${item}")
            stage_path = stage_path.replace("bitvector_vae", "${item}")
            assert f"- {stage_path}:" in dvc_yaml.split("\nplots:")[0], (name, path)


def _write_plot_data(root: Path, seeds: tuple[int, ...]) -> dict[str, set[tuple[str, str]]]:
    """Sample files at every path the top-level plots read, written by the stages' writers;
    the (series, run) pairs of each."""
    histories = _histories(seeds)
    files = {
        "results/train_nmt/train_loss.csv": curves_csv(histories, "train", "loss"),
        "results/train_nmt/valid_nll.csv": curves_csv(histories, "valid", "valid_nll"),
        "results/train_nmt/alpha.csv": alpha_csv(
            {k: h["alphas"] for k, h in histories.items() if "entmax_alpha" in k}
        ),
        "results/analyze_heads/js.csv": js_csv(
            {k: {"js": {"encoder.self.layer0": 0.1, "decoder.self.layer0": 0.2}} for k in histories}
        ),
        "results/train_ape/valid_nll.csv": curves_csv(
            {f"low_resource/{system}/seed{s}": _history(s) for system in ("a", "b") for s in seeds},
            "valid",
            "valid_nll",
        ),
    }
    for experiment, headline in LVM.items():
        lvm = _lvm(("dense", "sparsemax"), headline)
        files[f"results/train_lvm/{experiment}/loss.csv"] = curve_csv(lvm, "loss")
        files[f"results/train_lvm/{experiment}/calls.csv"] = curve_csv(lvm, "decoder_calls")
        files[f"results/train_lvm/{experiment}/runs.csv"] = runs_csv(lvm, headline)
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8")
    return {
        relative: {(row["series"], row["run"]) for row in csv.DictReader(io.StringIO(text))}
        for relative, text in files.items()
    }


def _run(args: list[str], cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


def _plots_repository(root: Path) -> list[dict]:
    """A git and DVC repository at ``root`` with the project's top-level plots and templates
    and data for one seed (uncommitted); the plots."""
    plots = _top_level_plots()
    (root / "dvc.yaml").write_text(yaml.safe_dump({"plots": plots}), encoding="utf-8")
    _run(["git", "init", "-q"], root)
    _run([str(DVC), "init", "-q"], root)
    shutil.copytree(TEMPLATES, root / ".dvc" / "plots")
    _write_plot_data(root, (0,))
    return plots


NEEDS_DVC = pytest.mark.skipif(
    not DVC.exists() or shutil.which("git") is None, reason="needs dvc and git"
)


@NEEDS_DVC
def test_dvc_plots_show_and_diff_draw_every_series(tmp_path: Path) -> None:
    plots = _plots_repository(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    _run(["git", "add", "-A"], tmp_path)
    _run([*git, "commit", "-q", "-m", "one seed"], tmp_path)
    written = _write_plot_data(tmp_path, (0, 1))

    shown = json.loads(_run([str(DVC), "plots", "show", "--json"], tmp_path))["data"]
    assert set(shown) == {next(iter(entry)) for entry in plots}
    for entry in plots:
        ((name, plot),) = entry.items()
        ((path, _),) = plot["y"].items()
        (chart,) = shown[name]
        drawn = {(row["series"], row["run"]) for row in chart["content"]["data"]["values"]}
        assert drawn == written[path] and len({s for s, _ in drawn}) >= 2, name

    diffed = json.loads(_run([str(DVC), "plots", "diff", "--json", "HEAD"], tmp_path))["data"]
    for name, (chart,) in diffed.items():
        assert set(chart["revisions"]) == {"HEAD", "workspace"}, name
        assert {row["rev"] for row in chart["content"]["data"]["values"]} == {"HEAD", "workspace"}


def test_the_plots_page_inlines_the_pinned_builds_of_the_versions_dvc_loads() -> None:
    """The committed template (`.dvc/config` names it) holds each pinned build, unchanged (its
    recorded SHA-256), of the versions DVC's own page loads from the CDN, and the charts'
    placeholder but not DVC's script tags."""
    assert f"html_template = {plots_page.TEMPLATE.name}" in (REPO / ".dvc/config").read_text()
    template = (REPO / plots_page.TEMPLATE).read_text(encoding="utf-8")
    texts = plots_page.inlined(template)
    assert list(texts) == [build.package for build in plots_page.BUILDS]
    for build in plots_page.BUILDS:
        assert hashlib.sha256(texts[build.package].encode()).hexdigest() == build.sha256
        assert f"cdn.jsdelivr.net/npm/{build.package}" in VegaRenderer.SCRIPTS
    assert template.count(plots_page.CHARTS_PLACEHOLDER) == 1
    assert "{scripts}" not in template and "<script src" not in template


def test_a_build_is_checked_before_it_is_inlined(server: LoopbackServer, tmp_path: Path) -> None:
    """From a registry (a loopback one): the tarball and the file against their pinned digests,
    and a file that would end its script element early is refused, naming the package."""

    def publish(text: str) -> plots_page.NpmBuild:
        tarball = tmp_path / "tarball.tgz"
        with tarfile.open(tarball, "w:gz") as archive:
            data = text.encode()
            member = tarfile.TarInfo("package/build/x.min.js")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
        content = tarball.read_bytes()
        server.files["/x/-/x-1.0.0.tgz"] = content
        digest = hashlib.sha256(content).hexdigest()
        return plots_page.NpmBuild(
            "x", "1.0.0", "package/build/x.min.js", digest, hashlib.sha256(data).hexdigest()
        )

    registry = f"http://127.0.0.1:{server.server_address[1]}"
    build = publish("var x = 1;")
    assert plots_page.fetch_build(build, tmp_path / "a", registry) == "var x = 1;"
    other = plots_page.NpmBuild(
        build.name, build.version, build.path, build.tarball_sha256, "0" * 64
    )
    with pytest.raises(LearnableSparsityError, match=r"x@1\.0\.0: package/build/x\.min\.js has"):
        plots_page.fetch_build(other, tmp_path / "b", registry)
    build = publish('document.write("</script>");')
    with pytest.raises(LearnableSparsityError, match=r"x@1\.0\.0: .* holds \['</script'\]"):
        plots_page.fetch_build(build, tmp_path / "c", registry)


@pytest.mark.slow
@NEEDS_DVC
def test_the_html_page_draws_its_charts_offline(tmp_path: Path, browse: Callable[..., str]) -> None:
    """`dvc plots show` of the project's plots, opened in headless Chromium without network: with
    DVC's own page (Vega from a CDN) no chart is drawn; with the project's `.dvc/config` and
    template every chart is (vega-embed puts a canvas in each chart's element)."""
    plots = _plots_repository(tmp_path)
    _run([str(DVC), "plots", "show", "-o", "cdn"], tmp_path)
    cdn = browse((tmp_path / "cdn/index.html").as_uri(), tmp_path / "cdn.png", offline=True)
    assert "cdn.jsdelivr.net" in cdn and "<canvas" not in cdn
    shutil.copy(REPO / ".dvc/config", tmp_path / ".dvc/config")
    shutil.copy(REPO / plots_page.TEMPLATE, tmp_path / plots_page.TEMPLATE)
    _run([str(DVC), "plots", "show", "-o", "offline"], tmp_path)
    offline = browse(
        (tmp_path / "offline/index.html").as_uri(), tmp_path / "offline.png", offline=True
    )
    assert "cdn.jsdelivr.net" not in offline
    assert offline.count('class="vega-embed') == offline.count("<canvas") == len(plots)
