"""No code from data: every place in the package source (``learnable_sparsity/``, ``pipelines/``)
that deserialises or unpacks a file is listed here with a test that plants a payload in what it
reads and proves the payload is refused and never runs.

A pickle payload's ``__reduce__`` calls ``os.system`` to create a marker file; an archive payload
holds members that would write the marker outside the folder (an absolute name, ``../``, a
symbolic link named as a wanted file). The marker must never exist. The sweep (an AST walk for
the loaders' names) fails when a loader appears, moves or disappears without its entry in
:data:`SITES`: a new loader needs a payload test before it can land.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import pickle
import tarfile
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from learnable_sparsity.errors import LearnableSparsityError

if TYPE_CHECKING:
    from tests.loopback import LoopbackServer

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("learnable_sparsity", "pipelines")

# Dotted names that read a file into objects or unpack an archive. ``np.load`` is listed even
# with allow_pickle=False (its payload test proves the flag holds); ``yaml.safe_load`` is not.
LOADERS = {
    "pickle.load",
    "pickle.loads",
    "pickle.Unpickler",
    "torch.load",
    "np.load",
    "numpy.load",
    "yaml.load",
    "yaml.load_all",
    "yaml.unsafe_load",
    "yaml.full_load",
    "marshal.load",
    "marshal.loads",
    "shelve.open",
    "joblib.load",
    "dill.load",
    "dill.loads",
    "cloudpickle.load",
    "cloudpickle.loads",
    "pd.read_pickle",
    "pandas.read_pickle",
    "tarfile.open",
    "tarfile.TarFile",
    "zipfile.ZipFile",
    "*.extractall",
    "*.extract",
}
# Archive methods that write members to disk, whatever the archive object is called.
EXTRACTIONS = {"extract", "extractall"}
# A loader imported by name (``from pickle import loads``) would hide from the dotted-name walk.
LOADER_MODULES = {"pickle", "torch", "numpy", "yaml", "marshal", "shelve", "tarfile", "zipfile"}
LOADER_NAMES = {loader.rpartition(".")[2] for loader in LOADERS}


def _dotted(node: ast.Attribute) -> str:
    if isinstance(node.value, ast.Name) and node.attr not in EXTRACTIONS:
        return f"{node.value.id}.{node.attr}"
    return f"*.{node.attr}"


def loader_sites() -> Counter[tuple[str, str]]:
    """(file, loader) → how often the package source names it."""
    found: Counter[tuple[str, str]] = Counter()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(), relative)
            writers = {id(node.func) for node in ast.walk(tree) if _opens_to_write(node)}
            for node in ast.walk(tree):
                if id(node) in writers:
                    continue
                if isinstance(node, ast.Attribute) and _dotted(node) in LOADERS:
                    if _dotted(node) == "*.extract" and not _is_tar_extract(node):
                        continue
                    found[relative, _dotted(node)] += 1
                elif isinstance(node, ast.ImportFrom) and node.module in LOADER_MODULES:
                    for alias in node.names:
                        if alias.name in LOADER_NAMES:
                            found[relative, f"from {node.module} import {alias.name}"] += 1
    return found


def _opens_to_write(node: ast.AST) -> bool:
    """``tarfile.open(..., mode="w...")`` and the like: an archive written, never read."""
    if not isinstance(node, ast.Call):
        return False
    mode = next((k.value for k in node.keywords if k.arg == "mode"), None)
    return (
        isinstance(mode, ast.Constant)
        and isinstance(mode.value, str)
        and mode.value.startswith(("w", "x"))
    )


def _is_tar_extract(node: ast.Attribute) -> bool:
    """``x.extract(...)`` names a tar or zip member extraction unless ``x`` is an extractor
    (the corpus registry's ``extractor.extract``)."""
    return not (isinstance(node.value, ast.Attribute) and node.value.attr == "extractor")


class Payload:
    """A pickle that creates ``marker`` when it is loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tar_payload(marker: Path, wanted: str) -> bytes:
    """Members that would write ``marker``: by its absolute name, through ``../``, and through a
    symbolic link named ``wanted`` followed by a file of that name."""
    buffer = io.BytesIO()
    data = b"payload"
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in (str(marker), "../" * 30 + str(marker).lstrip("/")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(wanted)
        link.type, link.linkname = tarfile.SYMTYPE, str(marker)
        tar.addfile(link)
        info = tarfile.TarInfo(wanted)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _zip_payload(marker: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        zipped.writestr(str(marker), b"payload")
        zipped.writestr("../" * 30 + str(marker).lstrip("/"), b"payload")
    return buffer.getvalue()


# --------------------------------------------------------------------------- the payload tests


def _checkpoint(tmp_path: Path, marker: Path, server: LoopbackServer) -> None:
    from learnable_sparsity.files import load_file

    path = tmp_path / "last.pt"
    torch.save({"state": Payload(marker)}, path)
    with pytest.raises(LearnableSparsityError, match=r"refused: it holds posix\.system") as error:
        load_file(path)
    assert "weights_only" not in str(error.value)  # no advice to load it unsafely
    path.write_bytes(path.read_bytes()[:-30])  # truncated: unreadable, torch's advice left out
    with pytest.raises(LearnableSparsityError, match="cannot be read") as error:
        load_file(path)
    assert "weights_only" not in str(error.value)


def _egg_labels(tmp_path: Path, marker: Path, server: LoopbackServer) -> None:
    import h5py

    from learnable_sparsity.data.signal_game import load_egg_features

    with h5py.File(tmp_path / "feats.h5", "w") as handle:
        handle.create_dataset("dataset_1", data=np.ones((1, 2), np.float32))
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        (tmp_path / "labels").write_bytes(pickle.dumps([Payload(marker)], protocol=protocol))
        with pytest.raises(LearnableSparsityError, match=r"refused: it names posix\.system"):
            load_egg_features(tmp_path / "feats.h5", tmp_path / "labels")
    # an array of objects, rebuilt through numpy's allowed names, still refuses the payload
    (tmp_path / "labels").write_bytes(pickle.dumps(np.array([Payload(marker)], dtype=object)))
    with pytest.raises(LearnableSparsityError, match=r"refused: it names posix\.system"):
        load_egg_features(tmp_path / "feats.h5", tmp_path / "labels")


def _egg_archive(kind: str) -> Callable[[Path, Path, LoopbackServer], None]:
    def check(tmp_path: Path, marker: Path, server: LoopbackServer) -> None:
        from learnable_sparsity.data.signal_game import fetch_egg_folders

        wanted = "train/ours_images_single_sm0.objects"
        data = _tar_payload(marker, wanted) if kind == "tar" else _zip_payload(marker)
        server.files["/egg"] = data
        with pytest.raises(LearnableSparsityError, match="holds no"):
            fetch_egg_folders(tmp_path / "cache", server.url("/egg"), _sha(data), progress=False)
        unpacked = tmp_path / "cache" / "signal_game" / wanted
        if kind == "tar":  # the file member, written to its fixed path, not through the link
            assert unpacked.read_bytes() == b"payload" and not unpacked.is_symlink()

    return check


def _corpus_archive(kind: str) -> Callable[[Path, Path, LoopbackServer], None]:
    def check(tmp_path: Path, marker: Path, server: LoopbackServer) -> None:
        from learnable_sparsity.data.extractors import read_members

        archive = tmp_path / f"corpus.{kind}"
        archive.write_bytes(
            _tar_payload(marker, "train.src") if kind == "tar" else _zip_payload(marker)
        )
        with pytest.raises(LearnableSparsityError, match=r"no file|matches"):
            read_members(archive, ["absent.src"])

    return check


def _sword_package(tmp_path: Path, marker: Path, server: LoopbackServer) -> None:
    from learnable_sparsity.data import sword

    data = _tar_payload(marker, "usr/share/sword/mods.d/kjv.conf")
    header = f"{'data.tar.gz/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
    deb = tmp_path / "module.deb"
    deb.write_bytes(b"!<arch>\n" + header + data + b"\n" * (len(data) % 2))
    name = next(iter(sword.MODULES))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sword, "download", lambda *args, **kwargs: deb)
        library = sword.install_modules([name], tmp_path / "cache")
    written = library / "mods.d" / "kjv.conf"
    assert written.read_bytes() == b"payload" and not written.is_symlink()


def _npm_tarball(tmp_path: Path, marker: Path, server: LoopbackServer) -> None:
    from pipelines.commands import plots_page

    build = plots_page.BUILDS[0]
    tarball = tmp_path / "vega.tgz"
    tarball.write_bytes(_tar_payload(marker, build.path))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots_page, "download", lambda *args, **kwargs: tarball)
        with pytest.raises(LearnableSparsityError, match=r"not the pinned"):
            plots_page.fetch_build(build, tmp_path)


def _gpu_record(tmp_path: Path, marker: Path, server: LoopbackServer) -> None:
    from pipelines.commands import record

    source = tmp_path / "gpu"
    source.mkdir()
    (source / "grid.json").write_text('{"cells": {}}')
    (source / "grid.tar.gz").write_bytes(_tar_payload(marker, "cells/x"))
    with pytest.raises(tarfile.FilterError):
        record.keep_gpu("payload", source, reports=tmp_path / "reports")


def _params_file(tmp_path: Path, marker: Path, server: LoopbackServer) -> None:
    from pipelines.scaffold.params import load_params

    path = tmp_path / "params.yaml"
    path.write_text(f'seed: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(LearnableSparsityError, match="is not valid YAML"):
        load_params(path)


def _ssvae_split(tmp_path: Path, marker: Path, server: LoopbackServer) -> None:
    from learnable_sparsity.data import idx_images

    path = tmp_path / "indices.npy"
    np.save(path, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    arrays = SimpleNamespace(train_images=np.zeros((60_000, 1, 1), np.uint8))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(idx_images, "download", lambda *args, **kwargs: path)
        with pytest.raises(LearnableSparsityError, match=r"indices\.npy refused: Object arrays"):
            idx_images.released_ssvae_split(arrays, tmp_path)


PayloadTest = Callable[[Path, Path, "LoopbackServer"], None]
# (file, loader, how often the file names it) → the test that plants a payload where it reads.
SITES: dict[tuple[str, str, int], PayloadTest] = {
    ("learnable_sparsity/files.py", "torch.load", 1): _checkpoint,
    ("learnable_sparsity/data/signal_game.py", "pickle.Unpickler", 1): _egg_labels,
    ("learnable_sparsity/data/signal_game.py", "tarfile.open", 1): _egg_archive("tar"),
    ("learnable_sparsity/data/signal_game.py", "zipfile.ZipFile", 1): _egg_archive("zip"),
    ("learnable_sparsity/data/extractors.py", "tarfile.open", 1): _corpus_archive("tar"),
    ("learnable_sparsity/data/extractors.py", "zipfile.ZipFile", 1): _corpus_archive("zip"),
    ("learnable_sparsity/data/sword.py", "tarfile.open", 1): _sword_package,
    ("learnable_sparsity/data/idx_images.py", "np.load", 1): _ssvae_split,
    ("pipelines/commands/plots_page.py", "tarfile.open", 1): _npm_tarball,
    ("pipelines/commands/record.py", "tarfile.open", 1): _gpu_record,
    ("pipelines/commands/record.py", "*.extractall", 1): _gpu_record,
    ("pipelines/scaffold/params.py", "yaml.load", 1): _params_file,
}


def test_every_loader_in_the_package_has_a_payload_test() -> None:
    found = {(path, loader, count) for (path, loader), count in loader_sites().items()}
    listed = set(SITES)
    assert found == listed, (
        f"loaders without a payload test: {sorted(found - listed)}; "
        f"listed but not found (moved or removed?): {sorted(listed - found)}"
    )


def test_the_sweep_finds_a_new_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep is no tautology: a loader added to a copy of the tree is found."""
    package = tmp_path / "pipelines"
    package.mkdir()
    (package / "new.py").write_text(
        "import yaml\nfrom pickle import loads\n\n\ndef f(p):\n    return yaml.load(p)\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert loader_sites() == Counter(
        {("pipelines/new.py", "yaml.load"): 1, ("pipelines/new.py", "from pickle import loads"): 1}
    )


def test_the_payload_is_live(tmp_path: Path) -> None:
    """Unpickled without a guard, the payload does create its marker (so its absence means
    something)."""
    marker = tmp_path / "PWNED"
    pickle.loads(pickle.dumps(Payload(marker)))  # the control case: no guard
    assert marker.exists()


@pytest.mark.parametrize("site", list(SITES), ids=[f"{p}:{loader}" for p, loader, _ in SITES])
def test_a_planted_payload_is_refused_and_never_runs(
    site: tuple[str, str, int], tmp_path: Path, server: LoopbackServer
) -> None:
    marker = tmp_path / "outside" / "PWNED"
    marker.parent.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    SITES[site](work, marker, server)
    assert not marker.exists(), f"{site}: the payload ran"
    assert not any(marker.parent.iterdir())
