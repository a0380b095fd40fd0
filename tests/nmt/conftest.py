"""Fixtures for the NMT tests: the shared tiny Transformer (tests/tiny_transformer.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from learnable_sparsity.nmt.model import Transformer, TransformerConfig
from tests.tiny_transformer import random_tokens, tiny_config, tiny_model


@pytest.fixture
def make_config() -> Callable[..., TransformerConfig]:
    """``make_config(normalizer, **overrides)``: the tiny config."""
    return tiny_config


@pytest.fixture
def make_model() -> Callable[..., Transformer]:
    """``make_model(normalizer, seed, *, training, **overrides)``: a random tiny model."""
    return tiny_model


@pytest.fixture
def make_tokens() -> Callable[[list[int], int], torch.Tensor]:
    """``make_tokens(lengths, seed)``: right-padded random ids."""
    return random_tokens
