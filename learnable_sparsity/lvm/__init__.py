r"""Sparse marginalization of discrete and structured latent variables (Correia et al. 2020).

Three experiments share one method dispatcher (:mod:`learnable_sparsity.lvm.methods`), the common
settings and grid (:mod:`learnable_sparsity.lvm.settings`) and one training module
(:mod:`learnable_sparsity.lvm.training`: the loop and one resumable train-and-evaluate): the
semi-supervised VAE (:mod:`learnable_sparsity.lvm.ssvae`), the signalling game
(:mod:`learnable_sparsity.lvm.signal_game`) and the bit-vector VAE
(:mod:`learnable_sparsity.lvm.bitvector_vae`), each with its settings and its ``setup``. Every
objective has the form E_{z∼π(z|x)} ℓ(x, z) plus a term in the entropy of π.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from torch import nn

from learnable_sparsity.errors import LearnableSparsityError


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Fully connected ReLU network sizes[0] → sizes[1] → … → sizes[-1] (no activation last)."""
    if len(sizes) < 2 or any(size < 1 for size in sizes):
        raise LearnableSparsityError(f"mlp needs at least two positive layer sizes, got {sizes}")
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])
