"""The preflight: every missing requirement of a profile is listed at once, before any stage."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from learnable_sparsity.claims import Results, results_to_json
from learnable_sparsity.data import sword
from learnable_sparsity.data.registry import CORPORA
from pipelines.commands import preflight
from pipelines.commands.preflight import Check
from pipelines.scaffold.params import Params, deep_merge, load_params, with_profile
from pipelines.scaffold.stage import Stage
from pipelines.stages.nmt import corpora
from tests.data.sword_fixture import slots_of, write_module
from tests.loopback import LoopbackServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project folder with the smoke params, as the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    return tmp_path


def smoke_with(change: dict) -> Params:
    return Params(deep_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), change), "p.yaml")


def failed(params: Params) -> dict[str, str]:
    return {c.what: c.detail for c in preflight.preflight(params) if not c.ok}


def test_the_smoke_profile_needs_nothing_more(project: Path) -> None:
    assert failed(smoke_with({})) == {}
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)  # the store is at its root
    command = [sys.executable, "-m", "pipelines.commands.preflight"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "preflight of the 'smoke' profile" in result.stdout and "FAIL" not in result.stdout
    assert f"sqlite:///{project.resolve()}/mlflow.db" in result.stdout


def test_outside_a_git_repository_the_store_must_be_named(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray job's working directory has no .git: a store made there would be lost."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(project.parent))
    assert "MLFLOW_TRACKING_URI" in failed(smoke_with({}))["MLflow store"]


def test_every_bad_section_is_listed_not_only_the_first(project: Path) -> None:
    params = smoke_with(
        {
            "nmt": {"train": {"peak_lr": -1}},
            "speed": {"variants": ["topk"]},
            "bpe": {"vocab_size": 2},
        }
    )
    problems = failed(params)
    assert set(problems) == {"params nmt", "params speed", "params bpe"}
    assert "p.yaml: nmt.train.peak_lr must be > 0" in problems["params nmt"]


def test_missing_and_misplaced_user_files(project: Path) -> None:
    (project / "data/external").mkdir(parents=True)
    (project / "data/external/train.src").write_text("x\n")
    (project / "elsewhere.tgt").write_text("y\n")
    files = {
        "train": ["data/external/train.src", "elsewhere.tgt"],
        "valid": ["data/external/valid.src", "data/external/valid.tgt"],
        "test": ["data/external/test.src", "data/external/test.tgt"],
    }
    problems = failed(smoke_with({"corpora": {"mine": {"source": "local", "files": files}}}))
    detail = problems["corpus mine (local files)"]
    assert "missing: ['data/external/valid.src', 'data/external/valid.tgt'" in detail
    assert "outside data/external/: ['elsewhere.tgt']" in detail


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_downloads_are_cached_or_reachable(tmp_path: Path) -> None:
    cached = tmp_path / "cache" / "a.gz"
    cached.parent.mkdir()
    cached.write_bytes(b"x")
    assert preflight._download_check("cached", [("http://127.0.0.1:1/a.gz", cached)]).ok
    with socket.socket() as server:  # something listens: the download can start
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"http://127.0.0.1:{server.getsockname()[1]}/b.gz"
        assert preflight._download_check("reachable", [(url, tmp_path / "b.gz")]).ok
    url = f"http://127.0.0.1:{_closed_port()}/b.gz"
    check = preflight._download_check("offline", [(url, tmp_path / "cache" / "b.gz")])
    assert (
        not check.ok and "unreachable" in check.detail and str(tmp_path / "cache") in check.detail
    )


def test_sword_modules_must_be_installed_or_their_packages_reachable(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = {"source": "sword", "sizes": {"valid": 10, "test": 10}, "cache": str(project / "c")}
    monkeypatch.setattr(preflight, "SYSTEM_LIBRARY", project / "no-system-library")
    offline = f"http://127.0.0.1:{_closed_port()}/pool"
    for name, deb in (("spaRV1909eb", "sword-text-sparv"), ("engWEB2015eb", "sword-text-web")):
        lang = preflight.MODULES[name].lang
        package = sword.DebianPackage(f"{offline}/{deb}_1_all.deb", "0" * 64)
        monkeypatch.setitem(preflight.MODULES, name, sword.Module(lang, package))
    what = "corpus bible (SWORD modules ['spaRV1909eb', 'engWEB2015eb'])"
    detail = failed(smoke_with({"corpora": {"bible": entry}}))[what]
    assert "unreachable" in detail and "sudo apt install sword-text-sparv sword-text-web" in detail
    (project / "c").mkdir()
    for deb in ("sword-text-sparv", "sword-text-web"):
        (project / "c" / f"{deb}_1_all.deb").write_bytes(b"cached")
    assert what not in failed(smoke_with({"corpora": {"bible": entry}}))
    library = {"corpora": {"bible": {**entry, "library": str(project / "lib")}}}
    assert "lib lacks ['spaRV1909eb', 'engWEB2015eb']" in failed(smoke_with(library))[what]


def test_a_library_whose_modules_changed_since_the_corpus_was_made(project: Path) -> None:
    library = project / "lib"
    chapters = [["En el principio."], ["Y dijo Dios."], ["¿Dónde estás?"]]
    write_module(library, "spaRV1909eb", {"ot": slots_of({"Gen": chapters})})
    english = [["In the beginning."], ["God said."], ["Where are you?"]]
    write_module(library, "engWEB2015eb", {"ot": slots_of({"Gen": english})})
    entry = {"source": "sword", "sizes": {"valid": 1, "test": 1}, "library": str(library)}
    params = smoke_with({"corpora": {"bible": entry}})
    what = "corpus bible (SWORD modules ['spaRV1909eb', 'engWEB2015eb'])"
    assert what not in failed(params)  # no corpus made yet: nothing to compare
    only_bible = Params({**params.data, "corpora": {"bible": entry}}, "p.yaml")
    corpora.main(Stage("corpora", only_bible, "sqlite:///unused.db"))
    meta = json.loads((project / "data/corpora/bible/meta.json").read_text())
    assert meta["modules"]["spaRV1909eb"] == sword.module_fingerprint(library, "spaRV1909eb")
    assert what not in failed(params)  # the texts it was made from
    english[2] = ["Where art thou?"]
    write_module(
        library, "engWEB2015eb", {"ot": slots_of({"Gen": english})}, conf={"Version": "2.0"}
    )
    detail = failed(params)[what]
    assert "engWEB2015eb (version unknown → 2.0" in detail and "spaRV1909eb" not in detail
    assert "`dvc repro -f corpora` remakes the corpus" in detail


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="this machine has a GPU")
def test_gpus_asked_of_a_machine_without_any(project: Path) -> None:
    problems = failed(smoke_with({"ray": {"task_gpus": 1}}))
    assert "set ray.task_gpus: 0" in problems["GPUs"]


def test_a_precision_the_cells_device_cannot_run(project: Path) -> None:
    """TF32 asked of CPU cells (ray.task_gpus 0) fails naming the key; bf16 runs on a CPU."""
    params = smoke_with(
        {"nmt": {"train": {"precision": "tf32"}}, "lvm": {"ssvae": {"precision": "bf16"}}}
    )
    checks = {c.what: c for c in preflight.preflight(params)}
    assert not checks["params nmt.train.precision"].ok
    assert "nmt.train.precision is 'tf32', which needs a CUDA device" in (
        checks["params nmt.train.precision"].detail
    )
    assert checks["params lvm.ssvae.precision"].ok
    assert "params ape.train.precision" not in checks  # float32: nothing to check


def test_an_unreachable_cluster(project: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    problems = failed(smoke_with({"ray": {"address": address}}))
    assert "unreachable" in problems[f"Ray cluster {address}"]


def test_a_hub_bert_must_be_cached_or_reachable(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "bert-base-multilingual-cased"
    cache = project / "hf-cache"
    monkeypatch.setattr(preflight.hub_constants, "HF_HUB_OFFLINE", True)
    params = smoke_with({"bert": {"name_or_path": name, "cache_dir": str(cache)}})
    detail = failed(params)[f"BERT {name}"]
    assert str(cache) in detail and "HF_HUB_OFFLINE" in detail and "hf download" in detail
    # The same name cached (a snapshot with its config.json) passes offline.
    snapshot = cache / f"models--{name}" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / f"models--{name}" / "refs").mkdir()
    (cache / f"models--{name}" / "refs" / "main").write_text("abc123")
    assert f"BERT {name}" not in failed(params)
    # A directory written by save_pretrained is used as it is.
    local = project / "my-bert"
    local.mkdir()
    assert failed(smoke_with({"bert": {"name_or_path": str(local)}})) == {}


def test_every_evidence_record_the_dvc_file_judges_is_there(project: Path) -> None:
    stages = {"stages": {"rejudge": {"foreach": ["evidence"], "do": {"cmd": "x"}}}}
    (project / "dvc.yaml").write_text(yaml.safe_dump(stages))
    problem = failed(smoke_with({}))["evidence record evidence (rejudge@evidence)"]
    assert "reports/evidence/record.json is missing" in problem
    assert "python -m pipelines.commands.record evidence" in problem
    folder = project / "reports" / "evidence"
    folder.mkdir(parents=True)
    (folder / "record.json").write_text("{}")
    (folder / "results.json").write_text('{"format": 0}')
    problem = failed(smoke_with({}))["evidence record evidence (rejudge@evidence)"]
    assert "results format 0" in problem
    (folder / "results.json").write_text(json.dumps(results_to_json(Results())))
    assert failed(smoke_with({})) == {}


def test_online_a_file_a_page_a_missing_file_and_a_dead_host(server: LoopbackServer) -> None:
    """``--online`` asks each URL for one byte: a file passes with its size; a web page where an
    archive was expected (a licence form), an HTTP error and an unreachable host fail, named."""
    server.files["/data.tgz"] = b"x" * 2_500_000
    server.files["/licence"] = b"<html>accept the licence</html>"
    server.content_types["/licence"] = "text/html; charset=utf-8"
    file = preflight.url_check("file", server.url("/data.tgz"), "ab" * 32)
    assert file.ok and "HTTP 206, 2.5 MB, SHA-256 pinned" in file.detail
    assert server.requests[-1] == ("/data.tgz", "bytes=0-0")  # one byte, not the file
    unpinned = preflight.url_check("file", server.url("/data.tgz"), None)
    assert unpinned.ok and "a manual download: never fetched" in unpinned.detail
    page = preflight.url_check("page", server.url("/licence"), None)
    assert not page.ok and "web page (text/html" in page.detail and "/licence" in page.detail
    missing = preflight.url_check("missing", server.url("/gone.zip"), None)
    assert not missing.ok and "HTTP 404" in missing.detail and "/gone.zip" in missing.detail
    dead = preflight.url_check("dead", f"http://127.0.0.1:{_closed_port()}/a.gz", None, timeout=2)
    assert not dead.ok and "unreachable" in dead.detail


def test_online_checks_every_file_of_the_profiles_downloads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The paper profile's URLs: every corpus file of the registry and every image file; a
    manual download is named with its page, not probed."""
    params = with_profile(load_params(ROOT / "params.yaml"), "paper", ROOT / "profiles")
    probed: list[str] = []
    monkeypatch.setattr(
        preflight, "url_check", lambda what, url, sha256: probed.append(url) or Check(what, True)
    )
    checks = {check.what: check for check in preflight.online_checks(params)}
    urls = set(probed)
    assert {r.url for r in CORPORA["wmt_ape_pbsmt_en_de"].files if r.url is not None} <= urls
    manual = checks["corpus wmt_ape_pbsmt_en_de: wmt18_test_pbsmt"]
    assert (
        manual.ok and "manual download (not probed): https://www.statmt.org/wmt18" in manual.detail
    )
    assert {remote.url for remote in CORPORA["iwslt14_de_en"].files} <= urls
    assert "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz" in urls
    assert any(url.endswith("/test_train_splits/labeled_train_indx.npy") for url in urls)
    assert not list(preflight.remote_files(smoke_with({})))  # smoke downloads nothing


def test_the_command_line_checks_a_profile_without_rewriting_params(project: Path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    before = (project / "params.yaml").read_text()
    (project / "profiles").mkdir()
    (project / "profiles" / "paper.yaml").write_text((ROOT / "profiles/paper.yaml").read_text())
    command = [sys.executable, "-m", "pipelines.commands.preflight", "--profile", "paper"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    assert "preflight of the 'paper' profile" in result.stdout
    assert "corpus wmt_ape_pbsmt_en_de" in result.stdout
    assert (project / "params.yaml").read_text() == before
