"""The normalizer registry (``learnable_sparsity.core.registry``): its entries, the one argument
dispatch, and registration."""

from __future__ import annotations

import pytest
import torch

from learnable_sparsity.core.normalizers import entmax, softmax, sparsemax, topk_softmax
from learnable_sparsity.core.registry import NORMALIZERS, Normalizer, get, register, registered


def test_the_built_in_normalizers_in_table_order() -> None:
    assert list(NORMALIZERS) == ["softmax", "sparsemax", "entmax15", "entmax_alpha", "topk"]
    assert {n.argument for n in NORMALIZERS.values()} == {None, "k", "alpha"}
    assert [n for n, spec in NORMALIZERS.items() if spec.fused_attention] == ["entmax_alpha"]


def test_a_call_passes_the_argument_the_normalizer_takes() -> None:
    x = torch.randn(2, 3, 6)
    mask = torch.rand(2, 3, 6) > 0.2
    alpha = torch.tensor([1.2, 1.7, 1.4]).view(1, 3, 1)
    assert torch.equal(NORMALIZERS["softmax"](x, mask, k=2, alpha=alpha), softmax(x, mask=mask))
    assert torch.equal(NORMALIZERS["sparsemax"](x, mask), sparsemax(x, mask=mask))
    assert torch.equal(
        NORMALIZERS["topk"](x, mask, k=2, alpha=alpha), topk_softmax(x, 2, mask=mask)
    )
    assert torch.equal(
        NORMALIZERS["entmax_alpha"](x, mask, alpha=alpha), entmax(x, alpha, mask=mask)
    )
    with pytest.raises(ValueError, match="'topk' needs k"):
        NORMALIZERS["topk"](x, alpha=alpha)
    with pytest.raises(ValueError, match="'entmax_alpha' needs alpha"):
        NORMALIZERS["entmax_alpha"](x, k=2)


def test_registration_is_checked_and_undone() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(Normalizer("sparsemax", sparsemax, "again"))
    with pytest.raises(ValueError, match="argument must be one of"):
        Normalizer("odd", sparsemax, "odd", argument="beta")
    with pytest.raises(ValueError, match="a fused attention takes α"):
        Normalizer("odd", sparsemax, "odd", fused_attention=sparsemax)
    with pytest.raises(ValueError, match="an identifier"):
        Normalizer("two words", sparsemax, "odd")
    with registered(Normalizer("double_sparsemax", sparsemax, "double")) as spec:
        assert get("double_sparsemax") is spec and list(NORMALIZERS)[-1] == "double_sparsemax"
    assert "double_sparsemax" not in NORMALIZERS
    with pytest.raises(ValueError, match="normalizer must be one of softmax, sparsemax"):
        get("double_sparsemax")
    with pytest.raises(TypeError):
        NORMALIZERS["x"] = NORMALIZERS["softmax"]  # read-only: register() is the way in
