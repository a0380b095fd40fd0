"""DVC stage ``images``: the data of the latent-variable experiments → ``data/images/<name>.pt``.

Every entry of params ``images`` names a dataset and its ``source``:

* ``digits`` — scikit-learn's 8×8 digits (shipped with the package; offline), split by ``seed``
  into train/valid/test (``valid_size``/``test_size``: counts or fractions).
* ``mnist`` / ``fashion_mnist`` — the idx archives, downloaded into ``cache`` with resume and
  pinned SHA-256 sums; validation = the last ``valid_size`` training images (the thesis).
* ``digits_game`` — signalling-game features derived offline from the digits (fixed random ReLU
  features; concepts = digit class × k-means cluster), split by images.
* ``egg`` — the user's signalling-game files in the EGG format: ``features`` (HDF5, VGG fc7) and
  ``labels`` (pickled concept per image).

Each output is a ``torch.save`` of {"kind": "images" | "game", "splits": {split: tensors},
plus levels/side for images}; ``data/images/meta.json`` describes them all.
"""

from __future__ import annotations

import io
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from components.data.atomic import atomic_write_bytes
from components.data.images import (
    IMAGE_DATASETS,
    ImageSet,
    ImageSplits,
    digits_splits,
    fetch_images,
    split_images,
)
from components.data.signal_game import (
    GameData,
    GameSplits,
    digits_game_features,
    load_egg_features,
    split_game_data,
)
from components.errors import LearnableSparsityError
from pipelines.io import write_json
from pipelines.params import Params, load_params

OUT = Path("data/images")
SPLITS = ("train", "valid", "test")
log = logging.getLogger(__name__)


def _size(spec: Params, key: str, default: int | float) -> int | float:
    return spec.get(key, (int, float)) if key in spec.data else default


def build(name: str, spec: Params) -> dict[str, Any]:
    """The saved form of dataset ``name`` as its params entry describes."""
    source = spec.get("source", str)
    seed = spec.get("seed", int) if "seed" in spec.data else 0
    if source == "digits":
        splits = digits_splits(seed, _size(spec, "valid_size", 0.1), _size(spec, "test_size", 0.1))
    elif source in IMAGE_DATASETS:
        arrays = fetch_images(source, Path(spec.get("cache", str)))
        splits = split_images(arrays, valid_size=int(_size(spec, "valid_size", 10_000)))
    elif source == "digits_game":
        game = digits_game_features(
            seed,
            feature_dim=spec.get("feature_dim", int),
            clusters_per_class=spec.get("clusters_per_class", int),
            valid_size=_size(spec, "valid_size", 0.1),
            test_size=_size(spec, "test_size", 0.1),
        )
        return {"kind": "game", "splits": {s: asdict(getattr(game, s)) for s in SPLITS}}
    elif source == "egg":
        data = load_egg_features(Path(spec.get("features", str)), Path(spec.get("labels", str)))
        game = split_game_data(
            data, seed, _size(spec, "valid_size", 0.1), _size(spec, "test_size", 0.1)
        )
        return {"kind": "game", "splits": {s: asdict(getattr(game, s)) for s in SPLITS}}
    else:
        known = ["digits", *IMAGE_DATASETS, "digits_game", "egg"]
        raise LearnableSparsityError(
            f"{spec.source}: images.{name}.source is {source!r}; choose from {known}"
        )
    return {
        "kind": "images",
        "levels": splits.levels,
        "side": splits.side,
        "splits": {s: asdict(getattr(splits, s)) for s in SPLITS},
    }


def _load(name: str, kind: str) -> dict[str, Any]:
    path = OUT / f"{name}.pt"
    if not path.exists():
        raise LearnableSparsityError(f"{path} does not exist: run the images stage (dvc repro)")
    saved = torch.load(path, weights_only=False)
    if saved["kind"] != kind:
        raise LearnableSparsityError(f"{path} holds {saved['kind']} data, not {kind} data")
    return saved


def load_images(name: str) -> ImageSplits:
    """The image dataset ``name`` written by this stage."""
    saved = _load(name, "images")
    sets = {split: ImageSet(**saved["splits"][split]) for split in SPLITS}
    return ImageSplits(**sets, levels=saved["levels"], side=saved["side"])


def load_game(name: str) -> GameSplits:
    """The signalling-game features ``name`` written by this stage."""
    saved = _load(name, "game")
    return GameSplits(**{split: GameData(**saved["splits"][split]) for split in SPLITS})


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params()
    datasets = params.section("images")
    meta = {}
    for name in datasets.data:
        saved = build(name, datasets.section(name))
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        atomic_write_bytes(OUT / f"{name}.pt", buffer.getvalue())
        labels = "concepts" if saved["kind"] == "game" else "labels"
        sizes = {split: len(saved["splits"][split][labels]) for split in SPLITS}
        meta[name] = {"kind": saved["kind"], "sizes": sizes, "source": dict(datasets.data[name])}
        log.info("%s (%s): %s", name, saved["kind"], sizes)
    write_json(OUT / "meta.json", meta)


if __name__ == "__main__":
    main()
