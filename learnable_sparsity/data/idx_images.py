"""MNIST and Fashion-MNIST as the latent-variable experiments read them: idx files, downloaded.

:data:`IMAGE_DATASETS` pins the four gzipped idx files of each (60,000 training and 10,000 test
images of 28×28 pixels, 256 grey levels, 10 classes); :func:`fetch_images` downloads them with
:func:`learnable_sparsity.data.fetch.download` (resumed, verified against the pinned SHA-256 digests,
cached under ``<cache_dir>/<name>/``) and parses them with :func:`read_idx` into
:class:`ImageArrays`. :func:`split_images` turns those into
:class:`~learnable_sparsity.data.images.ImageSplits`, taking the validation images out of the training
set: by default the last 10,000 (the thesis; pass ``valid_size=5000`` for the released
Fashion-MNIST code, which validates on images 55,000–59,999) or, with a ``seed``, a random subset.
:func:`released_ssvae_split` splits MNIST as the released SSVAE code does, by its three index
files (:data:`RELEASED_SSVAE_SPLIT`: 5,000 labelled, 45,000 unlabelled, 10,000 validation images
drawn once by the authors), downloaded from the authors' repository at a fixed commit and checked
against the SHA-256 of those files; the labelled images are then fixed too.

The pinned digests are the published SHA-256 sums of the canonical files (the same in
TensorFlow Datasets, torchvision and many other projects); they were not recomputed here.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    import numpy as np

from learnable_sparsity.data.fetch import DEFAULT_TIMEOUT, download
from learnable_sparsity.data.images import ImageSet, ImageSplits, seeded_generator
from learnable_sparsity.errors import LearnableSparsityError

# idx type codes (third byte of the magic number) → big-endian numpy dtype.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"

# The four files of an MNIST-like data set, by role.
IDX_FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}

IDX_LEVELS = 256  # uint8 pixels


@dataclass(frozen=True)
class ImageArrays:
    """The raw arrays of an idx data set: uint8 images ``[N, side, side]``, int64 labels ``[N]``."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


# --------------------------------------------------------------------------- idx files


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """The array stored in an idx file (gzipped or not), in native byte order.

    The header is checked: two zero bytes, a known type code, at least one dimension, and exactly
    as many data bytes as the dimensions call for. Any problem (including a truncated or corrupt
    gzip stream) raises a :class:`LearnableSparsityError` naming the file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise LearnableSparsityError(
            f"cannot read idx file {path}: {err.strerror or err}"
        ) from None
    if data.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise LearnableSparsityError(
                f"{path} is not a complete gzip stream ({err}); delete it to download it again"
            ) from None
    if len(data) < 4:
        raise LearnableSparsityError(f"{path} is too short ({len(data)} bytes) for an idx header")
    zero, code, ndim = data[:2], data[2], data[3]
    if zero != b"\x00\x00" or code not in IDX_DTYPES or ndim == 0:
        raise LearnableSparsityError(
            f"{path} does not start with an idx magic number: {data[:4].hex()} (expected "
            f"0000 + a type code in {sorted(f'{c:02x}' for c in IDX_DTYPES)} + a dimension count)"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise LearnableSparsityError(
            f"{path} is truncated inside its header ({len(data)} of {header} bytes)"
        )
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = IDX_DTYPES[code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise LearnableSparsityError(
            f"{path}: the header announces dimensions {dims} ({expected} data bytes) but the file "
            f"holds {len(data) - header} data bytes (truncated or corrupt)"
        )
    return np.frombuffer(data, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class ImageDatasetSpec:
    """An MNIST-like data set: the four :data:`IDX_FILES` under ``base_url``.

    ``sha256`` maps each file name to its pinned digest (every download is pinned).
    The sizes, ``side`` and ``num_classes`` are checked when the files are read.
    """

    name: str
    base_url: str
    sha256: Mapping[str, str]
    train_size: int = 60_000
    test_size: int = 10_000
    side: int = 28
    num_classes: int = 10
    description: str = ""


IMAGE_DATASETS: dict[str, ImageDatasetSpec] = {
    "mnist": ImageDatasetSpec(
        "mnist",
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        {
            "train-images-idx3-ubyte.gz": (
                "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"
            ),
            "train-labels-idx1-ubyte.gz": (
                "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"
            ),
            "t10k-images-idx3-ubyte.gz": (
                "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"
            ),
            "t10k-labels-idx1-ubyte.gz": (
                "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"
            ),
        },
        description="MNIST handwritten digits (LeCun et al.), PyTorch's S3 mirror",
    ),
    "fashion_mnist": ImageDatasetSpec(
        "fashion_mnist",
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        {
            "train-images-idx3-ubyte.gz": (
                "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"
            ),
            "train-labels-idx1-ubyte.gz": (
                "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"
            ),
            "t10k-images-idx3-ubyte.gz": (
                "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"
            ),
            "t10k-labels-idx1-ubyte.gz": (
                "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"
            ),
        },
        description="Fashion-MNIST clothing images (Xiao et al. 2017), Zalando's S3 bucket",
    ),
}


def _checked_images(path: Path, spec: ImageDatasetSpec, count: int) -> np.ndarray:
    images = read_idx(path)
    expected = (count, spec.side, spec.side)
    if images.dtype != np.uint8 or images.shape != expected:
        raise LearnableSparsityError(
            f"{path} holds {images.dtype} images of shape {images.shape}; {spec.name} needs "
            f"uint8 images of shape {expected}"
        )
    return images


def _checked_labels(path: Path, spec: ImageDatasetSpec, count: int) -> np.ndarray:
    labels = read_idx(path)
    if labels.dtype != np.uint8 or labels.shape != (count,):
        raise LearnableSparsityError(
            f"{path} holds {labels.dtype} labels of shape {labels.shape}; {spec.name} needs "
            f"{count} uint8 labels"
        )
    if labels.size and int(labels.max()) >= spec.num_classes:
        raise LearnableSparsityError(
            f"{path} holds label {int(labels.max())}; {spec.name} has {spec.num_classes} classes"
        )
    return labels.astype(np.int64)


# The released SSVAE split (deep-spin/sparse-marginalization-lvm, data/semi_supervised-vae/
# test_train_splits/), pinned to a commit and to the SHA-256 of each file at that commit.
SSVAE_SPLIT_URL = (
    "https://raw.githubusercontent.com/deep-spin/sparse-marginalization-lvm/"
    "9d27ec0fd58ea2eb58d79bca23a0051f1b143ebe/data/semi_supervised-vae/test_train_splits/"
)
SSVAE_SPLIT_FOLDER = "ssvae_split"  # under the cache
RELEASED_SSVAE_SPLIT: dict[str, tuple[str, str, int]] = {  # role: file, SHA-256, images
    "labelled": (
        "labeled_train_indx.npy",
        "b223e21a0c6602df165494116112086fc430a6db9dc5567166060283f08c070a",
        5_000,
    ),
    "unlabelled": (
        "unlabeled_train_indx.npy",
        "b3acf09c73ccb1006006aeb109692c132f38e72d9afd0c4d8566f96d3aa741c7",
        45_000,
    ),
    "valid": (
        "validation_indx.npy",
        "9b67a1579d2fa1da2f9f10331383fe40baae2cd6cea8bc9fe25dd0987cbc7ac0",
        10_000,
    ),
}


def released_ssvae_split(
    arrays: ImageArrays,
    cache_dir: str | os.PathLike[str],
    base_url: str | None = None,
    *,
    progress: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
) -> ImageSplits:
    """MNIST split by the released SSVAE code's index files: train = its labelled then its
    unlabelled images (``labelled`` fixes the first), valid = its validation images, test = the
    official test set. The files are downloaded into ``<cache_dir>/ssvae_split/`` (``base_url``
    replaces the repository's, the digests still apply) and must be disjoint index arrays of the
    published sizes inside the training set."""
    base = (base_url or SSVAE_SPLIT_URL).rstrip("/")
    root = Path(cache_dir) / SSVAE_SPLIT_FOLDER
    n = arrays.train_images.shape[0]
    indices: dict[str, np.ndarray] = {}
    for role, (name, sha256, size) in RELEASED_SSVAE_SPLIT.items():
        path = download(f"{base}/{name}", root / name, sha256, progress=progress, timeout=timeout)
        try:
            values = np.load(path, allow_pickle=False)  # an object array would be unpickled
        except ValueError as error:
            raise LearnableSparsityError(f"{path} refused: {error}") from None
        if (
            values.shape != (size,)
            or values.dtype.kind not in "iu"
            or not (values.min() >= 0 and values.max() < n)
        ):
            raise LearnableSparsityError(
                f"{path} must hold {size} image indices in [0, {n}), got {values.dtype} "
                f"of shape {values.shape}"
            )
        indices[role] = values.astype(np.int64)
    everything = np.concatenate(list(indices.values()))
    if np.unique(everything).size != everything.size:
        raise LearnableSparsityError(f"the index files in {root} overlap: an image in two parts")
    train = np.concatenate([indices["labelled"], indices["unlabelled"]])
    side = arrays.train_images.shape[1]
    return ImageSplits(
        train=_image_set(arrays.train_images[train], arrays.train_labels[train]),
        valid=_image_set(
            arrays.train_images[indices["valid"]], arrays.train_labels[indices["valid"]]
        ),
        test=_image_set(arrays.test_images, arrays.test_labels),
        levels=IDX_LEVELS,
        side=side,
        labelled=torch.arange(len(indices["labelled"])),
    )


def fetch_images(
    dataset: str | ImageDatasetSpec,
    cache_dir: str | os.PathLike[str],
    base_url: str | None = None,
    *,
    progress: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
) -> ImageArrays:
    """Download (or reuse from ``<cache_dir>/<name>/``) and read an :data:`IMAGE_DATASETS` entry.

    ``base_url`` replaces the spec's (a mirror, or a test server); the pinned digests still
    apply. Sizes, image side, dtypes and label range are checked against the spec.
    """
    if isinstance(dataset, str):
        if dataset not in IMAGE_DATASETS:
            raise LearnableSparsityError(
                f"unknown image data set {dataset!r}; known: {sorted(IMAGE_DATASETS)}"
            )
        dataset = IMAGE_DATASETS[dataset]
    root = Path(cache_dir) / dataset.name
    base = (base_url or dataset.base_url).rstrip("/")
    paths = {
        role: download(
            f"{base}/{name}",
            root / name,
            dataset.sha256[name],
            progress=progress,
            timeout=timeout,
        )
        for role, name in IDX_FILES.items()
    }
    return ImageArrays(
        train_images=_checked_images(paths["train_images"], dataset, dataset.train_size),
        train_labels=_checked_labels(paths["train_labels"], dataset, dataset.train_size),
        test_images=_checked_images(paths["test_images"], dataset, dataset.test_size),
        test_labels=_checked_labels(paths["test_labels"], dataset, dataset.test_size),
    )


def _image_set(images: np.ndarray, labels: np.ndarray) -> ImageSet:
    flat = torch.from_numpy(images.reshape(images.shape[0], -1)).float() / (IDX_LEVELS - 1)
    return ImageSet(flat, torch.from_numpy(labels).long())


def split_images(
    arrays: ImageArrays, valid_size: int = 10_000, seed: int | None = None
) -> ImageSplits:
    """Train / valid / test :class:`ImageSplits` (256 levels) of an idx data set.

    Validation takes ``valid_size`` training images: the last ones when ``seed`` is None (the
    thesis: the last 10,000), else a random subset drawn with ``seed`` (the released SSVAE code).
    Training keeps the others in their original order; test is the official test set.
    """
    n = arrays.train_images.shape[0]
    if isinstance(valid_size, bool) or not isinstance(valid_size, int) or not 0 < valid_size < n:
        raise LearnableSparsityError(
            f"valid_size must be an int in [1, {n - 1}] (of {n} training images): {valid_size!r}"
        )
    if seed is None:
        valid = np.arange(n - valid_size, n)
    else:
        valid = np.sort(torch.randperm(n, generator=seeded_generator(seed))[:valid_size].numpy())
    keep = np.ones(n, dtype=bool)
    keep[valid] = False
    side = arrays.train_images.shape[1]
    return ImageSplits(
        train=_image_set(arrays.train_images[keep], arrays.train_labels[keep]),
        valid=_image_set(arrays.train_images[valid], arrays.train_labels[valid]),
        test=_image_set(arrays.test_images, arrays.test_labels),
        levels=IDX_LEVELS,
        side=side,
    )
