"""Preflight: everything the profile in ``params.yaml`` needs, checked before any stage runs.

``python -m pipelines.commands.preflight`` (``make repro`` runs it first) checks every params
section (all errors at once, not the first one a stage meets), the user's input files, the downloads
(in the cache, or their hosts reachable), GPUs and the Ray cluster where the profile asks for them,
the training precisions on the device the cells get, the MLflow store, the benchmark's reference
package and free disk space. It prints one line per
check, with what to do where one fails, and exits with status 1 if any does. It reads and probes
only: nothing is downloaded or written.

``--online`` also asks every URL the profile downloads from for its first byte (a one-byte
``Range`` request, which servers that mishandle ``HEAD`` answer too), cached or not: the HTTP
status, the size the server gives, and whether the answer is the file at all (a ``text/html``
answer is a licence, login or error page where an archive was expected). Digests cannot be
checked without the whole file: each line says whether one is pinned (checked at download) or
not (a manual download: never fetched). ``--profile NAME`` checks ``profiles/NAME.yaml`` applied
to the smoke params in memory, so ``python -m pipelines.commands.preflight --online --profile
paper`` tells in a minute what would fail hours into a run, without touching ``params.yaml``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import shutil
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch
import yaml
from huggingface_hub import constants as hub_constants
from huggingface_hub import try_to_load_from_cache
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from learnable_sparsity.analysis.heads import AnalysisSettings
from learnable_sparsity.ape.bert import BertSettings
from learnable_sparsity.ape.grid import ApeSettings
from learnable_sparsity.ape.triplets import SyntheticApeSettings
from learnable_sparsity.claims import results_from_json
from learnable_sparsity.data.bpe import BpeSettings
from learnable_sparsity.data.corpora import (
    DownloadedCorpus,
    LocalCorpus,
    SwordCorpus,
    corpus_settings,
)
from learnable_sparsity.data.datasets import EggGame, EggReleased, IdxImages, dataset_settings
from learnable_sparsity.data.fetch import USER_AGENT, WEB_PAGE_TYPES
from learnable_sparsity.data.idx_images import (
    IDX_FILES,
    IMAGE_DATASETS,
    RELEASED_SSVAE_SPLIT,
    SSVAE_SPLIT_FOLDER,
    SSVAE_SPLIT_URL,
)
from learnable_sparsity.data.registry import CORPORA, RemoteFile
from learnable_sparsity.data.signal_game import EGG_FOLDER, egg_members
from learnable_sparsity.data.sword import (
    MODULES,
    SYSTEM_LIBRARY,
    install_command,
    missing_modules,
    module_fingerprint,
)
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.grid import NmtSettings
from learnable_sparsity.nmt.speed import SpeedSettings
from learnable_sparsity.precision import unsupported
from learnable_sparsity.settings import Settings
from pipelines.commands.profile import PROFILES
from pipelines.lvm_experiments import LVM
from pipelines.scaffold import layout
from pipelines.scaffold.files import read_json
from pipelines.scaffold.params import Params, check_profile, load_params, with_profile
from pipelines.scaffold.runner import RaySettings
from pipelines.scaffold.tracking.store import (
    REFUSED_CODES,
    MlflowSettings,
    check_access,
    refused,
    tracking_uri,
)

# Every params section a stage reads, with the settings it becomes (the latent-variable
# experiments' sections, lvm.<name>, come from their records between "speed" and "ray").
_SECTIONS: dict[str, type[Settings]] = {
    "bpe": BpeSettings,
    "nmt": NmtSettings,
    "synthetic_ape": SyntheticApeSettings,
    "bert": BertSettings,
    "ape": ApeSettings,
    "analysis": AnalysisSettings,
    "speed": SpeedSettings,
    "ray": RaySettings,
    "mlflow": MlflowSettings,
}
# The training sections and the path to their precision setting in their settings (each
# experiment's LvmSettings.precision besides).
_PRECISION_OF: dict[str, tuple[str, ...]] = {
    "nmt": ("train", "precision"),
    "ape": ("train", "precision"),
}


def sections() -> dict[str, type[Settings]]:
    """Every params section with its settings class, ``lvm.<name>`` for each record of
    ``pipelines.lvm_experiments.LVM``."""
    keys = list(_SECTIONS)
    before, after = keys[: keys.index("ray")], keys[keys.index("ray") :]
    return {
        **{key: _SECTIONS[key] for key in before},
        **{f"lvm.{name}": experiment.task().settings for name, experiment in LVM.items()},
        **{key: _SECTIONS[key] for key in after},
    }


def precision_of() -> dict[str, tuple[str, ...]]:
    """The training sections and the path to their precision setting."""
    return {**_PRECISION_OF, **{f"lvm.{name}": ("precision",) for name in LVM}}


# Named entries of these sections are built by these functions.
ENTRIES: dict[str, Callable[[Any, str], Settings]] = {
    "corpora": corpus_settings,
    "images": dataset_settings,
}
PROBE_TIMEOUT_S = 5.0
MIN_FREE_GB = 2.0  # below this even the smoke profile's checkpoints and caches may not fit


@dataclass(frozen=True)
class Check:
    """One requirement: ``what`` it is, whether it is met, and the detail (what to do if not)."""

    what: str
    ok: bool
    detail: str = ""


def settings_checks(params: Params) -> Iterator[Check]:
    """Every params section and every named entry builds its settings."""
    for key, cls in sections().items():
        try:
            params.settings(key, cls)
            yield Check(f"params {key}", True)
        except LearnableSparsityError as error:
            yield Check(f"params {key}", False, str(error))
    for key, build_entry in ENTRIES.items():
        for name, data in params.get(key, dict).items():
            try:
                build_entry(data, f"{key}.{name}")
                yield Check(f"params {key}.{name}", True)
            except LearnableSparsityError as error:
                yield Check(f"params {key}.{name}", False, f"{params.source}: {error}")


def _reachable(url: str) -> str | None:
    """None if a TCP connection to ``url``'s host opens within the timeout, else why not."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as error:
        return f"{parts.hostname}:{port} is unreachable ({error})"
    return None


def _download_check(what: str, files: list[tuple[str, Path]]) -> Check:
    missing = [(url, path) for url, path in files if not path.is_file()]
    if not missing:
        return Check(what, True, f"{len(files)} files cached")
    problem = _reachable(missing[0][0])
    if problem is None:
        return Check(what, True, f"{len(missing)} of {len(files)} files to download")
    return Check(
        what,
        False,
        f"{len(missing)} files to download, but {problem}: download them once where the "
        f"network is reachable, or copy them into {missing[0][1].parent} (reused offline)",
    )


def _sword_check(what: str, name: str, corpus: SwordCorpus) -> Check:
    """The modules are in the configured library, or the system's, or their Debian packages
    are cached or reachable; a library's modules are those ``data/corpora/<name>`` was made
    from, if it was."""
    install = f"`{install_command(corpus.modules)}`"
    if corpus.library is not None:
        missing = missing_modules(Path(corpus.library), corpus.modules)
        if missing:
            return Check(what, False, f"{corpus.library} lacks {missing}; on Debian: {install}")
        return _sword_unchanged(what, name, Path(corpus.library), corpus)
    if not missing_modules(SYSTEM_LIBRARY, corpus.modules):
        return _sword_unchanged(what, name, SYSTEM_LIBRARY, corpus)
    packages = [MODULES[module].package.url for module in corpus.modules]
    files = [(url, Path(corpus.cache) / Path(url).name) for url in packages]
    check = _download_check(what, files)
    return check if check.ok else Check(what, False, f"{check.detail}; or install them: {install}")


def _sword_unchanged(what: str, name: str, library: Path, corpus: SwordCorpus) -> Check:
    """DVC does not see a library outside the project change (a package upgrade): compare its
    modules with the versions and digests ``data/corpora/<name>/meta.json`` recorded."""
    meta_file = layout.corpus_dir(name) / "meta.json"
    recorded = read_json(meta_file).get("modules", {}) if meta_file.is_file() else {}
    changed = []
    for module in corpus.modules:
        now = module_fingerprint(library, module)
        if module in recorded and recorded[module] != now:
            before = recorded[module]
            changed.append(
                f"{module} (version {before['version']} → {now['version']}, SHA-256 "
                f"{before['sha256'][:12]}… → {now['sha256'][:12]}…)"
            )
    if changed:
        return Check(
            what,
            False,
            f"{library} holds other texts than {meta_file.parent} was made from: "
            f"{'; '.join(changed)}; `dvc repro -f corpora` remakes the corpus from them",
        )
    return Check(what, True, f"in {library}")


def input_checks(params: Params) -> Iterator[Check]:
    """The user's files exist in data/external; downloads are cached or reachable."""
    for name, corpus in _built(params, "corpora").items():
        if isinstance(corpus, LocalCorpus):
            paths = [Path(p) for pair in corpus.files.values() for p in pair]
            yield _file_check(f"corpus {name} (local files)", paths)
        elif isinstance(corpus, DownloadedCorpus):
            spec = CORPORA[corpus.name]
            root = Path(corpus.cache) / spec.name
            what = f"corpus {name} (download {spec.name})"
            manual = [
                r
                for r in spec.files
                if (r.url is None or r.sha256 is None) and not (root / r.name).is_file()
            ]
            if manual:
                yield Check(
                    what,
                    False,
                    "manual download (no pinned digest)"
                    + "; ".join(f" {r.name}: get it from {r.url or r.page}" for r in manual)
                    + f"; check each and save it under {root} with that name",
                )
            else:
                urls = [(r.url, root / r.name) for r in spec.files if r.url is not None]
                yield _download_check(what, urls)
        elif isinstance(corpus, SwordCorpus):
            yield _sword_check(f"corpus {name} (SWORD modules {corpus.modules})", name, corpus)
    yield from bert_checks(params)
    for name, dataset in _built(params, "images").items():
        if isinstance(dataset, EggGame):
            paths = [Path(dataset.features), Path(dataset.labels)]
            yield _file_check(f"images {name} (EGG features)", paths)
        elif isinstance(dataset, IdxImages):
            files = [
                (remote.url, Path(dataset.cache) / folder / remote.name)
                for folder, remote in _image_files(dataset)
            ]
            yield _download_check(f"images {name} (download {dataset.source})", files)
        elif isinstance(dataset, EggReleased):
            root = Path(dataset.cache) / EGG_FOLDER
            what = f"images {name} (EGG's train/ and test/ folders)"
            if all(path.is_file() for path in egg_members(root)):
                yield Check(what, True, f"in {root}")
            elif dataset.sha256 is None:
                yield Check(
                    what,
                    False,
                    f"not in {root} and no sha256 pins {dataset.url}: put the folders there by "
                    "hand, or give the archive's digest (sha256)",
                )
            else:
                yield _download_check(what, [(dataset.url, root / "download")])


HUB = "https://huggingface.co"
# A one-byte probe waits longer than a TCP connect: some hosts redirect twice (Hugging Face to its
# CDN) before the first byte.
ONLINE_TIMEOUT_S = 20.0


def remote_files(params: Params) -> Iterator[tuple[str, RemoteFile]]:
    """(what, file) of every file the profile's downloads fetch, manual downloads included."""
    for name, corpus in _built(params, "corpora").items():
        if isinstance(corpus, DownloadedCorpus):
            for remote in CORPORA[corpus.name].files:
                yield f"corpus {name}: {remote.name}", remote
    for name, dataset in _built(params, "images").items():
        if isinstance(dataset, IdxImages):
            for _, remote in _image_files(dataset):
                yield f"images {name}: {remote.name}", remote
        elif isinstance(dataset, EggReleased):
            yield (
                f"images {name}: EGG's folders",
                RemoteFile("download", dataset.url, dataset.sha256),
            )


def _image_files(dataset: IdxImages) -> list[tuple[str, RemoteFile]]:
    """(cache folder, file) of every download of an idx image set, its split's files included."""
    spec = IMAGE_DATASETS[dataset.source]
    base = spec.base_url.rstrip("/")
    files = [
        (spec.name, RemoteFile(f, f"{base}/{f}", spec.sha256.get(f))) for f in IDX_FILES.values()
    ]
    if dataset.split == "released_ssvae":
        split = SSVAE_SPLIT_URL.rstrip("/")
        files += [
            (SSVAE_SPLIT_FOLDER, RemoteFile(f, f"{split}/{f}", sha256))
            for f, sha256, _ in RELEASED_SSVAE_SPLIT.values()
        ]
    return files


def _size(headers: Any) -> int | None:
    """The whole file's size from a ranged answer (``Content-Range: bytes 0-0/N``) or a full one."""
    total = headers.get("Content-Range", "").rpartition("/")[2]
    if total.isdigit():
        return int(total)
    length = headers.get("Content-Length", "")
    return int(length) if length.isdigit() else None


def url_check(what: str, url: str, sha256: str | None, timeout: float = ONLINE_TIMEOUT_S) -> Check:
    """Ask ``url`` for its first byte: is it there, how large, and a file rather than a page?"""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, "Range": "bytes=0-0"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, headers = response.status, response.headers
    except urllib.error.HTTPError as error:
        return Check(what, False, f"{url}: HTTP {error.code} {error.reason}")
    except (urllib.error.URLError, OSError) as error:
        return Check(what, False, f"{url}: unreachable ({getattr(error, 'reason', error)})")
    kind = headers.get("Content-Type", "").lower()
    if kind.startswith(WEB_PAGE_TYPES):
        return Check(
            what,
            False,
            f"{url}: HTTP {status} answers a web page ({kind}), not the file (a licence or login "
            "page?): download it in a browser into the corpus cache, where it is used as it is",
        )
    size = _size(headers)
    digest = "SHA-256 pinned" if sha256 else "no pinned digest (a manual download: never fetched)"
    shown = f"{size / 1e6:,.1f} MB" if size is not None else "size not given"
    return Check(what, True, f"HTTP {status}, {shown}, {digest}: {url}")


def online_checks(params: Params) -> Iterator[Check]:
    """Every URL the profile downloads from answers with a file (``--online``)."""
    for what, remote in remote_files(params):
        if remote.url is None:
            yield Check(what, True, f"a manual download (not probed): {remote.page}")
        else:
            yield url_check(what, remote.url, remote.sha256)


def bert_checks(params: Params) -> Iterator[Check]:
    """A BERT named by ``bert.name_or_path`` is a directory, in the Hugging Face cache, or the
    hub is reachable (and not switched off by HF_HUB_OFFLINE)."""
    try:
        bert = params.settings("bert", BertSettings)
    except LearnableSparsityError:
        return  # reported by settings_checks
    name = bert.name_or_path
    if name is None:
        return
    what = f"BERT {name}"
    if Path(name).expanduser().is_dir():
        yield Check(what, True, "a local directory")
        return
    cache = bert.cache_dir or hub_constants.HF_HUB_CACHE
    if isinstance(try_to_load_from_cache(name, "config.json", cache_dir=cache), str):
        yield Check(what, True, f"in the Hugging Face cache {cache}")
        return
    problem = "HF_HUB_OFFLINE is set" if hub_constants.HF_HUB_OFFLINE else _reachable(HUB)
    if problem is None:
        yield Check(what, True, f"not cached; {HUB} reachable (downloads into {cache})")
    else:
        yield Check(
            what,
            False,
            f"not in the Hugging Face cache {cache} and {problem}: download it once with "
            f"`hf download {name} --cache-dir {cache}` on a machine with network access",
        )


def _built(params: Params, key: str) -> dict[str, Settings]:
    """The entries of ``key`` that build (the others are reported by settings_checks)."""
    built = {}
    for name, data in params.get(key, dict).items():
        try:
            built[name] = ENTRIES[key](data, f"{key}.{name}")
        except LearnableSparsityError:
            continue
    return built


def _file_check(what: str, paths: list[Path]) -> Check:
    external = layout.EXTERNAL.resolve()
    missing = [str(p) for p in paths if not p.is_file()]
    outside = [str(p) for p in paths if not p.resolve().is_relative_to(external)]
    if missing or outside:
        detail = f"missing: {missing}" if missing else ""
        if outside:
            detail += f"{'; ' if detail else ''}outside {layout.EXTERNAL}/: {outside}"
        return Check(what, False, detail + f" (put your files in {layout.EXTERNAL}/)")
    return Check(what, True, f"{len(paths)} files")


def compute_checks(params: Params) -> Iterator[Check]:
    """GPUs where cells ask for them; the Ray cluster where one is named."""
    try:
        ray = params.settings("ray", RaySettings)
    except LearnableSparsityError:
        return
    address = ray.address or os.environ.get("RAY_ADDRESS") or None
    if address:
        host, _, port = address.removeprefix("ray://").rpartition(":")
        if address == "auto" or not port.isdigit():
            yield Check("Ray cluster", True, f"{address!r}: connected when a stage starts")
        else:
            problem = _reachable(f"tcp://{host}:{port}")
            yield Check(f"Ray cluster {address}", problem is None, problem or "reachable")
    elif ray.task_gpus > 0:
        gpus = torch.cuda.device_count()
        yield Check(
            "GPUs",
            gpus >= ray.task_gpus,
            f"{gpus} visible, each cell asks for {ray.task_gpus}"
            + ("" if gpus else ": set ray.task_gpus: 0 or name a cluster (ray.address)"),
        )


def precision_checks(params: Params) -> Iterator[Check]:
    """Every training section's ``precision`` other than float32 runs on the device its cells
    get: a GPU of this machine when ``ray.task_gpus`` > 0, else the CPU (a cluster's GPUs are
    checked when a cell starts)."""
    try:
        ray = params.settings("ray", RaySettings)
    except LearnableSparsityError:
        return
    device = torch.device("cuda" if ray.task_gpus > 0 else "cpu")
    remote = ray.address or os.environ.get("RAY_ADDRESS")
    classes = sections()
    for section, path in precision_of().items():
        try:
            precision = functools.reduce(getattr, path, params.settings(section, classes[section]))
        except LearnableSparsityError:
            continue  # reported by settings_checks
        key = ".".join((section, *path))
        if precision == "float32":
            continue
        if device.type == "cuda" and remote:
            yield Check(f"params {key}", True, f"{precision!r}: checked on the cluster's GPUs")
            continue
        if device.type == "cuda" and not torch.cuda.is_available():
            continue  # reported by compute_checks
        reason = unsupported(precision, device)
        detail = f"{precision!r} on {device.type}"
        if reason is not None:
            detail = f"{params.source}: {key} is {precision!r}, which {reason}"
        yield Check(f"params {key}", reason is None, detail)


def tracking_check(experiment: str | None = None) -> Check:
    """The MLflow store can be written (a SQLite file's folder) or reached (a server, which
    takes the credentials given, if it asks for any, and lets their user log into
    ``experiment``: :func:`~pipelines.scaffold.tracking.store.check_access`). A malformed URI is a
    failed check, not a traceback."""
    try:
        uri = tracking_uri(Path.cwd())
    except LearnableSparsityError as error:
        return Check("MLflow store", False, str(error))
    if uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        writable = os.access(folder if folder.exists() else folder.parent, os.W_OK)
        return Check("MLflow store", writable, uri if writable else f"cannot write in {folder}")
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S).close()
        except (urllib.error.URLError, OSError) as error:
            return Check("MLflow server", False, f"{uri} does not answer ({error})")
        try:  # /health answers anyone; a server with authentication refuses the API
            MlflowClient(uri).search_experiments(max_results=1)
            if experiment is not None:
                check_access(uri, experiment)
        except MlflowException as error:
            refusal = error.error_code in REFUSED_CODES
            return Check(
                "MLflow server", False, str(refused(error, uri)) if refusal else str(error)
            )
        except LearnableSparsityError as error:
            return Check("MLflow server", False, str(error))
        return Check("MLflow server", True, uri)
    return Check("MLflow store", True, uri)


def profile_check(params: Params) -> Check:
    """The profile is one every stage knows (a typo would label every run with it)."""
    try:
        return Check("profile", True, check_profile(params))
    except LearnableSparsityError as error:
        return Check("profile", False, str(error))


def _experiment(params: Params) -> str | None:
    """The experiment the stages log to; None where params mlflow is broken (reported by
    settings_checks)."""
    try:
        return params.settings("mlflow", MlflowSettings).experiment
    except LearnableSparsityError:
        return None


def record_checks(dvc_file: Path = Path("dvc.yaml")) -> Iterator[Check]:
    """Every evidence record that stage rejudge judges (its ``foreach`` in ``dvc.yaml``) holds
    the results and provenance it reads, in a format this code reads."""
    if not dvc_file.is_file():
        return
    stages = yaml.safe_load(dvc_file.read_text(encoding="utf-8")).get("stages", {})
    for name in stages.get("rejudge", {}).get("foreach", []):
        folder = layout.record(name)
        what = f"evidence record {name} (rejudge@{name})"
        try:
            read_json(folder / layout.RECORD_META)
            results = folder / layout.RECORD_RESULTS
            results_from_json(read_json(results), str(results))
        except LearnableSparsityError as error:
            yield Check(
                what,
                False,
                f"{error} (keep one with `python -m pipelines.commands.record {name}`, or take "
                f"{name} out of the foreach of stage rejudge in dvc.yaml)",
            )
            continue
        yield Check(what, True, str(folder))


def environment_checks() -> Iterator[Check]:
    """The benchmark's reference package and free disk space."""
    found = importlib.util.find_spec("entmax") is not None
    yield Check(
        "entmax package (benchmark)",
        found,
        "" if found else "make test installs it (the lock, requirements/)",
    )
    free = shutil.disk_usage(Path.cwd()).free / 1e9
    yield Check("free disk space", free >= MIN_FREE_GB, f"{free:.1f} GB")


def preflight(params: Params) -> list[Check]:
    """Every check, in order."""
    return [
        *settings_checks(params),
        *input_checks(params),
        *compute_checks(params),
        *precision_checks(params),
        profile_check(params),
        tracking_check(_experiment(params)),
        *record_checks(),
        *environment_checks(),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="check profiles/PROFILE.yaml applied to params.yaml")
    parser.add_argument("--online", action="store_true", help="probe every download URL")
    args = parser.parse_args()
    try:
        params = load_params()
        if args.profile:
            params = with_profile(params, args.profile, PROFILES)
        profile = params.get("profile", str)
    except LearnableSparsityError as error:
        print(f"preflight: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    checks = preflight(params) + (list(online_checks(params)) if args.online else [])
    width = max(len(check.what) for check in checks)
    print(f"preflight of the {profile!r} profile ({layout.DATA.resolve().parent}):")
    for check in checks:
        print(f"  {'ok  ' if check.ok else 'FAIL'}  {check.what:<{width}}  {check.detail}")
    failed = [check for check in checks if not check.ok]
    if failed:
        print(f"preflight: {len(failed)} of {len(checks)} checks failed", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
