"""Grey-scale image data of the latent-variable experiments: splits, the digits, model inputs.

Every source ends as an :class:`ImageSplits`: ``train`` / ``valid`` / ``test`` :class:`ImageSet`
s of float32 images in [0, 1] flattened to ``[N, side * side]`` with int64 class labels, plus
the number of grey ``levels`` of the source (a pixel is ``k / (levels - 1)`` for an integer k) and
the image ``side``.

* **Digits** (smoke scale, offline): scikit-learn's ``load_digits``, 1,797 images of 8×8 pixels
  with 17 grey levels (0–16), 10 classes. :func:`digits_splits` shuffles them with a seed and
  cuts train / valid / test of the requested sizes.
* **MNIST / Fashion-MNIST**: downloaded as idx files and split by
  :mod:`learnable_sparsity.data.idx_images`.

Model inputs and targets: :func:`binarize` draws dynamic Bernoulli binarisations (a fresh one
each time an image is used, as in the released SSVAE code) and :func:`quantize` turns images back
into integer grey levels, the targets of the 256-way (or 17-way) categorical pixel decoder of the
bit-vector VAE. :func:`labelled_split` picks the labelled part of the training set for the
semi-supervised VAE (the paper labels 10%).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from learnable_sparsity.errors import LearnableSparsityError

DIGITS_LEVELS = 17  # scikit-learn digits pixels are integers 0..16
DIGITS_SIDE = 8
DIGITS_COUNT = 1797  # scikit-learn's load_digits: known before loading, so sizes check early


# --------------------------------------------------------------------------- containers


@dataclass(frozen=True)
class ImageSet:
    """``images``: float32 ``[N, pixels]`` in [0, 1]; ``labels``: int64 ``[N]`` class ids."""

    images: Tensor
    labels: Tensor

    def __post_init__(self) -> None:
        if self.images.dim() != 2 or self.labels.shape != self.images.shape[:1]:
            raise LearnableSparsityError(
                f"ImageSet needs images [N, pixels] and labels [N], got images "
                f"{tuple(self.images.shape)} and labels {tuple(self.labels.shape)}"
            )

    def __len__(self) -> int:
        return self.images.shape[0]

    def subset(self, indices: Tensor) -> ImageSet:
        """The images (and labels) at ``indices``, in that order."""
        return ImageSet(self.images[indices], self.labels[indices])

    def to(self, device: torch.device | str) -> ImageSet:
        """The same set on ``device``."""
        return ImageSet(self.images.to(device), self.labels.to(device))


@dataclass(frozen=True)
class ImageSplits:
    """Train / valid / test images of one source, with its grey ``levels`` and image ``side``."""

    train: ImageSet
    valid: ImageSet
    test: ImageSet
    levels: int
    side: int
    labelled: Tensor | None = None  # fixed labelled training images (indices), if the split has

    @property
    def pixels(self) -> int:
        """Pixels per image (``side ** 2``)."""
        return self.side * self.side

    def semi_supervised(
        self, fraction: float, seed: int, *, stratified: bool = True
    ) -> tuple[ImageSet, ImageSet]:
        """Labelled and unlabelled parts of ``train``: the split's own labelled images where it
        fixes them (their share must be ``fraction``), else drawn (see :func:`labelled_split`)."""
        if self.labelled is None:
            labelled, unlabelled = labelled_split(
                self.train.labels, fraction, seed, stratified=stratified
            )
            return self.train.subset(labelled), self.train.subset(unlabelled)
        n = len(self.train.labels)
        if round(fraction * n) != len(self.labelled):
            raise LearnableSparsityError(
                f"the split fixes {len(self.labelled)} labelled images of {n} "
                f"({len(self.labelled) / n:g}); the labelled fraction asks for {fraction}"
            )
        keep = torch.ones(n, dtype=torch.bool)
        keep[self.labelled] = False
        return self.train.subset(self.labelled), self.train.subset(torch.nonzero(keep)[:, 0])


# --------------------------------------------------------------------------- sizes and seeds


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (the draws of a split)."""
    return torch.Generator().manual_seed(seed)


def resolve_size(size: int | float, total: int, name: str) -> int:
    """A split size given as a count (int ≥ 1) or a fraction of ``total`` (float in (0, 1)).

    ``name`` (the argument) is for errors. Booleans are refused; a fraction is rounded to the
    nearest count, at least 1.
    """
    if isinstance(size, bool) or not isinstance(size, int | float):
        raise LearnableSparsityError(f"{name} must be an int count or a float fraction: {size!r}")
    if isinstance(size, float):
        if not 0.0 < size < 1.0:
            raise LearnableSparsityError(f"{name} as a fraction must lie in (0, 1): {size!r}")
        return max(1, round(size * total))
    if size < 1:
        raise LearnableSparsityError(f"{name} as a count must be at least 1: {size!r}")
    return size


def _three_way(n: int, valid: int, test: int, source: str) -> None:
    if valid + test >= n:
        raise LearnableSparsityError(
            f"{source}: valid ({valid}) + test ({test}) images leave none of the {n} for training"
        )


# --------------------------------------------------------------------------- digits


def digits_splits(
    seed: int, valid_size: int | float = 0.1, test_size: int | float = 0.1
) -> ImageSplits:
    """scikit-learn's 8×8 digits (1,797 images, 17 grey levels) split at random by ``seed``.

    ``valid_size`` / ``test_size`` are counts or fractions of all images (see
    :func:`resolve_size`); training gets the rest. The same seed gives the same split.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.from_numpy(digits.data).float() / (DIGITS_LEVELS - 1)
    labels = torch.from_numpy(digits.target).long()
    n = images.shape[0]
    valid = resolve_size(valid_size, n, "valid_size")
    test = resolve_size(test_size, n, "test_size")
    _three_way(n, valid, test, "digits")
    order = torch.randperm(n, generator=seeded_generator(seed))
    every = ImageSet(images, labels)
    return ImageSplits(
        train=every.subset(order[: n - valid - test]),
        valid=every.subset(order[n - valid - test : n - test]),
        test=every.subset(order[n - test :]),
        levels=DIGITS_LEVELS,
        side=DIGITS_SIDE,
    )


# --------------------------------------------------------------------------- model inputs


def binarize(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Dynamic binarisation: each pixel is 1 with probability ``x`` (in [0, 1]), else 0.

    Returns a tensor of x's shape and dtype holding 0s and 1s; draw a fresh one per use.
    """
    return torch.bernoulli(x, generator=generator)


def quantize(x: Tensor, levels: int) -> Tensor:
    """Integer grey levels (int64 in ``[0, levels - 1]``) of images ``x`` in [0, 1].

    The inverse of ``k / (levels - 1)``: exact for images made that way (:class:`ImageSplits`).
    """
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 2:
        raise LearnableSparsityError(f"levels must be an int of at least 2: {levels!r}")
    return torch.round(x * (levels - 1)).long()


# --------------------------------------------------------------------------- semi-supervision


def _stratified_quotas(counts: Tensor, total: int) -> Tensor:
    """Per-class numbers summing to ``total``, proportional to ``counts`` (largest remainder)."""
    exact = counts.double() * total / counts.sum()
    quotas = exact.floor().long()
    remainders = exact - quotas
    # Ties go to the lower class id: a stable sort on the negated remainders.
    order = torch.sort(-remainders, stable=True).indices
    quotas[order[: total - int(quotas.sum())]] += 1
    return quotas


def labelled_split(
    train_labels: Tensor, fraction: float, seed: int, *, stratified: bool = True
) -> tuple[Tensor, Tensor]:
    """Indices (sorted int64) of the labelled and the unlabelled training images.

    ``round(fraction * N)`` images (at least 1) are labelled. With ``stratified`` (default) every
    class gets its proportional share (largest-remainder rounding), so the labelled classes are
    as balanced as the data, as in Kingma et al.'s M2 setup; otherwise they are a uniform random
    subset (the released SSVAE code's random 5K of 50K). ``seed`` fixes the choice.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise LearnableSparsityError(f"labelled fraction must be a number: {fraction!r}")
    if not 0.0 < fraction < 1.0:
        raise LearnableSparsityError(f"labelled fraction must lie in (0, 1): {fraction!r}")
    if train_labels.dim() != 1 or train_labels.numel() < 2:
        raise LearnableSparsityError(
            f"train_labels must be 1-d with at least 2 entries, got shape "
            f"{tuple(train_labels.shape)}"
        )
    labels = train_labels.long().cpu()
    n = labels.numel()
    total = min(n - 1, max(1, round(fraction * n)))
    generator = seeded_generator(seed)
    if stratified:
        classes, counts = torch.unique(labels, return_counts=True)
        quotas = _stratified_quotas(counts, total)
        chosen = []
        for label, quota in zip(classes.tolist(), quotas.tolist(), strict=True):
            members = torch.nonzero(labels == label).flatten()
            chosen.append(members[torch.randperm(members.numel(), generator=generator)[:quota]])
        labelled = torch.cat(chosen)
    else:
        labelled = torch.randperm(n, generator=generator)[:total]
    mask = torch.zeros(n, dtype=torch.bool)
    mask[labelled] = True
    return torch.nonzero(mask).flatten(), torch.nonzero(~mask).flatten()
