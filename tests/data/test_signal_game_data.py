"""Tests for ``learnable_sparsity.data.signal_game``: the EGG feature/label loader on HDF5 + pickle files
written by the tests, EGG's released folders (downloaded from the loopback server of
tests/loopback.py) and the digits stand-in."""

from __future__ import annotations

import hashlib
import io
import pickle
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np
import pytest
import torch

from learnable_sparsity.data import datasets
from learnable_sparsity.data.signal_game import (
    GameData,
    digits_game_features,
    fetch_egg_folders,
    load_egg_features,
    released_egg_games,
    split_game_data,
)
from learnable_sparsity.errors import LearnableSparsityError

if TYPE_CHECKING:
    from tests.loopback import LoopbackServer

LABELS = ["dog", "cat", "dog", "car", "cat", "dog"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _features(rows: int = 6, dim: int = 8) -> np.ndarray:
    return np.random.default_rng(0).random((rows, dim), dtype=np.float32) + 0.1


def _write(
    tmp_path: Path, features: np.ndarray | None = None, labels: object = LABELS
) -> tuple[Path, Path]:
    features_path, labels_path = tmp_path / "feats.h5", tmp_path / "labels.objects"
    with h5py.File(features_path, "w") as handle:
        handle.create_dataset("dataset_1", data=_features() if features is None else features)
    labels_path.write_bytes(pickle.dumps(labels))
    return features_path, labels_path


def test_egg_loader_reads_normalises_and_numbers_concepts(tmp_path: Path) -> None:
    features_path, labels_path = _write(tmp_path)
    data = load_egg_features(features_path, labels_path)
    assert data.features.shape == (6, 8) and data.features.dtype == torch.float32
    assert torch.allclose(data.features.norm(dim=1), torch.ones(6))
    assert data.concepts.dtype == torch.int64
    assert data.concepts.tolist() == [0, 1, 0, 2, 1, 0]
    assert data.concept_names == ("dog", "cat", "car") and data.num_concepts == 3
    raw = load_egg_features(features_path, labels_path, normalize=False)
    np.testing.assert_allclose(raw.features.numpy(), _features())


def test_egg_loader_accepts_arrays_nested_datasets_and_a_named_dataset(tmp_path: Path) -> None:
    features_path, labels_path = _write(tmp_path, labels=np.array([3, 1, 3, 2, 1, 3]))
    with h5py.File(features_path, "a") as handle:
        handle.create_dataset("meta/ids", data=np.arange(6))  # not a 2-d float dataset
    data = load_egg_features(features_path, labels_path)
    assert data.concept_names == ("3", "1", "2")
    with h5py.File(features_path, "a") as handle:
        handle.create_dataset("group/probs", data=_features().astype(np.float64))
    with pytest.raises(LearnableSparsityError, match=r"feats\.h5 holds several"):
        load_egg_features(features_path, labels_path)
    named = load_egg_features(features_path, labels_path, dataset="group/probs", normalize=False)
    assert named.features.dtype == torch.float32 and named.features.shape == (6, 8)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize(
    "labels",
    [
        LABELS,
        tuple(LABELS),
        np.array(LABELS),
        np.array(LABELS, dtype=object),
        np.array([3, 1, 3, 2, 1, 3]),
        [np.int64(3), 1, 3, 2.0, frozenset({1}), b"x"],
    ],
    ids=["list", "tuple", "str array", "object array", "int array", "numpy scalars and sets"],
)
def test_egg_labels_as_plain_data_in_every_protocol(
    tmp_path: Path, labels: object, protocol: int
) -> None:
    """The restricted unpickler rebuilds what a label file holds (containers, numbers, strings,
    numpy arrays and scalars) from numpy's and pickle's every protocol."""
    features_path, labels_path = _write(tmp_path, labels=labels)
    labels_path.write_bytes(pickle.dumps(labels, protocol=protocol))
    data = load_egg_features(features_path, labels_path)
    expected = list(labels.tolist() if isinstance(labels, np.ndarray) else labels)
    assert data.concept_names == tuple(str(label) for label in dict.fromkeys(expected))


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing features", r"feature file .*absent\.h5 does not exist"),
        ("missing labels", r"label file .*absent\.objects does not exist"),
        ("not hdf5", r"feats\.h5 is not an HDF5 file"),
        ("no 2-d float", r"feats\.h5 has no 2-d float dataset"),
        ("unknown dataset", r"feats\.h5 has no 2-d float dataset 'fc7'"),
        ("nan row", r"feats\.h5.*row 2 holds NaN"),
        ("zero row", r"feats\.h5: feature row 1 has norm 0"),
        ("not a pickle", r"labels\.objects is not a readable pickle"),
        ("not a sequence", r"labels\.objects holds a dict"),
        ("a string", r"labels\.objects holds a str"),
        ("2-d labels", r"labels\.objects holds an array of shape \(2, 3\)"),
        ("unhashable label", r"labels\.objects: label 1 is an unhashable list"),
        ("count mismatch", r"labels\.objects has 5 labels .*feats\.h5 has 6 rows"),
    ],
)
def test_egg_loader_errors_name_the_file(tmp_path: Path, case: str, message: str) -> None:
    features_path, labels_path = _write(tmp_path)
    dataset = None
    if case == "missing features":
        features_path = tmp_path / "absent.h5"
    elif case == "missing labels":
        labels_path = tmp_path / "absent.objects"
    elif case == "not hdf5":
        features_path.write_bytes(b"not an hdf5 file")
    elif case == "no 2-d float":
        _write(tmp_path, features=np.arange(12).reshape(6, 2))
    elif case == "unknown dataset":
        dataset = "fc7"
    elif case in ("nan row", "zero row"):
        features = _features()
        features[2 if case == "nan row" else 1] = np.nan if case == "nan row" else 0.0
        _write(tmp_path, features=features)
    elif case == "not a pickle":
        labels_path.write_bytes(b"\x80\x04garbage")
    else:
        labels = {
            "not a sequence": {"dog": 0},
            "a string": "dogcat",
            "2-d labels": np.zeros((2, 3)),
            "unhashable label": ["dog", ["cat"], "dog", "car", "cat", "dog"],
            "count mismatch": LABELS[:5],
        }[case]
        _write(tmp_path, labels=labels)
    with pytest.raises(LearnableSparsityError, match=message):
        load_egg_features(features_path, labels_path, dataset=dataset)


def test_split_game_data_partitions_by_images() -> None:
    data = GameData(torch.arange(40.0).reshape(20, 2), torch.arange(20) % 4, ("a", "b", "c", "d"))
    splits = split_game_data(data, seed=0, valid_size=5, test_size=0.25)
    assert (len(splits.train), len(splits.valid), len(splits.test)) == (10, 5, 5)
    rows = torch.cat([splits.train.features, splits.valid.features, splits.test.features])
    assert torch.equal(torch.sort(rows[:, 0]).values, torch.arange(0.0, 40.0, 2.0))
    assert splits.test.num_concepts == 4
    with pytest.raises(LearnableSparsityError, match="leave none"):
        split_game_data(data, seed=0, valid_size=10, test_size=10)


def test_digits_game_features_are_deterministic_with_fine_concepts() -> None:
    first = digits_game_features(0, feature_dim=32, clusters_per_class=3)
    again = digits_game_features(0, feature_dim=32, clusters_per_class=3)
    other = digits_game_features(1, feature_dim=32, clusters_per_class=3)
    assert (len(first.train), len(first.valid), len(first.test)) == (1437, 180, 180)
    for name in ("train", "valid", "test"):
        split, same = getattr(first, name), getattr(again, name)
        assert torch.equal(split.features, same.features)
        assert torch.equal(split.concepts, same.concepts)
        assert split.features.shape[1] == 32 and split.features.dtype == torch.float32
        assert split.concepts.dtype == torch.int64
        assert torch.allclose(split.features.norm(dim=1), torch.ones(len(split)))
        assert split.features.min() >= 0
        assert split.num_concepts == 30
        assert split.concepts.min() >= 0 and split.concepts.max() < 30
    assert first.train.concepts.unique().numel() == 30
    assert first.test.concepts.unique().numel() >= 16  # 16 candidates of distinct concepts
    assert first.train.concept_names[4] == "digit1/cluster1"
    assert not torch.equal(first.test.features, other.test.features)
    pooled = torch.cat([first.train.features, first.valid.features, first.test.features])
    pooled_other = torch.cat([other.train.features, other.valid.features, other.test.features])
    assert torch.equal(  # same features, different split
        torch.unique(pooled, dim=0), torch.unique(pooled_other, dim=0)
    )
    with pytest.raises(LearnableSparsityError, match="clusters_per_class"):
        digits_game_features(0, clusters_per_class=0)
    with pytest.raises(LearnableSparsityError, match="feature_dim"):
        digits_game_features(0, feature_dim=0)


def _egg_folders(tmp_path: Path) -> dict[str, bytes]:
    """EGG's released layout as one tar.gz: signaling_game_data/{train,test}/<the two files>;
    the test folder shows a concept the training folder lacks and one it shares."""
    parts = {"train": (_features(6), LABELS), "test": (_features(3, 8) * 2, ["car", "bird", "dog"])}
    staging = tmp_path / "staging" / "signaling_game_data"
    for part, (features, labels) in parts.items():
        folder = staging / part
        folder.mkdir(parents=True)
        with h5py.File(folder / "ours_images_single_sm0.h5", "w") as handle:
            handle.create_dataset("dataset_1", data=features)
        (folder / "ours_images_single_sm0.objects").write_bytes(pickle.dumps(labels))
        (folder / "ours_images_paths_sm0.objects").write_bytes(pickle.dumps(["a"] * len(labels)))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(staging, arcname="signaling_game_data")
    return {"tar": buffer.getvalue()}


def test_egg_folders_download_unpack_and_split_as_released(
    server: LoopbackServer, tmp_path: Path
) -> None:
    archive = _egg_folders(tmp_path)["tar"]
    server.files["/signaling_game_data"] = archive
    url = server.url("/signaling_game_data")
    with pytest.raises(LearnableSparsityError, match=r"no SHA-256 is pinned .*by hand"):
        fetch_egg_folders(tmp_path / "cache", url, progress=False)
    assert server.requests == [] and not (tmp_path / "cache").exists()
    root = fetch_egg_folders(tmp_path / "cache", url, _sha(archive), progress=False)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*.h5")) == [
        "test/ours_images_single_sm0.h5",
        "train/ours_images_single_sm0.h5",
    ]
    games = released_egg_games(root)
    assert games.valid is games.train  # validation games are drawn from the training images
    assert games.train.concept_names == games.test.concept_names == ("dog", "cat", "car", "bird")
    assert games.train.concepts.tolist() == [0, 1, 0, 2, 1, 0]
    assert games.test.concepts.tolist() == [2, 3, 0]  # ids shared across the folders
    assert torch.allclose(games.test.features.norm(dim=1), torch.ones(3))
    requests = len(server.requests)
    assert fetch_egg_folders(tmp_path / "cache", server.url("/signaling_game_data")) == root
    assert len(server.requests) == requests  # unpacked folders are used without a request


def test_egg_folders_that_are_not_an_archive_or_lack_a_file_are_named(
    server: LoopbackServer, tmp_path: Path
) -> None:
    listing = b"train/\ntest/\n"
    server.files["/listing"] = listing
    server.content_types["/listing"] = "text/plain"
    with pytest.raises(LearnableSparsityError, match=r"neither a zip nor a tar.*by hand"):
        fetch_egg_folders(tmp_path / "a", server.url("/listing"), _sha(listing), progress=False)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = pickle.dumps(LABELS)
        info = tarfile.TarInfo("train/ours_images_single_sm0.objects")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    server.files["/partial"] = buffer.getvalue()
    with pytest.raises(LearnableSparsityError, match=r"holds no \['test/ours_images_single_sm0"):
        fetch_egg_folders(
            tmp_path / "b", server.url("/partial"), _sha(buffer.getvalue()), progress=False
        )
    with pytest.raises(LearnableSparsityError, match=r"has sha256 .*expected the pinned 0000"):
        fetch_egg_folders(tmp_path / "c", server.url("/partial"), "0" * 64, progress=False)


def test_a_stored_released_game_keeps_train_and_valid_as_one(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """The shared images are saved once (the ImageNet features are 7.6 GB as float32)."""
    archive = _egg_folders(tmp_path)["tar"]
    server.files["/signaling_game_data"] = archive
    entry = {
        "source": "egg_released",
        "cache": str(tmp_path),
        "url": server.url("/signaling_game_data"),
        "sha256": _sha(archive),
    }
    stored = datasets.build_dataset(datasets.dataset_settings(entry, "images.egg"))
    assert datasets.save_dataset(stored, tmp_path / "game.pt") == {
        "train": 6,
        "valid": 6,
        "test": 3,
    }
    loaded = datasets.load_game(tmp_path / "game.pt")
    assert loaded.valid.features.data_ptr() == loaded.train.features.data_ptr()
    assert loaded.test.concept_names == ("dog", "cat", "car", "bird")
