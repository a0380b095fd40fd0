"""Edge cases behave the same on the three paths of every normalizer.

The paths: the eager solvers (``fused.disabled()``), the fused C++ kernels on the CPU (the
default for CPU tensors; ``topk_softmax`` has its own) and the Triton kernels (compiled on CUDA
where there is a GPU, else run by Triton's interpreter on CPU tensors, as in
``test_triton.py``; softmax and top-k have no Triton kernel and run their own code there). The
table of docs/library.md ("Edge cases"):

* −inf score → 0 (like a mask); all −inf → a zero row, zero gradient;
* NaN or +inf score → NaN on the whole row and its gradient (torch.softmax's answer to +inf);
  a masked NaN or +inf is just masked; other rows unaffected;
* empty input, shape (3, 0) or (0, 5) → an empty result of that shape, with a gradient;
* α = inf (or NaN, or < 1) as a Python number → ValueError naming alpha on every path; as a
  tensor → ValueError on the eager and C++ paths, NaN rows on Triton (no wait for the device);
* α as a list or a NumPy array = α as ``torch.as_tensor(α)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import numpy as np
import pytest
import torch
from torch import Tensor

from learnable_sparsity.core import fused, fused_triton
from learnable_sparsity.core.normalizers import entmax, entmax15, softmax, sparsemax, topk_softmax
from tests.core.conftest import NO_COMPILER

INF, NAN = math.inf, math.nan
CUDA = torch.cuda.is_available()
NORMALIZERS: dict[str, Callable[..., Tensor]] = {
    "softmax": softmax,
    "sparsemax": sparsemax,
    "entmax15": entmax15,
    "entmax_1.3": lambda x, **kw: entmax(x, 1.3, **kw),
    "entmax_tensor_alpha": lambda x, **kw: entmax(x, torch.tensor(1.3, device=x.device), **kw),
    "entmax_2.5": lambda x, **kw: entmax(x, 2.5, **kw),
    "topk_2": lambda x, **kw: topk_softmax(x, 2, **kw),
}
# fp32 agreement of the paths' solvers on ordinary rows (different operation orders).
TOL = 1e-6


def _triton_skip() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    return None if fused_triton.available() else "the Triton kernels did not load"


PATHS = [
    "eager",
    pytest.param("cpp", marks=pytest.mark.skipif(NO_COMPILER is not None, reason=str(NO_COMPILER))),
    pytest.param(
        "triton", marks=pytest.mark.skipif(_triton_skip() is not None, reason=str(_triton_skip()))
    ),
]


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest) -> Iterator[tuple[str, torch.device]]:
    """(path name, device of its tensors) with that path selected."""
    name = request.param
    with ExitStack() as stack:
        device = torch.device("cpu")
        if name == "eager":
            stack.enter_context(fused.disabled())
            stack.enter_context(fused_triton.disabled())
        elif name == "cpp":
            stack.enter_context(fused_triton.disabled())
        elif CUDA:
            device = torch.device("cuda")
        else:
            stack.enter_context(fused_triton.on_cpu())
            stack.enter_context(fused.disabled())
        yield name, device


def _run(
    fn: Callable[..., Tensor], x: Tensor, g: Tensor | None = None, **kw
) -> tuple[Tensor, Tensor]:
    """(p, ∂⟨p, g⟩/∂x), by default for g evenly spaced in [−1, 1]."""
    x = x.clone().requires_grad_(True)
    p = fn(x, **kw)
    if g is None:
        g = torch.linspace(-1, 1, p.numel(), device=p.device).reshape(p.shape)
    (grad,) = torch.autograd.grad((p * g).sum(), x)
    return p.detach(), grad


def _eager(fn: Callable[..., Tensor], x: Tensor, **kw) -> tuple[Tensor, Tensor]:
    with fused.disabled(), fused_triton.disabled():
        return _run(fn, x.cpu(), **{k: v.cpu() for k, v in kw.items()})


@pytest.mark.parametrize("name", NORMALIZERS)
def test_infinite_and_nan_scores(name: str, path: tuple[str, torch.device]) -> None:
    _, device = path
    fn = NORMALIZERS[name]
    x = torch.tensor(
        [
            [INF, 0.0, 1.0, 0.5],  # +inf → NaN row
            [INF, INF, 0.0, 0.5],
            [NAN, 0.0, 1.0, 0.5],  # NaN → NaN row
            [-INF, 0.0, 1.0, 0.5],  # −inf → 0, the rest as without it
            [-INF, -INF, -INF, -INF],  # nothing left → zeros
            [2.0, 0.0, 1.0, 0.5],  # an ordinary row
        ],
        device=device,
    )
    p, grad = _run(fn, x)
    assert torch.isnan(p[:3]).all() and torch.isnan(grad[:3]).all()
    assert not torch.isnan(p[3:]).any() and not torch.isnan(grad[3:]).any()
    assert p[3, 0] == 0 and grad[3, 0] == 0
    assert torch.equal(p[4], torch.zeros(4, device=device)) and not grad[4].any()
    alone, _ = _run(fn, x[3:4, 1:])
    torch.testing.assert_close(p[3:4, 1:], alone, atol=TOL, rtol=0)
    expected, expected_grad = _eager(fn, x)
    torch.testing.assert_close(p.cpu(), expected, atol=TOL, rtol=0, equal_nan=True)
    torch.testing.assert_close(grad.cpu(), expected_grad, atol=TOL, rtol=0, equal_nan=True)


@pytest.mark.parametrize("name", NORMALIZERS)
def test_masked_infinities_and_nan_are_only_masked(
    name: str, path: tuple[str, torch.device]
) -> None:
    _, device = path
    fn = NORMALIZERS[name]
    x = torch.tensor([[INF, 0.0, 1.0], [NAN, 2.0, 1.0], [-INF, 0.5, 1.0]], device=device)
    mask = torch.tensor([False, True, True], device=device)
    g = torch.linspace(-1, 1, x.numel(), device=device).reshape(x.shape)
    p, grad = _run(fn, x, g, mask=mask)
    finite, finite_grad = _run(fn, x[:, 1:], g[:, 1:])
    torch.testing.assert_close(p[:, 1:], finite, atol=TOL, rtol=0)
    torch.testing.assert_close(grad[:, 1:], finite_grad, atol=TOL, rtol=0)
    assert not p[:, 0].any() and not grad[:, 0].any()


@pytest.mark.parametrize("shape", [(3, 0), (0, 5), (2, 0, 4)])
@pytest.mark.parametrize("name", NORMALIZERS)
def test_empty_input_gives_an_empty_result(
    name: str, shape: tuple[int, ...], path: tuple[str, torch.device]
) -> None:
    _, device = path
    x = torch.zeros(shape, device=device)
    p, grad = _run(NORMALIZERS[name], x)
    assert p.shape == shape and grad.shape == shape and p.dtype == x.dtype
    masked = NORMALIZERS[name](x, mask=torch.ones(shape, dtype=torch.bool, device=device))
    assert masked.shape == shape
    assert NORMALIZERS[name](x, dim=0).shape == shape


@pytest.mark.parametrize("alpha", [INF, NAN, 0.5])
def test_an_invalid_number_alpha_is_refused_on_every_path(
    alpha: float, path: tuple[str, torch.device]
) -> None:
    _, device = path
    x = torch.randn(2, 5, device=device)
    with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
        entmax(x, alpha)
    with pytest.raises(ValueError, match="alpha"):
        entmax(torch.zeros(3, 0, device=device), alpha)


def test_an_infinite_tensor_alpha_is_refused_or_gives_nan_rows_on_triton(
    path: tuple[str, torch.device],
) -> None:
    name, device = path
    x = torch.randn(2, 5, device=device)
    alpha = torch.tensor([[INF], [1.3]], device=device)
    if name == "triton":
        p = entmax(x, alpha)
        assert torch.isnan(p[0]).all()
        torch.testing.assert_close(p[1], entmax(x[1], 1.3), atol=TOL, rtol=0)
    else:
        with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
            entmax(x, alpha)


@pytest.mark.parametrize(
    "alpha", [[[1.3], [1.7]], np.array([[1.3], [1.7]]), (1.3,), np.float32(1.3)], ids=repr
)
def test_alpha_as_a_list_or_array_is_alpha_as_a_tensor(
    alpha: object, path: tuple[str, torch.device]
) -> None:
    _, device = path
    x = torch.randn(2, 5, generator=torch.Generator().manual_seed(0)).to(device)
    expected = entmax(x, torch.as_tensor(alpha, dtype=torch.float32, device=device))
    torch.testing.assert_close(entmax(x, alpha), expected, atol=0, rtol=0)


def test_alpha_that_is_no_number_is_refused() -> None:
    with pytest.raises(ValueError, match="alpha must be a number or a tensor"):
        entmax(torch.randn(2, 3), "1.5")
