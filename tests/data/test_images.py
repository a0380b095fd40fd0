"""Tests for ``learnable_sparsity.data.images``: digits splits, idx parsing, downloads from the loopback
HTTP server of tests/loopback.py, the train/valid
split, binarisation, quantisation and the labelled split."""

from __future__ import annotations

import gzip
import hashlib
import io
import struct
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from learnable_sparsity.data import datasets, idx_images
from learnable_sparsity.data.images import binarize, digits_splits, labelled_split, quantize
from learnable_sparsity.data.idx_images import (
    IDX_FILES,
    IMAGE_DATASETS,
    ImageArrays,
    ImageDatasetSpec,
    fetch_images,
    read_idx,
    released_ssvae_split,
    split_images,
)
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import SettingsError

if TYPE_CHECKING:
    from tests.loopback import LoopbackServer

IDX_CODES = {np.uint8: 0x08, np.int32: 0x0C, np.float32: 0x0D}


def _idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, IDX_CODES[array.dtype.type], array.ndim])
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def _write_idx(path: Path, array: np.ndarray, *, compress: bool = True) -> Path:
    data = _idx_bytes(array)
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def _fixture_dataset(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "train_images": rng.integers(0, 256, (30, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, 30, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (12, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, 12, dtype=np.uint8),
    }


def _serve(server: LoopbackServer, arrays: dict[str, np.ndarray]) -> ImageDatasetSpec:
    """Serve ``arrays`` as the four idx.gz files under /mnist/; a spec pinning their digests."""
    digests = {}
    for role, name in IDX_FILES.items():
        payload = gzip.compress(_idx_bytes(arrays[role]))
        server.files[f"/mnist/{name}"] = payload
        digests[name] = hashlib.sha256(payload).hexdigest()
    return replace(IMAGE_DATASETS["mnist"], sha256=digests, train_size=30, test_size=12)


# --------------------------------------------------------------------------- digits


def test_digits_split_is_deterministic_sized_and_disjoint() -> None:
    first, again, other = digits_splits(3), digits_splits(3), digits_splits(4)
    assert (len(first.train), len(first.valid), len(first.test)) == (1437, 180, 180)
    assert (first.levels, first.side, first.pixels) == (17, 8, 64)
    for name in ("train", "valid", "test"):
        split, same = getattr(first, name), getattr(again, name)
        assert torch.equal(split.images, same.images) and torch.equal(split.labels, same.labels)
        assert split.images.dtype == torch.float32 and split.labels.dtype == torch.int64
        assert split.images.shape[1] == 64
        assert split.images.min() >= 0.0 and split.images.max() <= 1.0
    assert not torch.equal(first.test.images, other.test.images)
    everything = torch.cat([first.train.images, first.valid.images, first.test.images]) * 16
    full = load_digits().data
    for got, want in zip(
        np.unique(everything.numpy(), axis=0, return_counts=True),
        np.unique(full, axis=0, return_counts=True),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)  # the splits partition the data set
    assert set(first.train.labels.tolist()) == set(range(10))


def test_digits_split_sizes_as_counts_or_fractions() -> None:
    splits = digits_splits(0, valid_size=100, test_size=0.25)
    assert (len(splits.valid), len(splits.test), len(splits.train)) == (100, 449, 1248)
    for bad in ({"valid_size": 0}, {"test_size": 1.0}, {"valid_size": True}):
        with pytest.raises(LearnableSparsityError, match="_size"):
            digits_splits(0, **bad)
    with pytest.raises(LearnableSparsityError, match="leave none"):
        digits_splits(0, valid_size=1000, test_size=797)


# --------------------------------------------------------------------------- idx


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize(
    "array",
    [
        np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        np.array([-5, 0, 70_000], dtype=np.int32),
        np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2),
    ],
)
def test_idx_round_trip(tmp_path: Path, array: np.ndarray, compress: bool) -> None:
    read = read_idx(_write_idx(tmp_path / "x.idx", array, compress=compress))
    assert read.dtype == array.dtype and read.dtype.isnative
    np.testing.assert_array_equal(read, array)


def test_idx_with_a_bad_magic_number_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad-magic.gz"
    data = bytearray(_idx_bytes(np.zeros((2, 2), np.uint8)))
    data[2] = 0x07  # unknown type code
    path.write_bytes(gzip.compress(bytes(data)))
    with pytest.raises(LearnableSparsityError, match=r"bad-magic\.gz.*idx magic number"):
        read_idx(path)


def test_truncated_idx_files_name_the_file(tmp_path: Path) -> None:
    payload = _idx_bytes(np.zeros((5, 4, 4), np.uint8))
    cut_stream = tmp_path / "cut-stream.gz"
    cut_stream.write_bytes(gzip.compress(payload)[:-10])
    with pytest.raises(LearnableSparsityError, match=r"cut-stream\.gz is not a complete gzip"):
        read_idx(cut_stream)
    cut_data = tmp_path / "cut-data.gz"
    cut_data.write_bytes(gzip.compress(payload[:-3]))
    with pytest.raises(LearnableSparsityError, match=r"cut-data\.gz.*\(5, 4, 4\).*77 data bytes"):
        read_idx(cut_data)
    cut_header = tmp_path / "cut-header"
    cut_header.write_bytes(payload[:9])
    with pytest.raises(LearnableSparsityError, match="cut-header is truncated inside its header"):
        read_idx(cut_header)
    with pytest.raises(LearnableSparsityError, match="missing"):
        read_idx(tmp_path / "missing")


# --------------------------------------------------------------------------- fetch_images


def test_fetch_images_downloads_verifies_and_parses(server: LoopbackServer, tmp_path: Path) -> None:
    arrays = _fixture_dataset(np.random.default_rng(0))
    spec = _serve(server, arrays)
    fetched = fetch_images(spec, tmp_path, base_url=server.url("/mnist/"), progress=False)
    for role in IDX_FILES:
        np.testing.assert_array_equal(getattr(fetched, role), arrays[role])
    assert fetched.train_labels.dtype == np.int64
    cached = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    assert cached.is_file() and not (tmp_path / "mnist" / f"{cached.name}.sha256").exists()
    server.files.clear()  # a second call reads the verified cache
    again = fetch_images(spec, tmp_path, base_url=server.url("/mnist"), progress=False)
    np.testing.assert_array_equal(again.test_images, arrays["test_images"])


def test_fetch_images_checksum_mismatch_names_the_file(
    server: LoopbackServer, tmp_path: Path
) -> None:
    spec = _serve(server, _fixture_dataset(np.random.default_rng(1)))
    wrong = dict(spec.sha256, **{"t10k-labels-idx1-ubyte.gz": "0" * 64})
    with pytest.raises(LearnableSparsityError, match=r"t10k-labels-idx1-ubyte\.gz.*0{64}"):
        fetch_images(
            replace(spec, sha256=wrong), tmp_path, base_url=server.url("/mnist/"), progress=False
        )


def test_fetch_images_checks_sizes_and_labels(server: LoopbackServer, tmp_path: Path) -> None:
    arrays = _fixture_dataset(np.random.default_rng(2))
    spec = _serve(server, arrays)
    url = server.url("/mnist/")
    with pytest.raises(LearnableSparsityError, match=r"train-images.*\(31, 28, 28\)"):
        fetch_images(replace(spec, train_size=31), tmp_path / "a", url, progress=False)
    arrays["test_labels"][3] = 10
    spec = _serve(server, arrays)
    with pytest.raises(LearnableSparsityError, match=r"t10k-labels.*label 10.*10 classes"):
        fetch_images(spec, tmp_path / "b", url, progress=False)
    with pytest.raises(LearnableSparsityError, match="unknown image data set 'cifar'"):
        fetch_images("cifar", tmp_path)


def test_registry_pins_every_file() -> None:
    assert set(IMAGE_DATASETS) == {"mnist", "fashion_mnist"}
    for spec in IMAGE_DATASETS.values():
        assert set(spec.sha256) == set(IDX_FILES.values())
        assert all(digest is not None and len(digest) == 64 for digest in spec.sha256.values())


# --------------------------------------------------------------------------- split_images


def _arrays(n: int = 50) -> ImageArrays:
    rng = np.random.default_rng(5)
    return ImageArrays(
        train_images=rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
        train_labels=np.arange(n, dtype=np.int64) % 10,
        test_images=rng.integers(0, 256, (7, 28, 28), dtype=np.uint8),
        test_labels=np.arange(7, dtype=np.int64),
    )


def test_split_images_takes_the_last_training_images_by_default() -> None:
    arrays = _arrays()
    splits = split_images(arrays, valid_size=10)
    assert (len(splits.train), len(splits.valid), len(splits.test)) == (40, 10, 7)
    assert (splits.levels, splits.side, splits.pixels) == (256, 28, 784)
    expected = torch.from_numpy(arrays.train_images[40:].reshape(10, -1)).float() / 255
    assert torch.equal(splits.valid.images, expected)
    assert torch.equal(splits.train.labels, torch.arange(40) % 10)
    assert splits.test.images.dtype == torch.float32 and splits.test.labels.dtype == torch.int64
    with pytest.raises(LearnableSparsityError, match="valid_size"):
        split_images(arrays, valid_size=50)


def test_split_images_with_a_seed_is_random_and_deterministic() -> None:
    arrays = _arrays()
    first, again = split_images(arrays, 10, seed=1), split_images(arrays, 10, seed=1)
    assert torch.equal(first.valid.images, again.valid.images)
    assert not torch.equal(first.valid.labels, torch.arange(40, 50) % 10)
    pooled = torch.cat([first.train.images, first.valid.images])
    assert torch.unique(pooled, dim=0).shape[0] == 50


def _npy(values: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, values)
    return buffer.getvalue()


@pytest.fixture
def released_split(server: LoopbackServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """Index files laid out as the released SSVAE code's (a permutation of 60,000 cut 5K / 45K /
    10K, int64 .npy), served with their own digests in place of the pinned ones."""
    order = np.random.default_rng(0).permutation(60_000)
    parts = {"labelled": order[:5_000], "unlabelled": order[5_000:50_000], "valid": order[50_000:]}
    files, pins = {}, {}
    for role, (name, _, size) in idx_images.RELEASED_SSVAE_SPLIT.items():
        files[name] = _npy(parts[role])
        server.files[f"/split/{name}"] = files[name]
        pins[role] = (name, hashlib.sha256(files[name]).hexdigest(), size)
    monkeypatch.setattr(idx_images, "RELEASED_SSVAE_SPLIT", pins)
    return {"url": server.url("/split"), **files}


def _sixty_thousand() -> ImageArrays:
    """60,000 training images of 2×2 pixels whose first pixel is their index modulo 256."""
    train = np.zeros((60_000, 2, 2), dtype=np.uint8)
    train[:, 0, 0] = np.arange(60_000) % 256
    return ImageArrays(
        train_images=train,
        train_labels=np.arange(60_000, dtype=np.int64) % 10,
        test_images=np.zeros((3, 2, 2), dtype=np.uint8),
        test_labels=np.arange(3, dtype=np.int64),
    )


def test_the_released_ssvae_split_takes_its_index_files(
    released_split: dict[str, bytes], tmp_path: Path
) -> None:
    splits = released_ssvae_split(
        _sixty_thousand(), tmp_path, released_split["url"], progress=False
    )
    order = np.random.default_rng(0).permutation(60_000)
    assert (len(splits.train), len(splits.valid), len(splits.test)) == (50_000, 10_000, 3)
    assert torch.equal(splits.train.labels, torch.from_numpy(order[:50_000] % 10))
    assert torch.equal(splits.valid.labels, torch.from_numpy(order[50_000:] % 10))
    assert torch.equal(splits.labelled, torch.arange(5_000))
    labelled, unlabelled = splits.semi_supervised(0.1, seed=7)  # the seed draws nothing here
    assert torch.equal(labelled.labels, torch.from_numpy(order[:5_000] % 10))
    assert torch.equal(unlabelled.labels, torch.from_numpy(order[5_000:50_000] % 10))
    with pytest.raises(LearnableSparsityError, match=r"fixes 5000 labelled images of 50000"):
        splits.semi_supervised(0.2, seed=0)
    cached = sorted(p.name for p in (tmp_path / "ssvae_split").glob("*.npy"))
    assert cached == sorted(name for name, _, _ in idx_images.RELEASED_SSVAE_SPLIT.values())


def test_released_index_files_that_overlap_or_stray_are_refused(
    released_split: dict[str, bytes], server: LoopbackServer, tmp_path: Path, monkeypatch
) -> None:
    overlapping = np.concatenate([np.arange(50_000, 55_000), np.arange(55_000 - 1, 60_000 - 1)])
    pins = dict(idx_images.RELEASED_SSVAE_SPLIT)
    name, _, size = pins["valid"]
    server.files[f"/split/{name}"] = _npy(overlapping)
    pins["valid"] = (name, hashlib.sha256(_npy(overlapping)).hexdigest(), size)
    monkeypatch.setattr(idx_images, "RELEASED_SSVAE_SPLIT", pins)
    with pytest.raises(LearnableSparsityError, match="overlap"):
        released_ssvae_split(
            _sixty_thousand(), tmp_path / "a", released_split["url"], progress=False
        )
    stray = np.arange(55_000, 65_000)
    server.files[f"/split/{name}"] = _npy(stray)
    pins["valid"] = (name, hashlib.sha256(_npy(stray)).hexdigest(), size)
    with pytest.raises(LearnableSparsityError, match=r"validation_indx\.npy must hold 10000"):
        released_ssvae_split(
            _sixty_thousand(), tmp_path / "b", released_split["url"], progress=False
        )


def test_the_pinned_split_is_the_authors_commit() -> None:
    assert "/9d27ec0fd58ea2eb58d79bca23a0051f1b143ebe/" in idx_images.SSVAE_SPLIT_URL
    assert [size for _, _, size in idx_images.RELEASED_SSVAE_SPLIT.values()] == [
        5_000,
        45_000,
        10_000,
    ]


# --------------------------------------------------------------------------- model inputs


def test_binarize_draws_zeros_and_ones_with_the_pixel_probability() -> None:
    x = torch.full((200, 100), 0.3)
    x[:, :10] = 0.0
    x[:, 10:20] = 1.0
    sample = binarize(x, torch.Generator().manual_seed(0))
    assert sample.shape == x.shape and sample.dtype == x.dtype
    assert set(sample.unique().tolist()) <= {0.0, 1.0}
    assert sample[:, :10].sum() == 0 and sample[:, 10:20].min() == 1
    assert abs(sample[:, 20:].mean().item() - 0.3) < 0.02
    again = binarize(x, torch.Generator().manual_seed(0))
    assert torch.equal(sample, again)


def test_quantize_inverts_the_grey_levels() -> None:
    for levels in (256, 17):
        k = torch.arange(levels)
        q = quantize(k.float() / (levels - 1), levels)
        assert q.dtype == torch.int64 and torch.equal(q, k)
    images = digits_splits(0).test.images
    levels = quantize(images, 17)
    assert levels.min() >= 0 and levels.max() <= 16
    with pytest.raises(LearnableSparsityError, match="levels"):
        quantize(images, 1)


# --------------------------------------------------------------------------- labelled split


@pytest.mark.parametrize("stratified", [True, False])
def test_labelled_split_fraction_and_determinism(stratified: bool) -> None:
    labels = torch.arange(1000) % 10
    labels[:37] = 3  # uneven classes
    labelled, unlabelled = labelled_split(labels, 0.1, seed=0, stratified=stratified)
    assert labelled.numel() == 100 and unlabelled.numel() == 900
    assert labelled.dtype == torch.int64
    assert torch.equal(torch.sort(torch.cat([labelled, unlabelled])).values, torch.arange(1000))
    again, _ = labelled_split(labels, 0.1, seed=0, stratified=stratified)
    other, _ = labelled_split(labels, 0.1, seed=1, stratified=stratified)
    assert torch.equal(labelled, again) and not torch.equal(labelled, other)
    if stratified:
        exact = 0.1 * labels.bincount().double()
        taken = labels[labelled].bincount(minlength=10).double()
        assert torch.all((taken == exact.floor()) | (taken == exact.ceil()))


def test_semi_supervised_views_and_bad_fractions() -> None:
    splits = digits_splits(0)
    labelled, unlabelled = splits.semi_supervised(0.1, seed=0)
    assert len(labelled) == round(0.1 * len(splits.train))
    assert len(labelled) + len(unlabelled) == len(splits.train)
    assert set(labelled.labels.tolist()) == set(range(10))
    for bad in (0.0, 1.0, True):
        with pytest.raises(LearnableSparsityError, match="fraction"):
            labelled_split(splits.train.labels, bad, seed=0)


def test_a_stored_released_split_keeps_its_labelled_images(
    released_split: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idx_images, "SSVAE_SPLIT_URL", released_split["url"])
    monkeypatch.setattr(datasets, "fetch_images", lambda source, cache: _sixty_thousand())
    entry = {"source": "mnist", "cache": str(tmp_path), "split": "released_ssvae"}
    stored = datasets.build_dataset(datasets.dataset_settings(entry, "images.mnist"))
    sizes = datasets.save_dataset(stored, tmp_path / "mnist.pt")
    assert sizes == {"train": 50_000, "valid": 10_000, "test": 3}
    loaded = datasets.load_images(tmp_path / "mnist.pt")
    assert torch.equal(loaded.labelled, torch.arange(5_000))
    with pytest.raises(LearnableSparsityError, match=r"images\.f.*split.*released_ssvae splits"):
        datasets.dataset_settings({**entry, "source": "fashion_mnist"}, "images.f")


def test_digits_sizes_that_leave_no_training_images_are_refused_naming_the_key() -> None:
    """Issue 38: ``images.digits.valid_size: 5000`` was refused only when the dataset was built,
    as "digits: valid (5000) …": now when the settings are read, naming the key."""
    entry = {"source": "digits", "valid_size": 5000}
    with pytest.raises(SettingsError, match=r"^images\.digits\.valid_size \(5000\) \+ test_size"):
        datasets.dataset_settings(entry, "images.digits")
    shares = {"source": "digits", "valid_size": 0.6, "test_size": 0.4}  # 1078 + 719 = 1797
    with pytest.raises(SettingsError, match=r"valid_size \(1078\) \+ test_size \(719\)"):
        datasets.dataset_settings(shares, "images.digits")
    datasets.dataset_settings({"source": "digits", "valid_size": 300}, "images.digits")
