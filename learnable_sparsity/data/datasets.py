"""The datasets of the latent-variable experiments (params ``images.<name>``): built and stored.

Every entry names its ``source``:

* ``digits`` — scikit-learn's 8×8 digits (shipped with the package; offline), split by ``seed``;
* ``mnist`` / ``fashion_mnist`` — the idx archives, downloaded into ``cache`` with resume and
  pinned SHA-256 sums; validation = the last ``valid_size`` training images (``split: last``,
  the thesis), or for MNIST ``split: released_ssvae``: the released SSVAE code's index files
  (5K labelled, 45K unlabelled, 10K validation; the labelled images are then fixed);
* ``digits_game`` — signalling-game features derived offline from the digits (fixed random ReLU
  features; concepts = digit class × k-means cluster);
* ``egg`` — the user's signalling-game files in the EGG format: ``features`` (HDF5, VGG fc7) and
  ``labels`` (pickled concept per image, read as plain data only), split at random by ``seed``;
* ``egg_released`` — EGG's ``train/`` and ``test/`` feature folders, put into ``cache`` by hand
  or downloaded from ``url`` (EGG's link) when ``sha256`` pins the archive's digest (none is
  published, so none is pinned by default), split as the released code of Correia et al.
  (2020) splits them (validation games from the training images, test games from ``test/``).

Split sizes (``valid_size``, ``test_size``) are counts (int ≥ 1) or fractions (float in (0, 1)).
A built dataset is stored as one ``torch.save`` file: {"kind": "images" | "game", "splits":
{split: tensors}, plus ``levels``/``side`` for images}, read back by :func:`load_images` /
:func:`load_game`.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import torch

from learnable_sparsity.files import atomic_write_bytes, load_file
from learnable_sparsity.data.images import (
    DIGITS_COUNT,
    ImageSet,
    ImageSplits,
    digits_splits,
    resolve_size,
)
from learnable_sparsity.data.idx_images import fetch_images, released_ssvae_split, split_images
from learnable_sparsity.data.signal_game import (
    EGG_URL,
    GameData,
    GameSplits,
    digits_game_features,
    fetch_egg_folders,
    load_egg_features,
    released_egg_games,
    split_game_data,
)
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import Settings, SettingsError, build_tagged, setting

SPLITS = ("train", "valid", "test")
Size = int | float


def _check_size(key: str, size: Size) -> None:
    if isinstance(size, float) and not 0 < size < 1:
        raise SettingsError(key, f"as a fraction must lie in (0, 1), got {size!r}")
    if isinstance(size, int) and size < 1:
        raise SettingsError(key, f"as a count must be >= 1, got {size!r}")


@dataclass(frozen=True, kw_only=True)
class RandomSplit(Settings):
    """Sizes of a random valid/test split drawn with ``seed``; training keeps the rest."""

    seed: int = setting(0, at_least=0)
    valid_size: Size = 0.1
    test_size: Size = 0.1

    def validate(self) -> None:
        _check_size("valid_size", self.valid_size)
        _check_size("test_size", self.test_size)


@dataclass(frozen=True, kw_only=True)
class DigitsImages(RandomSplit):
    source: Literal["digits"]

    def validate(self) -> None:
        super().validate()
        valid = resolve_size(self.valid_size, DIGITS_COUNT, "valid_size")
        test = resolve_size(self.test_size, DIGITS_COUNT, "test_size")
        if valid + test >= DIGITS_COUNT:
            raise SettingsError(
                "valid_size",
                f"({valid}) + test_size ({test}) leave none of the digits' {DIGITS_COUNT} images "
                "for training",
            )


@dataclass(frozen=True, kw_only=True)
class IdxImages(Settings):
    source: Literal["mnist", "fashion_mnist"]
    cache: str = "data/cache"
    valid_size: int = setting(10_000, at_least=1)  # split "last" only
    split: Literal["last", "released_ssvae"] = "last"

    def validate(self) -> None:
        if self.split == "released_ssvae" and self.source != "mnist":
            raise SettingsError("split", f"released_ssvae splits MNIST, not {self.source}")


@dataclass(frozen=True, kw_only=True)
class DigitsGame(RandomSplit):
    source: Literal["digits_game"]
    feature_dim: int = setting(256, at_least=1)
    clusters_per_class: int = setting(4, at_least=1)


@dataclass(frozen=True, kw_only=True)
class EggGame(RandomSplit):
    source: Literal["egg"]
    features: str
    labels: str


@dataclass(frozen=True, kw_only=True)
class EggReleased(Settings):
    source: Literal["egg_released"]
    cache: str = "data/cache"
    url: str = EGG_URL
    sha256: str | None = None  # of the archive at url; None: the folders are put in cache by hand


DatasetSettings = DigitsImages | IdxImages | DigitsGame | EggGame | EggReleased
SOURCES: dict[str, type[DatasetSettings]] = {
    "digits": DigitsImages,
    "mnist": IdxImages,
    "fashion_mnist": IdxImages,
    "digits_game": DigitsGame,
    "egg": EggGame,
    "egg_released": EggReleased,
}


def dataset_settings(data: Any, where: str) -> DatasetSettings:
    """The settings of one dataset entry, of the class its ``source`` names."""
    return build_tagged(SOURCES, data, where)


def build_dataset(settings: DatasetSettings) -> dict[str, Any]:
    """The stored form of the dataset ``settings`` describe."""
    if isinstance(settings, DigitsGame | EggGame | EggReleased):
        if isinstance(settings, EggReleased):
            game = released_egg_games(
                fetch_egg_folders(Path(settings.cache), settings.url, settings.sha256)
            )
        elif isinstance(settings, DigitsGame):
            game = digits_game_features(
                settings.seed,
                feature_dim=settings.feature_dim,
                clusters_per_class=settings.clusters_per_class,
                valid_size=settings.valid_size,
                test_size=settings.test_size,
            )
        else:
            data = load_egg_features(Path(settings.features), Path(settings.labels))
            game = split_game_data(data, settings.seed, settings.valid_size, settings.test_size)
        return {"kind": "game", "splits": {s: _fields(getattr(game, s)) for s in SPLITS}}
    if isinstance(settings, DigitsImages):
        splits = digits_splits(settings.seed, settings.valid_size, settings.test_size)
    else:
        arrays = fetch_images(settings.source, Path(settings.cache))
        if settings.split == "released_ssvae":
            splits = released_ssvae_split(arrays, Path(settings.cache))
        else:
            splits = split_images(arrays, valid_size=settings.valid_size)
    return {
        "kind": "images",
        "levels": splits.levels,
        "side": splits.side,
        "labelled": splits.labelled,
        "splits": {s: _fields(getattr(splits, s)) for s in SPLITS},
    }


def _fields(split: object) -> dict[str, Any]:
    """A split's fields, not copied (``dataclasses.asdict`` deep-copies every tensor): splits
    that share their images (the released game's train and valid) are then stored once."""
    return {field.name: getattr(split, field.name) for field in fields(split)}


def save_dataset(stored: Mapping[str, Any], path: Path) -> dict[str, int]:
    """Write ``stored`` (from :func:`build_dataset`) to ``path`` atomically; its split sizes."""
    buffer = io.BytesIO()
    torch.save(dict(stored), buffer)
    atomic_write_bytes(path, buffer.getvalue())
    labels = "concepts" if stored["kind"] == "game" else "labels"
    return {split: len(stored["splits"][split][labels]) for split in SPLITS}


def _load(path: Path, kind: str) -> dict[str, Any]:
    stored = load_file(path, what="dataset")
    if stored.get("kind") != kind:
        raise LearnableSparsityError(f"{path} holds {stored.get('kind')} data, not {kind} data")
    return stored


def load_images(path: Path) -> ImageSplits:
    """The image dataset stored at ``path``."""
    stored = _load(path, "images")
    sets = {split: ImageSet(**stored["splits"][split]) for split in SPLITS}
    labelled = stored.get("labelled")  # fixed by the split, or None
    return ImageSplits(**sets, levels=stored["levels"], side=stored["side"], labelled=labelled)


def load_game(path: Path) -> GameSplits:
    """The signalling-game features stored at ``path``."""
    stored = _load(path, "game")
    return GameSplits(**{split: GameData(**stored["splits"][split]) for split in SPLITS})
