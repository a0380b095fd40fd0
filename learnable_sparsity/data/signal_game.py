"""Image features and concept labels of the signalling game (Lazaridou et al. 2017, via EGG).

A game shows the sender one target image and the receiver |V| = 16 candidates, drawn where
possible from distinct concepts, so the data are per-image feature vectors with a concept id
each: a :class:`GameData`, split by images into a :class:`GameSplits`.

Two sources:

* :func:`load_egg_features` — the EGG / Lazaridou et al. files: an HDF5 file of VGG fc7
  features (``ours_images_single_sm0.h5``, ``[N, 4096]``; EGG reads the file's one dataset,
  usually ``dataset_1``) and a pickled sequence with the concept label of each image
  (``ours_images_single_sm0.objects``, e.g. ImageNet concept names), unpickled as plain data
  only (containers, numbers, strings, numpy arrays: nothing in it can run code). Rows are
  L2-normalised as in EGG.
* :func:`digits_game_features` — an offline smoke stand-in built from scikit-learn's 8×8 digits:
  a fixed random projection of the 64 pixels followed by a ReLU (non-negative like fc7
  activations), L2-normalised. Concepts are finer than the 10 digit classes, so that 16
  candidates can come from distinct concepts: each class is split by k-means on its pixels into
  ``clusters_per_class`` visual sub-concepts (default 4, so 40 concepts, about 45 images each).
  Features and concepts do not depend on the seed (they play the role of a fixed pretrained
  network); the seed only draws the train / valid / test split.

:func:`split_game_data` splits any :class:`GameData` at random by images; every split keeps the
global concept ids and names. :func:`released_egg_games` instead splits as the released code of
Correia et al. (2020) does: EGG's ``train/`` and ``test/`` folders (as EGG's
``egg/zoo/signal_game/README.md`` links them for download, :data:`EGG_URL`, and
deep-spin/sparse-marginalization-lvm reads them), validation games drawn from the training
images, test games from the test folder; :func:`fetch_egg_folders` downloads and unpacks them
(streaming: the ImageNet features are gigabytes) or uses folders already in the cache.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tarfile
import zipfile
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from learnable_sparsity.data.fetch import DEFAULT_TIMEOUT, download
from learnable_sparsity.data.images import resolve_size
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    import numpy as np

DIGITS_PIXELS = 64
_PROJECTION_SEED = 0  # the fixed "pretrained network" of the digits stand-in
_KMEANS_SEED = 0
_KMEANS_RESTARTS = 10


@dataclass(frozen=True)
class GameData:
    """``features``: float32 ``[N, F]``; ``concepts``: int64 ``[N]`` in ``[0, num_concepts)``;
    ``concept_names[c]``: the name of concept ``c``."""

    features: Tensor
    concepts: Tensor
    concept_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.features.dim() != 2 or self.concepts.shape != self.features.shape[:1]:
            raise LearnableSparsityError(
                f"GameData needs features [N, F] and concepts [N], got features "
                f"{tuple(self.features.shape)} and concepts {tuple(self.concepts.shape)}"
            )

    def to(self, device: torch.device | str) -> GameData:
        """The same data on ``device``."""
        return GameData(self.features.to(device), self.concepts.to(device), self.concept_names)

    def __len__(self) -> int:
        return self.features.shape[0]

    @property
    def num_concepts(self) -> int:
        """Number of concepts (of the whole data set, not only those in this split)."""
        return len(self.concept_names)

    def subset(self, indices: Tensor) -> GameData:
        """The images at ``indices``, in that order, with the same concept ids and names."""
        return GameData(self.features[indices], self.concepts[indices], self.concept_names)


@dataclass(frozen=True)
class GameSplits:
    """Train / valid / test images of a signalling-game data set."""

    train: GameData
    valid: GameData
    test: GameData


def split_game_data(
    data: GameData, seed: int, valid_size: int | float = 0.1, test_size: int | float = 0.1
) -> GameSplits:
    """A random split of ``data`` by images, drawn with ``seed``.

    ``valid_size`` / ``test_size`` are counts or fractions of all images
    (:func:`learnable_sparsity.data.images.resolve_size`); training gets the rest.
    """
    n = len(data)
    valid = resolve_size(valid_size, n, "valid_size")
    test = resolve_size(test_size, n, "test_size")
    if valid + test >= n:
        raise LearnableSparsityError(
            f"valid ({valid}) + test ({test}) images leave none of the {n} for training"
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return GameSplits(
        train=data.subset(order[: n - valid - test]),
        valid=data.subset(order[n - valid - test : n - test]),
        test=data.subset(order[n - test :]),
    )


def _l2_normalized(features: Tensor, source: str) -> Tensor:
    norms = features.norm(dim=1, keepdim=True)
    flat = norms.flatten()
    bad = torch.nonzero(~(flat > 0) | torch.isinf(flat)).flatten()
    if bad.numel():
        raise LearnableSparsityError(
            f"{source}: feature row {int(bad[0])} has norm {float(norms[bad[0]])} and cannot be "
            f"L2-normalised ({bad.numel()} such rows)"
        )
    return features / norms


# --------------------------------------------------------------------------- EGG files


def _read_features(path: Path, dataset: str | None) -> Tensor:
    import h5py

    if not path.is_file():
        raise LearnableSparsityError(f"feature file {path} does not exist")
    if not h5py.is_hdf5(path):
        raise LearnableSparsityError(f"feature file {path} is not an HDF5 file")
    with h5py.File(path, "r") as handle:
        found: dict[str, h5py.Dataset] = {}

        def collect(name: str, obj: h5py.HLObject) -> None:
            if isinstance(obj, h5py.Dataset):
                found[name] = obj

        handle.visititems(collect)
        shapes = {name: (obj.shape, str(obj.dtype)) for name, obj in found.items()}
        candidates = [
            name
            for name, obj in found.items()
            if obj.ndim == 2 and np.issubdtype(obj.dtype, np.floating)
        ]
        if not candidates:
            raise LearnableSparsityError(
                f"feature file {path} has no 2-d float dataset; its datasets are {shapes}"
            )
        if dataset is None:
            if len(candidates) > 1:
                raise LearnableSparsityError(
                    f"feature file {path} holds several 2-d float datasets {candidates}; name "
                    "one with dataset=..."
                )
            dataset = candidates[0]
        elif dataset not in candidates:
            raise LearnableSparsityError(
                f"feature file {path} has no 2-d float dataset {dataset!r}; its datasets are "
                f"{shapes}"
            )
        features = found[dataset].astype(np.float32)[:]
    tensor = torch.from_numpy(features)
    nonfinite = torch.nonzero(~torch.isfinite(tensor).all(dim=1)).flatten()
    if nonfinite.numel():
        raise LearnableSparsityError(
            f"feature file {path}, dataset {dataset!r}: row {int(nonfinite[0])} holds NaN or "
            f"infinite values ({nonfinite.numel()} such rows)"
        )
    return tensor


def _ndarray_reconstruct(subtype: type, shape: tuple[int, ...], dtype: bytes) -> np.ndarray:
    """numpy's ``_reconstruct`` (the empty array a pickled array's state is then set on), for
    a plain ``ndarray`` only."""
    if subtype is not np.ndarray:
        raise pickle.UnpicklingError(f"an array of type {subtype!r}, not numpy.ndarray")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as pickled arrays use it (an array's bytes written as latin-1 text by
    protocols 0-2), without the other codecs."""
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode with encoding {encoding!r}")
    return text.encode("latin-1")


def _frombuffer(buffer: bytes, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
    """numpy's protocol-5 array rebuild, into an array of its own (not a view of the buffer)."""
    return np.frombuffer(buffer, dtype).reshape(shape, order=order).copy()


# What a label file may name besides plain containers, numbers and strings (which pickle builds
# without naming anything): a numpy array or scalar and the pieces its pickle rebuilds it from,
# in numpy 1's and numpy 2's module names, and Python 2's / 3's name of the set types. Every
# other name is refused before it is looked up: an unpickled name is called, and a callable such
# as os.system runs whatever the file says.
_NUMPY_CORE = ("numpy.core.multiarray", "numpy._core.multiarray")
LABEL_GLOBALS: dict[tuple[str, str], object] = {
    **{(module, "_reconstruct"): _ndarray_reconstruct for module in _NUMPY_CORE},
    **{(module, "scalar"): np._core.multiarray.scalar for module in _NUMPY_CORE},
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
    **{
        (module, kind.__name__): kind
        for module in ("builtins", "__builtin__")
        for kind in (set, frozenset)
    },
}


class _Refused(pickle.UnpicklingError):
    """A label file names an object outside :data:`LABEL_GLOBALS`."""


class _LabelUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: :data:`LABEL_GLOBALS`, nothing else."""

    def find_class(self, module: str, name: str) -> object:
        try:
            return LABEL_GLOBALS[module, name]
        except KeyError:
            raise _Refused(
                f"refused: it names {module}.{name}, not plain data (containers, numbers, "
                "strings, numpy arrays), and loading it could run code"
            ) from None


def _read_labels(path: Path) -> list[Hashable]:
    if not path.is_file():
        raise LearnableSparsityError(f"label file {path} does not exist")
    try:
        with open(path, "rb") as handle:
            labels = _LabelUnpickler(handle).load()
    except _Refused as err:
        raise LearnableSparsityError(f"label file {path} {err}") from None
    except Exception as err:  # unpickling raises many types; all mean a bad file here
        raise LearnableSparsityError(
            f"label file {path} is not a readable pickle: {type(err).__name__}: {err}"
        ) from None
    if isinstance(labels, np.ndarray):
        if labels.ndim != 1:
            raise LearnableSparsityError(
                f"label file {path} holds an array of shape {labels.shape}; expected one label "
                "per image (1-d)"
            )
        labels = labels.tolist()
    if isinstance(labels, str | bytes) or not isinstance(labels, Sequence):
        raise LearnableSparsityError(
            f"label file {path} holds a {type(labels).__name__}, not a sequence of labels "
            "(one per image)"
        )
    for index, label in enumerate(labels):
        if not isinstance(label, Hashable):
            raise LearnableSparsityError(
                f"label file {path}: label {index} is an unhashable {type(label).__name__}"
            )
    return list(labels)


def load_egg_features(
    features_path: str | os.PathLike[str],
    labels_path: str | os.PathLike[str],
    *,
    dataset: str | None = None,
    normalize: bool = True,
) -> GameData:
    """Read EGG / Lazaridou et al. signalling-game features and concept labels.

    ``features_path``: HDF5 file with a 2-d float dataset ``[N, F]`` (any path inside the file);
    without ``dataset`` the file must hold exactly one such dataset. ``labels_path``: a pickled
    list, tuple or 1-d numpy array of N hashable labels (concept names or ids), row i's label at
    position i. Concept ids number the distinct labels in order of first appearance (as EGG's
    ``obj2id``); names are ``str(label)``. With ``normalize`` every row is scaled to unit L2 norm
    (EGG does). The labels are unpickled as plain data only (:data:`LABEL_GLOBALS`): a file
    naming any other Python object is refused before it is looked up.

    Features are loaded into memory (the 463,000 × 4,096 ImageNet set takes 7.6 GB as float32).
    """
    features_path, labels_path = Path(features_path), Path(labels_path)
    features = _read_features(features_path, dataset)
    labels = _read_labels(labels_path)
    if len(labels) != features.shape[0]:
        raise LearnableSparsityError(
            f"label file {labels_path} has {len(labels)} labels but feature file {features_path} "
            f"has {features.shape[0]} rows"
        )
    ids: dict[Hashable, int] = {}
    concepts = torch.tensor([ids.setdefault(label, len(ids)) for label in labels], dtype=torch.long)
    if normalize:
        features = _l2_normalized(features, str(features_path))
    return GameData(features, concepts, tuple(str(label) for label in ids))


# --------------------------------------------------------------------------- EGG's released folders

# Where EGG's signal_game README links "the data used in the paper". What the address serves (an
# archive, and of which kind) is not documented, nor its digest: fetch_egg_folders downloads it
# only with a digest given (a zip or tar archive, anything else refused) and otherwise names the
# folders to put in the cache by hand.
EGG_URL = "https://dl.fbaipublicfiles.com/signaling_game_data"
EGG_PARTS = ("train", "test")
EGG_FILES = ("ours_images_single_sm0.h5", "ours_images_single_sm0.objects")
EGG_FOLDER = "signal_game"  # under the cache: <cache>/signal_game/{train,test}/<EGG_FILES>


def egg_members(root: Path) -> list[Path]:
    """The six files of EGG's folders under ``root``."""
    return [root / part / name for part in EGG_PARTS for name in EGG_FILES]


def fetch_egg_folders(
    cache_dir: str | os.PathLike[str],
    url: str = EGG_URL,
    sha256: str | None = None,
    *,
    progress: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
) -> Path:
    """``<cache_dir>/signal_game`` holding ``train/`` and ``test/`` with :data:`EGG_FILES` each:
    as found there (put by hand, or unpacked before), else downloaded from ``url`` as one zip or
    tar archive whose SHA-256 is ``sha256`` and the six files unpacked from it, found under any
    folder, one at a time, each to its fixed path (an archive's member names choose no path).
    Without ``sha256`` nothing is downloaded (:func:`~learnable_sparsity.data.fetch.download`)."""
    root = Path(cache_dir) / EGG_FOLDER
    wanted = egg_members(root)
    if all(path.is_file() for path in wanted):
        return root
    if sha256 is None:
        raise LearnableSparsityError(
            f"EGG's folders are not in {root} and no SHA-256 is pinned for {url}, so it is not "
            f"downloaded: put EGG's train/ and test/ folders (each with {', '.join(EGG_FILES)}) "
            f"into {root} by hand, or give the archive's digest (images: sha256)"
        )
    archive = download(url, root / "download", sha256, progress=progress, timeout=timeout)
    suffixes = {f"{path.parent.name}/{path.name}": path for path in wanted}
    found: set[str] = set()

    def unpack(name: str, stream_of) -> None:
        for suffix, target in suffixes.items():
            if name == suffix or name.endswith("/" + suffix):
                if suffix in found:
                    raise LearnableSparsityError(f"{archive} holds {suffix!r} more than once")
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(target.name + ".part")
                with stream_of() as source, open(partial, "wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
                os.replace(partial, target)
                found.add(suffix)

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zipped:
            for info in zipped.infolist():
                if not info.is_dir():
                    unpack(info.filename, lambda info=info: zipped.open(info))
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive, "r:*") as tarred:
            for member in tarred:
                if member.isfile():
                    unpack(member.name, lambda member=member: tarred.extractfile(member))
    else:
        raise LearnableSparsityError(
            f"{url} sent neither a zip nor a tar archive ({archive}): put EGG's train/ and test/ "
            f"folders (each with {', '.join(EGG_FILES)}) into {root} by hand"
        )
    missing = sorted(set(suffixes) - found)
    if missing:
        raise LearnableSparsityError(f"{archive} holds no {missing}: the folders need {EGG_FILES}")
    return root


def released_egg_games(root: str | os.PathLike[str], *, normalize: bool = True) -> GameSplits:
    """The released code's split of EGG's folders under ``root``: train = ``train/``, valid =
    the same images (its validation games are drawn from the training features with another
    seed), test = ``test/``; concept ids shared by both folders (in order of first appearance,
    train first), rows L2-normalised with ``normalize``."""
    root = Path(root)
    ids: dict[Hashable, int] = {}
    parts = {}
    for part in EGG_PARTS:
        features_path, labels_path = root / part / EGG_FILES[0], root / part / EGG_FILES[1]
        features = _read_features(features_path, None)
        labels = _read_labels(labels_path)
        if len(labels) != features.shape[0]:
            raise LearnableSparsityError(
                f"label file {labels_path} has {len(labels)} labels but feature file "
                f"{features_path} has {features.shape[0]} rows"
            )
        concepts = torch.tensor([ids.setdefault(label, len(ids)) for label in labels])
        if normalize:
            features = _l2_normalized(features, str(features_path))
        parts[part] = (features, concepts.long())
    names = tuple(str(label) for label in ids)
    train, test = (GameData(*parts[part], names) for part in EGG_PARTS)
    return GameSplits(train=train, valid=train, test=test)


# --------------------------------------------------------------------------- digits stand-in


def digits_game_features(
    seed: int,
    feature_dim: int = 256,
    clusters_per_class: int = 4,
    valid_size: int | float = 0.1,
    test_size: int | float = 0.1,
) -> GameSplits:
    """Smoke-scale game data from scikit-learn's digits (1,797 images), split with ``seed``.

    Features: ``relu(pixels @ W + b)`` L2-normalised, ``[N, feature_dim]`` float32, with the 64
    pixels scaled to [0, 1] and W, b fixed Gaussian draws. Concepts: digit class × k-means
    cluster of the class's pixels, ``10 * clusters_per_class`` concepts named
    ``"digit<d>/cluster<j>"``. Only the split depends on ``seed``.
    """
    from sklearn.cluster import KMeans
    from sklearn.datasets import load_digits

    if isinstance(feature_dim, bool) or not isinstance(feature_dim, int) or feature_dim < 1:
        raise LearnableSparsityError(f"feature_dim must be a positive int: {feature_dim!r}")
    digits = load_digits()
    pixels = digits.data.astype(np.float32) / 16.0
    classes = sorted(set(digits.target.tolist()))
    smallest = min(int((digits.target == c).sum()) for c in classes)
    if (
        isinstance(clusters_per_class, bool)
        or not isinstance(clusters_per_class, int)
        or not 1 <= clusters_per_class <= smallest
    ):
        raise LearnableSparsityError(
            f"clusters_per_class must be an int in [1, {smallest}]: {clusters_per_class!r}"
        )
    concepts = np.empty(len(pixels), dtype=np.int64)
    for c in classes:
        members = np.flatnonzero(digits.target == c)
        kmeans = KMeans(clusters_per_class, n_init=_KMEANS_RESTARTS, random_state=_KMEANS_SEED)
        concepts[members] = c * clusters_per_class + kmeans.fit_predict(pixels[members])
    names = tuple(f"digit{c}/cluster{j}" for c in classes for j in range(clusters_per_class))
    generator = torch.Generator().manual_seed(_PROJECTION_SEED)
    weight = torch.randn(DIGITS_PIXELS, feature_dim, generator=generator) / DIGITS_PIXELS**0.5
    bias = 0.1 * torch.randn(feature_dim, generator=generator)
    features = torch.relu(torch.from_numpy(pixels) @ weight + bias)
    data = GameData(
        _l2_normalized(features, "digits game features"), torch.from_numpy(concepts), names
    )
    return split_game_data(data, seed, valid_size, test_size)
