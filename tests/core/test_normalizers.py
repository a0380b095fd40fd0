"""Correctness tests for ``learnable_sparsity.core.normalizers``.

Oracle: the ``entmax`` package (v1.3, test-only dependency). Every oracle reference is computed in
float64 from the *same* inputs upcast, so the fp32 tolerances (1e-5) measure the module's own error
and not the oracle's: the package computes in the input dtype and scales x by (α−1) before
subtracting the row maximum, so in fp32 at scale 100 the oracle itself is off by ~1e-5.
``entmax_bisect`` is run with ``n_iter=100`` in float64 (the bracket then collapses to adjacent
floats; its final renormalisation is harmless at that precision). It is never used at α = 1, where
it returns the uniform distribution: softmax is the reference there.

Threshold convention throughout: p_i = [(α−1) x_i − τ]_+^{1/(α−1)}.

Every test runs on the CPU, on the fused C++ kernels (``learnable_sparsity.core.fused``) and on the
eager solvers (the fall-back), and where PyTorch sees a GPU also on CUDA, on the Triton kernels
(``learnable_sparsity.core.fused_triton``) and on the eager solvers; those marked ``eager_solvers``,
which look at the eager solvers' internals (candidate packing, the iteration cap), on the eager
solvers only. Inputs are drawn on the CPU from seeded generators and moved to the solvers' device
(the ``device`` fixture), so that every device sees the same numbers. ``oracle`` and
``masked_oracle`` compute on the CPU and return on the input's device; the tests that need the
package's autograd run it on the device.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from entmax import entmax15 as ref_entmax15
from entmax import entmax_bisect as ref_entmax_bisect
from entmax import sparsemax as ref_sparsemax

from learnable_sparsity.core import fused, fused_triton
from learnable_sparsity.core import normalizers as normalizers_module
from learnable_sparsity.core.normalizers import (
    entmax,
    entmax15,
    entmax_threshold,
    softmax,
    sparsemax,
    topk_softmax,
)
from tests.core.conftest import CUDA, NO_COMPILER

F32 = torch.float32
F64 = torch.float64
TOL = {F32: 1e-5, F64: 1e-10}
SCALES = (0.1, 1.0, 10.0, 100.0)
ALPHAS = (1.05, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)
GRAD_ALPHAS = (1.1, 1.25, 1.5, 1.75, 2.0, 2.5)
ROW_ALPHAS = (1.1, 1.5, 2.0, 2.7, 1.3)


# The solvers under test -> their device. The CUDA ones are there only where PyTorch sees a GPU.
SOLVERS = {"fused": "cpu", "eager": "cpu"} | (
    {"triton": "cuda", "eager-cuda": "cuda"} if CUDA else {}
)
EAGER = ("eager", "eager-cuda")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    eager_only = metafunc.definition.get_closest_marker("eager_solvers") is not None
    names = [name for name in SOLVERS if name in EAGER or not eager_only]
    metafunc.parametrize("solvers", names, indirect=True)


@pytest.fixture(autouse=True)
def solvers(request: pytest.FixtureRequest):
    """Which solvers the test runs on: a set of kernels (which must be there) or the eager ones."""
    name = request.param
    if name == "fused":
        # Without a compiler the kernels cannot be tested (the eager solvers still are); with one,
        # a failing build fails here.
        if NO_COMPILER is not None:
            pytest.skip(NO_COMPILER)
        assert fused.available(), "the fused CPU kernels did not build (see the warning)"
        yield name
    elif name == "triton":
        assert fused_triton.available(), "the Triton kernels did not load on this GPU"
        yield name
    else:
        with _eager_solvers():
            yield name


@pytest.fixture
def device(solvers: str, monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """The device of the solvers under test, where the tests build their inputs. The functions
    under test refuse scores from elsewhere: a tensor left on the CPU would otherwise pass a CUDA
    test on the CPU solvers."""
    device = torch.device(SOLVERS[solvers])
    for name in UNDER_TEST:
        monkeypatch.setitem(globals(), name, _requiring(device, globals()[name]))
    return device


UNDER_TEST = ("softmax", "sparsemax", "entmax15", "entmax", "topk_softmax", "entmax_threshold")


def _requiring(device: torch.device, fn):
    """``fn``, asserting that its scores lie on ``device``."""

    @functools.wraps(fn)
    def checked(x, *args, **kwargs):
        assert x.device.type == device.type, f"{fn.__name__} got scores on {x.device}"
        return fn(x, *args, **kwargs)

    return checked


@contextmanager
def _eager_solvers() -> Iterator[None]:
    """The eager solvers on any device: the C++ and the Triton kernels switched off."""
    with fused.disabled(), fused_triton.disabled():
        yield


eager_solvers = pytest.mark.eager_solvers

# --------------------------------------------------------------------------- input helpers


def _randn(shape, seed, dtype=F32, scale=1.0, *, device):
    """Drawn on the CPU and then moved, so that every device sees the same numbers."""
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g, dtype=F64)).to(device, dtype)


def _rand_mask(shape, seed, keep=0.6, *, device):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) < keep).to(device)


def _shape_dim1(shape, dim):
    shape = list(shape)
    shape[dim] = 1
    return shape


def _alpha_rows(x, dim, values=ROW_ALPHAS):
    """One α per row (tensor with ``dim`` of size 1), cycling through ``values``."""
    shape = _shape_dim1(x.shape, dim)
    n = math.prod(shape)
    dtype = F64 if x.dtype == F64 else F32
    v = torch.tensor(values, dtype=dtype, device=x.device)
    return v[torch.arange(n, device=x.device) % len(values)].reshape(shape)


def _expand_alpha(alpha, x, dim):
    """α as a float, or as a float64 tensor on x's device expanded to x's shape with ``dim`` of
    size 1."""
    if isinstance(alpha, torch.Tensor):
        return alpha.detach().to(x.device, F64).expand(_shape_dim1(x.shape, dim))
    return float(alpha)


# --------------------------------------------------------------------------- references


def oracle(x, alpha, dim=-1, n_iter=100):
    """float64 α-entmax from the entmax package (softmax at α = 1), normalising along ``dim``;
    computed on the CPU (the same numbers for every device) and returned on x's device."""
    x64 = x.detach().to("cpu", F64)
    a = _expand_alpha(alpha, x64, dim)
    rows = x64.movedim(dim, -1)
    if isinstance(a, torch.Tensor):
        a = a.movedim(dim, -1)
        is_one = a == 1
        out = ref_entmax_bisect(rows, a.clamp(min=1.01), dim=-1, n_iter=n_iter)
        out = torch.where(is_one, torch.softmax(rows, dim=-1), out)
    elif a == 1.0:
        out = torch.softmax(rows, dim=-1)
    elif a == 2.0:
        out = ref_sparsemax(rows, dim=-1)
    elif a == 1.5:
        out = ref_entmax15(rows, dim=-1)
    else:
        out = ref_entmax_bisect(rows, a, dim=-1, n_iter=n_iter)
    return out.movedim(-1, dim).to(x.device)


def masked_oracle(x, alpha, dim=-1, mask=None):
    """float64 reference of the masked function: the oracle on each row's unmasked entries (on
    the CPU, returned on x's device)."""
    if mask is None:
        return oracle(x, alpha, dim)
    x64 = x.detach().to("cpu", F64)
    d = x.shape[dim]
    xs = x64.movedim(dim, -1).reshape(-1, d)
    ms = torch.broadcast_to(mask.cpu(), x.shape).movedim(dim, -1).reshape(-1, d)
    a = _expand_alpha(alpha, x64, dim)
    rows_a = a.movedim(dim, -1).reshape(-1) if isinstance(a, torch.Tensor) else None
    out = torch.zeros_like(xs)
    for r in range(xs.shape[0]):
        if ms[r].any():
            a_r = a if rows_a is None else float(rows_a[r])
            out[r, ms[r]] = oracle(xs[r, ms[r]], a_r)
    return out.reshape(x64.movedim(dim, -1).shape).movedim(-1, dim).to(x.device)


def topk_reference(x, k, dim=-1, mask=None):
    """Softmax over the scores ≥ the k-th largest unmasked one (k clipped), built independently."""
    x64 = x.detach().to(F64).movedim(dim, -1)
    if mask is None:
        m = torch.ones_like(x64, dtype=torch.bool)
    else:
        m = torch.broadcast_to(mask, x.shape).movedim(dim, -1)
    avail = m.sum(-1, keepdim=True)
    k_eff = avail.clamp(max=k, min=1)
    ordered = torch.topk(x64.masked_fill(~m, -math.inf), x64.shape[-1], dim=-1).values
    kth = ordered.gather(-1, k_eff - 1)
    keep = m & (x64 >= kth) & (avail > 0)
    e = torch.where(keep, torch.exp(torch.where(keep, x64 - ordered[..., :1], 0.0)), 0.0)
    out = e / e.sum(-1, keepdim=True).clamp(min=1e-300)
    return out.movedim(-1, dim)


def _gap(x, alpha, dim=-1, p_ref=None):
    """(α−1) x_i − τ in float64 with τ from the oracle: > 0 on the support, ≤ 0 off it."""
    x64 = x.detach().to(F64)
    p = oracle(x64, alpha, dim) if p_ref is None else p_ref
    a = _expand_alpha(alpha, x64, dim)
    j = p.argmax(dim, keepdim=True)
    tau = (a - 1) * x64.gather(dim, j) - p.gather(dim, j) ** (a - 1)
    return (a - 1) * x64 - tau


def _assert_entmax_close(p, ref, alpha, x, dim=-1, tol=None):
    """max |p − ref| ≤ tol, plus, for α > 2, the conditioning of the 1/(α−1) < 1 power.

    For α > 2, p = base^{1/(α−1)} is not Lipschitz at base = 0: an absolute error δ of a few ulps
    in base = (α−1)x − τ (which every implementation makes, since τ is only representable to
    ~ulp(1)) moves a small p by up to (p^{α−1} + δ)^{1/(α−1)} − p. The module computes α > 2 in
    float64 whatever p.dtype, so δ is a few fp64 ulps (in fp32 it would be ~2e-5 at p ≈ 3e-3 for
    α = 3). That slack is allowed on top of ``tol``; for α ≤ 2 none is.
    """
    tol = TOL[p.dtype] if tol is None else tol
    ref = ref.detach().to(F64)
    err = (p.detach().to(F64) - ref).abs()
    a = _expand_alpha(alpha, x, dim)
    am1 = torch.as_tensor(a, dtype=F64, device=ref.device) - 1
    delta = 4 * torch.finfo(F64).eps
    slack = torch.where(am1 > 1, (ref**am1 + delta) ** (1 / am1) - ref, 0.0)
    bad = err > tol + slack
    assert not bool(bad.any()), (
        f"max err {err.max().item():.3g}; worst excess {(err - tol - slack).max().item():.3g} "
        f"at p_ref = {ref[bad][0].item():.6g}"
    )


def _assert_support_agrees(p, x, alpha, dim=-1, p_ref=None):
    """Supports must be identical except for entries within a margin of the threshold.

    Entries whose exact probability underflows the dtype (tiny p, which happens for α near 1)
    are not required to be positive.
    """
    p_ref = oracle(x, alpha, dim) if p_ref is None else p_ref
    gap = _gap(x, alpha, dim, p_ref)
    margin, tiny = (1e-6, 1e-30) if p.dtype == F32 else (1e-12, 1e-290)
    clearly_in = (gap > margin) & (p_ref > tiny)
    clearly_out = gap < -margin
    assert clearly_in.any()
    assert bool((p[clearly_in] > 0).all()), "an entry clearly in the support got p = 0"
    assert bool((p[clearly_out] == 0).all()), "an entry clearly off the support got p > 0"


def _separated(shape, alpha, dim=-1, seed=0, scale=1.0, margin=1e-2, *, device):
    """float64 randn input with entries ≥ margin apart and ≥ margin from the support boundary,
    on ``device`` (searched for on the CPU).

    Finite differences with eps = 1e-6 then never move an entry across the boundary (or change
    a top-k set), so gradcheck compares derivatives of one smooth piece.
    """
    for s in range(seed, seed + 500):
        x = _randn(shape, s, F64, scale, device="cpu")
        spacing = x.sort(dim=dim).values.diff(dim=dim)
        if spacing.numel() and spacing.min() < margin:
            continue
        if alpha is not None and _gap(x, alpha, dim).abs().min() < margin:
            continue
        return x.to(device)
    raise RuntimeError("no well-separated input found")


def _max_err(a, b):
    return (a.detach().to(F64) - b.detach().to(F64)).abs().max().item()


# Every public function, as f(x, dim, mask), with the spec of its reference.
CASES = {
    "softmax": (lambda x, dim, mask: softmax(x, dim=dim, mask=mask), 1.0),
    "sparsemax": (lambda x, dim, mask: sparsemax(x, dim=dim, mask=mask), 2.0),
    "entmax15": (lambda x, dim, mask: entmax15(x, dim=dim, mask=mask), 1.5),
    "entmax_1": (lambda x, dim, mask: entmax(x, 1.0, dim=dim, mask=mask), 1.0),
    "entmax_1.25": (lambda x, dim, mask: entmax(x, 1.25, dim=dim, mask=mask), 1.25),
    "entmax_2.5": (lambda x, dim, mask: entmax(x, 2.5, dim=dim, mask=mask), 2.5),
    "entmax_rows": (
        lambda x, dim, mask: entmax(x, _alpha_rows(x, dim), dim=dim, mask=mask),
        "rows",
    ),
    "topk2": (lambda x, dim, mask: topk_softmax(x, 2, dim=dim, mask=mask), "topk2"),
}
NAMES = tuple(CASES)


def _run(name, x, dim=-1, mask=None):
    return CASES[name][0](x, dim, mask)


def _expected(name, x, dim=-1, mask=None):
    spec = CASES[name][1]
    if spec == "topk2":
        return topk_reference(x, 2, dim, mask)
    alpha = _alpha_rows(x, dim) if spec == "rows" else spec
    return masked_oracle(x, alpha, dim, mask)


# --------------------------------------------------------------------------- 1. oracle agreement

ORACLE_SHAPES = (((1, 7), -1), ((5, 16), -1), ((3, 4, 33), -1), ((2, 3, 5, 64), -1), ((9, 4, 3), 0))


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("fn_name", ["sparsemax", "entmax15"])
def test_exact_functions_match_oracle(fn_name, scale, dtype, device):
    fn, alpha = (sparsemax, 2.0) if fn_name == "sparsemax" else (entmax15, 1.5)
    for i, (shape, dim) in enumerate(ORACLE_SHAPES):
        x = _randn(shape, 100 + i, dtype, scale, device=device)
        p = fn(x, dim=dim)
        assert p.dtype == dtype and p.shape == x.shape
        ref = oracle(x, alpha, dim)
        assert _max_err(p, ref) <= TOL[dtype], (shape, dim)
        _assert_support_agrees(p, x, alpha, dim, ref)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_entmax_scalar_alpha_matches_oracle(alpha, scale, dtype, device):
    for i, (shape, dim) in enumerate(ORACLE_SHAPES):
        x = _randn(shape, 200 + i, dtype, scale, device=device)
        p = entmax(x, alpha, dim=dim)
        assert p.dtype == dtype and p.shape == x.shape
        ref = oracle(x, alpha, dim)
        _assert_entmax_close(p, ref, alpha, x, dim)
        _assert_support_agrees(p, x, alpha, dim, ref)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("scale", SCALES)
def test_entmax_per_row_alpha_matches_oracle(scale, dtype, device):
    g = torch.Generator().manual_seed(7)
    x = _randn((12, 20), 300, dtype, scale, device=device)
    alpha = (1.05 + 1.95 * torch.rand(12, 1, generator=g, dtype=F64)).to(device, dtype)
    alpha[0], alpha[1] = 2.0, 1.5
    p = entmax(x, alpha)
    ref = oracle(x, alpha)
    _assert_entmax_close(p, ref, alpha, x)
    _assert_support_agrees(p, x, alpha, -1, ref)
    # Same per-row α along a non-last dim.
    xt = x.t().contiguous()
    pt = entmax(xt, alpha.t(), dim=0)
    _assert_entmax_close(pt, oracle(xt, alpha.t(), 0), alpha.t(), xt, 0)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("scale", SCALES)
def test_entmax_per_head_alpha_matches_oracle(scale, dtype, device):
    x = _randn((2, 4, 5, 12), 400, dtype, scale, device=device)  # [B, H, T, S]
    alpha = torch.tensor([1.1, 1.5, 2.0, 2.7], dtype=dtype, device=device).view(1, 4, 1, 1)
    p = entmax(x, alpha)
    ref = ref_entmax_bisect(x.to(F64), alpha.to(F64).expand(2, 4, 5, 1), dim=-1, n_iter=100)
    _assert_entmax_close(p, ref, alpha, x)
    _assert_support_agrees(p, x, alpha, -1, ref)
    # Each head equals the scalar-α function of that head.
    for h in range(4):
        ph = entmax(x[:, h], float(alpha[0, h, 0, 0]))
        _assert_entmax_close(ph, p[:, h], float(alpha[0, h, 0, 0]), ph)


def test_masked_functions_match_oracle_on_unmasked_subset(device):
    x = _randn((4, 3, 10), 500, F64, 2.0, device=device)
    mask = _rand_mask(x.shape, 501, device=device)
    mask[0, 0] = False  # a fully masked row
    mask[1, 1] = False
    mask[1, 1, 4] = True  # a row with a single key
    key_pad = torch.ones(4, 1, 10, dtype=torch.bool, device=device)
    key_pad[2, :, 6:] = False
    causal = torch.ones(10, 10, dtype=torch.bool, device=device).tril()[:3]
    for name in NAMES:
        for m in (mask, key_pad, causal):
            for dtype in (F32, F64):
                xd = x.to(dtype)
                p = _run(name, xd, -1, m)
                assert p.dtype == dtype
                assert bool((p[~torch.broadcast_to(m, x.shape)] == 0).all()), name
                assert _max_err(p, _expected(name, xd, -1, m)) <= TOL[dtype], (name, dtype)


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_masked_functions_along_other_dims(dim, device):
    x = _randn((6, 5, 4), 510, F64, 2.0, device=device)
    mask = _rand_mask(x.shape, 511, device=device)
    for name in NAMES:
        p = _run(name, x, dim, mask)
        assert _max_err(p, _expected(name, x, dim, mask)) <= 1e-10, name


# --------------------------------------------------------------------------- 2. optimality


@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("alpha", [1.1, 1.5, 2.0, 2.5, 3.0, "rows"])
def test_threshold_satisfies_kkt(alpha, dim, device):
    x = _randn((5, 6, 7), 600, F64, 3.0, device=device)
    a = _alpha_rows(x, dim) if alpha == "rows" else alpha
    res = entmax_threshold(x, a, dim=dim)
    p = entmax(x, a, dim=dim)
    assert tuple(res.tau.shape) == tuple(_shape_dim1(x.shape, dim))
    assert res.iterations.numel() == res.tau.numel()
    assert bool((res.iterations >= 0).all())
    am1 = _expand_alpha(a, x, dim) - 1
    z = am1 * x - res.tau.to(F64)  # (α−1) x_i − τ
    on = p > 0
    tol = 1e-9 * (1 + (am1 * x).abs().max().item())
    assert bool(on.any(dim).all())
    # On the support: (α−1) x_i − τ = p_i^(α−1); off it: (α−1) x_i ≤ τ.
    assert ((z - p**am1).abs()[on]).max().item() <= tol
    assert bool((z[~on] <= tol).all())
    # τ alone reproduces p.
    p_tau = z.clamp(min=0) ** (1 / am1)
    assert _max_err(p_tau, p) <= 1e-10


def test_threshold_satisfies_kkt_fp32_and_masked(device):
    x = _randn((8, 15), 610, F32, 2.0, device=device)
    mask = _rand_mask(x.shape, 611, device=device)
    mask[0] = True
    mask[1] = False
    mask[1, 3] = True
    for alpha in (1.25, 1.5, 2.0, 2.5):
        res = entmax_threshold(x, alpha, mask=mask)
        p = entmax(x, alpha, mask=mask)
        z = (alpha - 1) * x.to(F64) - res.tau.to(F64)
        on = p > 0
        tol = 1e-6 * (1 + (alpha - 1) * x.abs().max().item())
        assert bool((on <= mask).all())
        assert ((z - p.to(F64) ** (alpha - 1)).abs()[on]).max().item() <= tol, alpha
        assert bool((z[mask & ~on] <= tol).all()), alpha


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", NAMES)
def test_outputs_lie_on_simplex(name, dtype, device):
    for scale in SCALES:
        x = _randn((6, 3, 50), 700, dtype, scale, device=device)
        p = _run(name, x)
        assert bool((p >= 0).all()) and bool((p <= 1).all())
        assert _max_err(p.sum(-1), torch.ones(6, 3, device=device)) <= (
            1e-5 if dtype == F32 else 1e-12
        )


@pytest.mark.parametrize("name", NAMES)
def test_shift_invariance(name, device):
    x = _randn((4, 9), 800, F64, 2.0, device=device)
    mask = _rand_mask(x.shape, 801, 0.8, device=device)
    mask[:, 0] = True
    c = torch.tensor([[-7.5], [0.25], [100.0], [-1000.0]], dtype=F64, device=device)
    for m in (None, mask):
        p = _run(name, x, -1, m)
        assert _max_err(_run(name, x + c, -1, m), p) <= 1e-10
        assert _max_err(_run(name, x + 3.0, -1, m), p) <= 1e-12


@pytest.mark.parametrize("name", NAMES)
def test_permutation_equivariance(name, device):
    x = _randn((5, 11), 900, F64, 2.0, device=device)
    mask = _rand_mask(x.shape, 901, 0.7, device=device)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(902)).to(device)
    for m in (None, mask):
        p = _run(name, x, -1, m)
        pp = _run(name, x[:, perm], -1, None if m is None else m[:, perm])
        assert _max_err(pp, p[:, perm]) <= 1e-12


@pytest.mark.parametrize("dtype", [F32, F64])
def test_alpha_two_is_sparsemax_and_alpha_one_point_five_is_entmax15(dtype, device):
    x = _randn((6, 4, 13), 1000, dtype, 2.0, device=device)
    mask = _rand_mask(x.shape, 1001, device=device)
    tol = 1e-6 if dtype == F32 else 1e-12
    for m in (None, mask):
        for a, fn in ((2.0, sparsemax), (1.5, entmax15)):
            ref = fn(x, mask=m)
            assert _max_err(entmax(x, a, mask=m), ref) <= tol
            # The general (tensor-α) solver.
            a_t = torch.full((6, 4, 1), a, dtype=dtype, device=device)
            assert _max_err(entmax(x, a_t, mask=m), ref) <= tol
            a_t = torch.tensor(a, dtype=dtype, device=device).view(1, 1, 1)
            assert _max_err(entmax(x, a_t, mask=m), ref) <= tol


@pytest.mark.parametrize("dtype", [F32, F64])
def test_alpha_exactly_one_is_softmax(dtype, device):
    x = _randn((6, 4, 13), 1100, dtype, 3.0, device=device)
    mask = _rand_mask(x.shape, 1101, device=device)
    tol = 1e-6 if dtype == F32 else 1e-12
    for m in (None, mask):
        ref = softmax(x, mask=m)
        assert _max_err(ref, masked_oracle(x, 1.0, -1, m)) <= tol
        assert _max_err(entmax(x, 1.0, mask=m), ref) <= tol
        # α = 1 inside a per-row α tensor (the tensor path): those rows are softmax.
        a = _alpha_rows(x, -1, values=(1.0, 1.5, 2.0))
        p = entmax(x, a, mask=m)
        rows = (a == 1.0).squeeze(-1)
        assert _max_err(p[rows], ref[rows]) <= tol
        assert _max_err(p[~rows], masked_oracle(x, a, -1, m)[~rows]) <= TOL[dtype]


def _alpha_derivative_at_one(p, g):
    """Σ_i g_i ∂p_i/∂α at α = 1: ∂p_i/∂α = (−p_i log²p_i + p_i Σ_j p_j log²p_j) / 2."""
    l2 = p.log() ** 2
    dp = 0.5 * (-p * l2 + p * (p * l2).sum(-1, keepdim=True))
    return dp, (g * dp).sum(-1, keepdim=True)


def test_alpha_to_one_approaches_softmax(device):
    x = _randn((5, 12), 1200, F64, 2.0, device=device)
    sm = torch.softmax(x, -1)
    dp, _ = _alpha_derivative_at_one(sm, torch.zeros_like(x))
    # First-order expansion entmax_{1+h} = softmax + h ∂p/∂α|_{α=1} + O(h²) (thesis appendix).
    for h, tol in ((1e-2, 1e-4), (1e-3, 1e-6), (1e-4, 1e-7)):
        p = entmax(x, 1 + h)
        assert _max_err(p, sm + h * dp) <= tol, h
        assert _max_err(entmax(x, torch.full((5, 1), 1 + h, dtype=F64, device=device)), p) <= 1e-12
    # fp32 near α = 1: still softmax to ~1e-3 (the exactness test below holds it to 1e-6).
    x32 = x.float()
    assert _max_err(entmax(x32, 1.0001), torch.softmax(x32, -1)) <= 2e-3
    assert _max_err(entmax(x32, 1.01), oracle(x32, 1.01)) <= 1e-5


@pytest.mark.parametrize("alpha", [1.0001, 1.001, 1.005, 1.01, 1.02])
@pytest.mark.parametrize(("shape", "scale"), [((16, 50), 1.0), ((2, 65536), 10.0)])
def test_float32_alpha_entmax_is_exact_near_alpha_one(alpha, shape, scale, device):
    """The 1/(α − 1) power multiplies the rounding of 1 + z − τ: a float solve was off by 2.5e-5
    at α = 1.0001 (a float64 oracle found it); rows that close to softmax are solved in double,
    the rest (the models' α ≥ 1.01) in float within the same bound. α is given as the float32
    value the kernel sees, so the oracle solves the same problem."""
    x = _randn(shape, 1500, F32, scale, device=device)
    a = torch.full((shape[0], 1), alpha, dtype=F32, device=device)
    reference = entmax(x.double(), a.double())
    with _eager_solvers():
        float64_oracle = entmax(x.double(), a.double())
    assert _max_err(reference, float64_oracle) <= 1e-12
    assert _max_err(entmax(x, a).double(), reference) <= 1e-6


def test_support_size_non_increasing_in_alpha(device):
    for scale in (0.5, 1.0, 3.0):
        x = _randn((8, 30), 1300, F64, scale, device=device)
        sizes = [torch.full((8,), 30, device=device)]
        for a in torch.linspace(1.05, 3.0, 40).tolist():
            sizes.append((entmax(x, a) > 0).sum(-1))
        sizes = torch.stack(sizes)
        assert bool((sizes.diff(dim=0) <= 0).all()), sizes.t()
        assert bool((sizes[-1] < sizes[1]).any())  # α actually changes the support


# --------------------------------------------------------------------------- 3. gradients


def _gradcheck(fn, inputs):
    return torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("alpha", GRAD_ALPHAS)
def test_gradcheck_x_scalar_alpha(alpha, device):
    x = _separated((3, 7), alpha, seed=10, device=device).requires_grad_()
    assert _gradcheck(lambda t: entmax(t, alpha), (x,))
    xm = _separated((2, 3, 6), alpha, dim=1, seed=20, device=device).requires_grad_()
    assert _gradcheck(lambda t: entmax(t, alpha, dim=1), (xm,))


@pytest.mark.parametrize("alpha", GRAD_ALPHAS)
def test_gradcheck_x_and_alpha_per_row(alpha, device):
    a = torch.tensor([[alpha], [alpha + 0.02], [alpha + 0.05]], dtype=F64, device=device)
    x = _separated((3, 6), a, seed=30, device=device).requires_grad_()
    assert _gradcheck(lambda t, b: entmax(t, b), (x, a.clone().requires_grad_()))


# (x shape, dim, α shape): per row along dim 0 / 1 / -1 of 3-d and 4-d tensors, per head.
ALPHA_LAYOUTS = (
    ((3, 2, 5), 0, (1, 2, 5)),
    ((2, 5, 3), 1, (2, 1, 3)),
    ((2, 3, 5), -1, (2, 3, 1)),
    ((4, 2, 2, 3), 0, (1, 2, 2, 3)),
    ((2, 4, 2, 3), 1, (2, 1, 2, 3)),
    ((2, 2, 2, 5), -1, (2, 2, 2, 1)),
    ((2, 3, 2, 5), -1, (1, 3, 1, 1)),  # per head, [B, H, T, S]
    ((2, 3, 2, 5), -1, (3, 1, 1)),  # per head, leading dims omitted
)


@pytest.mark.parametrize("alphas", [GRAD_ALPHAS[:3], GRAD_ALPHAS[3:]], ids=["low", "high"])
@pytest.mark.parametrize("layout", range(len(ALPHA_LAYOUTS)))
def test_gradcheck_alpha_layouts(layout, alphas, device):
    """Each α tensor cycles through three of GRAD_ALPHAS (slightly offset so entries differ)."""
    shape, dim, a_shape = ALPHA_LAYOUTS[layout]
    n = math.prod(a_shape)
    idx = torch.arange(n)
    a = torch.tensor(alphas, dtype=F64)[idx % 3] + 0.01 * (idx // 3).to(F64)
    a = a.reshape(a_shape).to(device)
    x = _separated(shape, a, dim, seed=40, device=device).requires_grad_()
    assert _gradcheck(lambda t, b: entmax(t, b, dim=dim), (x, a.clone().requires_grad_()))


def test_gradcheck_other_functions(device):
    x = _separated((3, 7), 2.0, seed=50, device=device).requires_grad_()
    assert _gradcheck(lambda t: sparsemax(t), (x,))
    x = _separated((3, 7), 1.5, seed=51, device=device).requires_grad_()
    assert _gradcheck(lambda t: entmax15(t), (x,))
    xd = _separated((4, 3, 2), 1.5, dim=0, seed=52, device=device).requires_grad_()
    assert _gradcheck(lambda t: entmax15(t, dim=0), (xd,))
    xd = _separated((4, 3, 2), 2.0, dim=0, seed=53, device=device).requires_grad_()
    assert _gradcheck(lambda t: sparsemax(t, dim=0), (xd,))
    x = _separated((3, 7), None, seed=54, device=device).requires_grad_()
    assert _gradcheck(lambda t: softmax(t), (x,))
    for k in (1, 3, 7):
        assert _gradcheck(lambda t, k=k: topk_softmax(t, k), (x,))
    mask = _rand_mask(x.shape, 55, device=device)
    mask[0] = False  # fully masked row: zero gradient
    for fn in (
        lambda t: softmax(t, mask=mask),
        lambda t: sparsemax(t, mask=mask),
        lambda t: entmax15(t, mask=mask),
        lambda t: topk_softmax(t, 2, mask=mask),
        lambda t: entmax(t, 1.3, mask=mask),
    ):
        assert _gradcheck(fn, (x,))


@pytest.mark.parametrize("layout", ["row", "head", "dim0"])
def test_gradients_match_oracle(layout, device):
    if layout == "row":
        x = _randn((4, 3, 9), 1400, F64, 2.0, device=device)
        g = torch.Generator().manual_seed(1401)
        alpha = (1.1 + 1.5 * torch.rand(4, 3, 1, generator=g, dtype=F64)).to(device)
        dim, full = -1, (4, 3, 1)
    elif layout == "head":
        x = _randn((2, 4, 3, 9), 1410, F64, 2.0, device=device)
        alpha = torch.tensor([1.1, 1.5, 2.0, 2.6], dtype=F64, device=device).view(1, 4, 1, 1)
        dim, full = -1, (2, 4, 3, 1)
    else:
        x = _randn((9, 4, 3), 1420, F64, 2.0, device=device)
        alpha = torch.tensor([1.2, 1.75, 2.4], dtype=F64, device=device).view(1, 1, 3)
        dim, full = 0, (1, 4, 3)
    gout = _randn(x.shape, 1430, F64, device=device)
    x1, a1 = x.clone().requires_grad_(), alpha.clone().requires_grad_()
    (entmax(x1, a1, dim=dim) * gout).sum().backward()
    x2, a2 = x.clone().requires_grad_(), alpha.clone().requires_grad_()
    ref = ref_entmax_bisect(x2, a2.expand(full), dim=dim, n_iter=100)
    (ref * gout).sum().backward()
    assert a1.grad.shape == alpha.shape
    assert _max_err(a1.grad, a2.grad) <= 1e-8
    assert _max_err(x1.grad, x2.grad) <= 1e-10
    # x-gradients of the exact functions against the package's.
    for fn, rf in ((sparsemax, ref_sparsemax), (entmax15, ref_entmax15)):
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        (fn(x1, dim=dim) * gout).sum().backward()
        (rf(x2, dim=dim) * gout).sum().backward()
        assert _max_err(x1.grad, x2.grad) <= 1e-10


def test_alpha_gradient_near_and_at_one(device):
    x = _randn((4, 8), 1500, F64, 2.0, device=device)
    gout = _randn(x.shape, 1501, F64, device=device)
    # Near α = 1 against the oracle (fp64 keeps its 1/(α−1)² cancellation harmless here).
    for a0 in (1.001, 1.01):
        a1 = torch.full((4, 1), a0, dtype=F64, device=device, requires_grad=True)
        (entmax(x, a1) * gout).sum().backward()
        a2 = torch.full((4, 1), a0, dtype=F64, device=device, requires_grad=True)
        (ref_entmax_bisect(x, a2, n_iter=100) * gout).sum().backward()
        assert _max_err(a1.grad, a2.grad) <= 1e-7, a0
    # At α = 1 exactly: the limit (−p log²p + p Σ p log²p)/2 with p = softmax (thesis ch.4).
    a = torch.ones(4, 1, dtype=F64, device=device, requires_grad=True)
    xg = x.clone().requires_grad_()
    p = entmax(xg, a)
    (p * gout).sum().backward()
    sm = torch.softmax(x, -1)
    _, expected = _alpha_derivative_at_one(sm, gout)
    assert bool(torch.isfinite(a.grad).all())
    assert _max_err(a.grad, expected) <= 1e-9
    # x-gradient at α = 1 is the softmax Jacobian.
    assert _max_err(xg.grad, sm * (gout - (sm * gout).sum(-1, keepdim=True))) <= 1e-12


# --------------------------------------------------------------------------- 4. hard cases


@pytest.mark.parametrize("dtype", [F32, F64, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_fully_masked_rows(name, dtype, device):
    x = _randn((3, 4, 6), 1600, dtype, 2.0, device=device).requires_grad_()
    mask = _rand_mask(x.shape, 1601, device=device)
    mask[..., 0] = True
    mask[0, 1] = False
    mask[2] = False
    p = _run(name, x, -1, mask)
    assert p.dtype == dtype
    assert bool(torch.isfinite(p).all())
    assert bool((p[~mask] == 0).all())
    assert bool((p[0, 1] == 0).all()) and bool((p[2] == 0).all())
    live = mask.any(-1)
    assert _max_err(p.float().sum(-1)[live], torch.ones(int(live.sum()), device=device)) <= 1e-2
    p.backward(_randn(x.shape, 1602, dtype, device=device))
    assert bool(torch.isfinite(x.grad).all())
    assert bool((x.grad[~mask] == 0).all())
    # Everything masked.
    xa = x.detach().clone().requires_grad_()
    pa = _run(name, xa, -1, torch.zeros(x.shape, dtype=torch.bool, device=device))
    assert bool((pa == 0).all())
    pa.sum().backward()
    assert bool((xa.grad == 0).all())


def test_fully_masked_rows_alpha_gradient(device):
    x = _randn((4, 6), 1650, F64, 2.0, device=device).requires_grad_()
    a = torch.tensor([[1.3], [1.6], [2.2], [1.0]], dtype=F64, device=device, requires_grad=True)
    mask = torch.ones(4, 6, dtype=torch.bool, device=device)
    mask[1] = False
    p = entmax(x, a, mask=mask)
    p.backward(_randn(x.shape, 1651, F64, device=device))
    assert bool(torch.isfinite(a.grad).all()) and bool(torch.isfinite(x.grad).all())
    assert a.grad[1].item() == 0.0
    assert bool((x.grad[1] == 0).all())
    ah = torch.tensor([1.3, 1.8], dtype=F64, device=device).view(1, 2, 1, 1).requires_grad_()
    xh = _randn((1, 2, 3, 5), 1652, F64, device=device).requires_grad_()
    (entmax(xh, ah, mask=torch.zeros(5, dtype=torch.bool, device=device)) * 2).sum().backward()
    assert bool((ah.grad == 0).all()) and bool((xh.grad == 0).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", NAMES)
def test_half_precision_very_negative_logits(name, dtype, device):
    eps = torch.finfo(dtype).eps
    x = (-1000.0 + 3.0 * _randn((5, 16), 1700, F64, device=device)).to(dtype)
    x[0] = -1000.0  # an all-equal row → uniform
    x[1, 3] = -990.0
    mask = torch.ones(5, 16, dtype=torch.bool, device=device)
    mask[4, ::2] = False
    for m in (None, mask):
        p = _run(name, x, -1, m)
        assert p.dtype == dtype
        assert bool(torch.isfinite(p).all())
        assert _max_err(p.float().sum(-1), torch.ones(5, device=device)) <= 4 * eps
        assert _max_err(p, _expected(name, x, -1, m)) <= 2 * eps
        # Computed in fp32 and cast back.
        assert _max_err(p, _run(name, x.float(), -1, m).to(dtype)) <= eps
        assert _max_err(p[0], torch.full((16,), 1 / 16, device=device)) <= eps
    xg = x.clone().requires_grad_()
    _run(name, xg, -1, mask).backward(torch.ones_like(x))
    assert xg.grad.dtype == dtype and bool(torch.isfinite(xg.grad).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_matches_oracle(dtype, device):
    x = _randn((3, 4, 24), 1750, dtype, 3.0, device=device)
    eps = torch.finfo(dtype).eps
    a = torch.tensor([1.2, 1.5, 2.0, 2.8], device=device).view(1, 4, 1)
    for p, alpha in (
        (sparsemax(x), 2.0),
        (entmax15(x), 1.5),
        (entmax(x, 1.75), 1.75),
        (entmax(x, a), a),
        (softmax(x), 1.0),
    ):
        assert p.dtype == dtype
        assert _max_err(p, oracle(x, alpha)) <= 2 * eps
        assert _max_err(p.float().sum(-1), torch.ones(3, 4, device=device)) <= 4 * eps


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_with_fp32_alpha_parameter(dtype, device):
    """Mixed precision attention: half scores, fp32 per-head α parameter, gradients to both."""
    x = _randn((2, 3, 4, 10), 1760, F32, 2.0, device=device)
    a32 = torch.tensor([1.2, 1.6, 2.4], device=device).view(1, 3, 1, 1)
    gout = _randn(x.shape, 1761, F32, device=device)
    xh = x.to(dtype).requires_grad_()
    ah = a32.clone().requires_grad_()
    p = entmax(xh, ah)
    assert p.dtype == dtype
    (p.float() * gout).sum().backward()
    assert ah.grad.dtype == F32 and xh.grad.dtype == dtype
    assert bool(torch.isfinite(ah.grad).all()) and bool(torch.isfinite(xh.grad).all())
    # Same as the fp32 computation on the rounded scores, up to the output rounding.
    xf = xh.detach().float().requires_grad_()
    af = a32.clone().requires_grad_()
    (entmax(xf, af) * gout).sum().backward()
    eps = torch.finfo(dtype).eps
    assert _max_err(p, entmax(xf, af).detach()) <= eps
    assert _max_err(ah.grad, af.grad) <= 4 * eps * (1 + af.grad.abs().max().item())
    assert _max_err(xh.grad, xf.grad) <= 4 * eps * (1 + xf.grad.abs().max().item())


@pytest.mark.parametrize("dtype", [F32, F64])
def test_large_logits_alpha_three(dtype, device):
    g = torch.Generator().manual_seed(1800)
    x = 1000.0 * torch.randn(6, 40, generator=g, dtype=F64)
    # Put a few entries just below each row maximum so the support is not a single entry.
    top = x.max(-1, keepdim=True).values
    x[:, :5] = top - 0.4 * torch.rand(6, 5, generator=g, dtype=F64)
    x = x.to(device, dtype)
    ref = ref_entmax_bisect(x.to(F64), 3.0, n_iter=200)
    assert bool(((ref > 0).sum(-1) > 1).all())
    for alpha in (3.0, torch.full((6, 1), 3.0, dtype=dtype, device=device)):
        p = entmax(x, alpha)
        assert bool(torch.isfinite(p).all())
        assert _max_err(p.sum(-1), torch.ones(6, device=device)) <= 10 * torch.finfo(dtype).eps
        _assert_entmax_close(p, ref, 3.0, x)
    for fn, a in ((sparsemax, 2.0), (entmax15, 1.5)):
        assert _max_err(fn(x), oracle(x, a)) <= TOL[dtype]


@pytest.mark.parametrize("name", NAMES)
def test_exact_ties(name, device):
    for c in (-3.0, 0.0, 1000.0):
        x = torch.full((3, 7), c, device=device)
        assert _max_err(_run(name, x), torch.full((3, 7), 1 / 7, device=device)) <= 1e-7
        mask = torch.tensor([True, False, True, True, False, False, True], device=device)
        expected = torch.where(mask, 0.25, 0.0).expand(3, 7)
        assert _max_err(_run(name, x, -1, mask), expected) <= 1e-7
    # Tied maxima and ties in the middle of the row.
    x = torch.tensor(
        [
            [4.0, 4.0, 0.0, -1.0, 0.5],
            [1.0, 0.2, 0.2, 0.2, -3.0],
            [0.3, 0.3, 0.3, 0.3, 0.1],
            [2.0, -1.0, 2.0, -1.0, 2.0],
        ],
        dtype=F64,
        device=device,
    )
    assert _max_err(_run(name, x), _expected(name, x)) <= 1e-10


def test_ties_at_the_threshold(device):
    # Entries exactly at the threshold (gap 0) get p = 0 and do not disturb the rest.
    for dtype in (F32, F64):
        x = torch.tensor(
            [[1.0, 0.0, 0.0, 0.0], [0.0, -1.0, -1.0, -5.0]], dtype=dtype, device=device
        )
        one_hot = torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0]], device=device)
        assert _max_err(sparsemax(x), one_hot) <= 1e-7
        assert _max_err(entmax15(2 * x), one_hot) <= 1e-7
        assert _max_err(entmax(x / 1.5, 2.5), one_hot) <= 1e-6
        a = torch.full((2, 1), 1.5, dtype=dtype, device=device)
        assert _max_err(entmax(2 * x, a), one_hot) <= 1e-6


@pytest.mark.parametrize("name", NAMES)
def test_single_entry_rows(name, device):
    for shape, dim in (((3, 1), -1), ((2, 1, 4), 1), ((1,), 0), ((1, 1, 1, 1), -2)):
        x = _randn(shape, 1900, F64, device=device).requires_grad_()
        p = _run(name, x, dim)
        assert p.shape == x.shape
        assert bool((p == 1).all())
        p.backward(_randn(shape, 1901, F64, device=device))
        assert bool((x.grad == 0).all())
    t = entmax(
        torch.zeros(2, 1, dtype=F64, device=device),
        torch.tensor([[1.2], [2.5]], dtype=F64, device=device),
    )
    assert bool((t == 1).all())


@pytest.mark.parametrize("scale", [0.01, 1.0])
@pytest.mark.parametrize("name", NAMES)
def test_very_long_rows(name, scale, device):
    x = _randn((2, 65536), 2000, F32, scale, device=device)
    p = _run(name, x)
    assert bool(torch.isfinite(p).all())
    assert _max_err(p, _expected(name, x)) <= 1e-5
    assert _max_err(p.sum(-1), torch.ones(2, device=device)) <= 1e-5


def test_very_long_rows_support(device):
    x = _randn((2, 65536), 2010, F32, 0.01, device=device)
    for fn, a in ((sparsemax, 2.0), (entmax15, 1.5)):
        _assert_support_agrees(fn(x), x, a)
    _assert_support_agrees(entmax(x, 1.25), x, 1.25)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax_1.25", "entmax_2.5"])
def test_structured_rows(name, device):
    """Rows that make iterative threshold solvers work hard (or fall back to sorting)."""
    d = 512
    lin = torch.linspace(0.0, -1.0, d, dtype=F64)
    rows = [
        lin,
        10 * lin,
        0.01 * lin,
        -torch.logspace(-6, 1, d, dtype=F64),  # geometric spacing
        torch.cat([torch.zeros(d // 2, dtype=F64), torch.full((d // 2,), -1e-3, dtype=F64)]),
        torch.cat([torch.zeros(1, dtype=F64), torch.full((d - 1,), -1e-9, dtype=F64)]),
        (torch.arange(d, dtype=F64) % 7) * -0.1,  # many exact duplicates
        -((torch.arange(d, dtype=F64) / d) ** 0.1),
    ]
    x = torch.stack(rows).to(device)
    for dtype in (F32, F64):
        xd = x.to(dtype)
        assert _max_err(_run(name, xd), _expected(name, xd)) <= TOL[dtype], dtype


@eager_solvers
@pytest.mark.parametrize("cap", [2, 3])
def test_sort_fallback_of_exact_functions(monkeypatch, cap, device):
    """The sort-based fallback of sparsemax / entmax15, forced by capping the Newton iterations.

    Natural inputs (even adversarial-looking ones, d up to 65536) converge in < 15 Newton steps,
    so the fallback is only reachable by lowering the module's private iteration cap; a cap of
    2-3 leaves some rows solved by Newton and sends the others to the fallback in the same batch.
    """
    # raising=True (the default): a renamed cap fails here instead of testing nothing
    monkeypatch.setattr(normalizers_module, "_EXACT_MAX_ITER", cap)
    x = _randn((6, 4, 40), 2050, F64, 1.0, device=device)
    x[0, 0] = 0.0  # one trivially easy row (uniform)
    x[1] *= 0.01  # dense supports
    x[2] *= 100.0  # one-hot supports
    mask = _rand_mask(x.shape, 2051, 0.7, device=device)
    mask[3, 1] = False
    gout = _randn(x.shape, 2052, F64, device=device)
    for fn, a, rf in ((sparsemax, 2.0, ref_sparsemax), (entmax15, 1.5, ref_entmax15)):
        for dtype in (F32, F64):
            xd = x.to(dtype)
            p = fn(xd)
            ref = oracle(xd, a)
            assert _max_err(p, ref) <= TOL[dtype]
            _assert_support_agrees(p, xd, a, -1, ref)
            assert _max_err(fn(xd, mask=mask), masked_oracle(xd, a, -1, mask)) <= TOL[dtype]
            assert _max_err(entmax(xd, a), ref) <= TOL[dtype]
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        (fn(x1) * gout).sum().backward()
        (rf(x2, dim=-1) * gout).sum().backward()
        assert _max_err(x1.grad, x2.grad) <= 1e-10


@pytest.mark.parametrize("name", NAMES)
def test_singleton_dims(name, device):
    for shape, dim in (
        ((1, 1, 5), -1),
        ((1, 5, 1), 1),
        ((5, 1, 1), 0),
        ((2, 1, 3, 4), -1),
        ((1, 1, 1, 6), -1),
    ):
        x = _randn(shape, 2100, F64, 2.0, device=device)
        p = _run(name, x, dim)
        assert p.shape == x.shape
        assert _max_err(p, _expected(name, x, dim)) <= 1e-10, shape
    x = _randn((2, 1, 3, 4), 2101, F64, 2.0, device=device)
    p = entmax(x, torch.tensor(1.7, dtype=F64, device=device).view(1, 1, 1, 1))
    assert _max_err(p, oracle(x, 1.7)) <= 1e-10


@pytest.mark.parametrize("name", NAMES)
def test_non_contiguous_inputs(name, device):
    base = _randn((6, 8, 5), 2200, F64, 2.0, device=device)
    views = (
        base.transpose(0, 2),
        base[:, ::2, 1:],
        base.permute(2, 0, 1)[..., ::3],
    )
    for v in views:
        assert not v.is_contiguous()
        for dim in (-1, 0):
            vc = v.contiguous()
            assert _max_err(_run(name, v, dim), _run(name, vc, dim)) <= 1e-12
        m = _rand_mask(v.shape[::-1], 2201, device=device).permute(2, 1, 0)
        assert not m.is_contiguous()
        assert _max_err(_run(name, v, -1, m), _run(name, v.contiguous(), -1, m.contiguous())) <= (
            1e-12
        )
        assert _max_err(_run(name, v, -1, m), _expected(name, v, -1, m)) <= 1e-10
    # Gradients through a non-contiguous view equal those through its contiguous copy.
    v = base.transpose(0, 2)
    g = _randn(v.shape, 2202, F64, device=device)
    v1 = v.clone().requires_grad_()
    v2 = v.contiguous().requires_grad_()
    assert not v1.is_contiguous()
    (_run(name, v1) * g).sum().backward()
    (_run(name, v2) * g).sum().backward()
    assert _max_err(v1.grad, v2.grad) <= 1e-12


def test_non_contiguous_alpha_and_mask(device):
    x = _randn((2, 3, 4, 7), 2250, F64, 2.0, device=device)
    a = (
        torch.tensor([1.2, 1.6, 2.3], dtype=F64, device=device).view(1, 3, 1, 1).expand(2, 3, 4, 1)
    )  # stride 0
    m = _rand_mask((7, 4, 3, 2), 2251, device=device).permute(3, 2, 1, 0)
    ref = masked_oracle(x, a, -1, m)
    assert _max_err(entmax(x, a, mask=m), ref) <= 1e-10
    a_t = (
        torch.tensor([1.2, 1.6, 2.3, 1.9], dtype=F64, device=device).view(4, 1).expand(4, 3).t()
    )  # [3, 4]
    p = entmax(x, a_t.unsqueeze(-1), mask=m)
    assert _max_err(p, masked_oracle(x, a_t.unsqueeze(-1).expand(2, 3, 4, 1), -1, m)) <= 1e-10


@pytest.mark.parametrize("dim", [0, 1, -1, -2])
@pytest.mark.parametrize("ndim", [3, 4])
@pytest.mark.parametrize("name", NAMES)
def test_any_dim(name, ndim, dim, device):
    shape = (4, 5, 6) if ndim == 3 else (2, 3, 4, 5)
    x = _randn(shape, 2300 + ndim, F64, 2.0, device=device)
    p = _run(name, x, dim)
    assert p.shape == x.shape
    assert _max_err(p, _expected(name, x, dim)) <= 1e-10
    moved = _run(name, x.movedim(dim, -1).contiguous(), -1).movedim(-1, dim)
    assert _max_err(p, moved) <= 1e-12
    assert (
        _max_err(p.sum(dim), torch.ones(_shape_dim1(shape, dim), device=device).squeeze(dim))
        <= 1e-12
    )


# --------------------------------------------------------------------------- 5. top-k softmax


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("k", [1, 2, 5, 12, 20])
def test_topk_softmax_matches_reference(k, masked, device):
    x = _randn((6, 3, 12), 2400, F64, 2.0, device=device)
    mask = _rand_mask(x.shape, 2401, device=device) if masked else None
    p = topk_softmax(x, k, mask=mask)
    ref = topk_reference(x, k, -1, mask)
    assert _max_err(p, ref) <= 1e-12
    # Independently: the support is the top-min(k, available) set of each row (no ties here).
    m = torch.ones_like(x, dtype=torch.bool) if mask is None else mask
    n = (p > 0).sum(-1)
    assert bool((n == m.sum(-1).clamp(max=k)).all())
    top = torch.topk(x.masked_fill(~m, -math.inf), min(k, 12), dim=-1)
    for r in range(6):
        for h in range(3):
            idx = top.indices[r, h][top.values[r, h] > -math.inf]
            e = torch.exp(x[r, h, idx] - x[r, h, idx].max())
            assert _max_err(p[r, h, idx], e / e.sum()) <= 1e-12
    for dtype in (F32, torch.bfloat16):
        xd = x.to(dtype)
        assert _max_err(topk_softmax(xd, k, mask=mask), topk_reference(xd, k, -1, mask)) <= (
            1e-6 if dtype == F32 else 1e-2
        )


def test_topk_softmax_keeps_ties_at_threshold(device):
    x = torch.tensor(
        [[3.0, 2.0, 2.0, 2.0, 1.0, 0.0], [2.0, 2.0, 1.0, 1.0, 0.0, 5.0]], dtype=F64, device=device
    )
    p = topk_softmax(x, 2)
    e = torch.exp(torch.tensor([3.0, 2.0, 2.0, 2.0], dtype=F64, device=device))
    assert _max_err(p[0, :4], e / e.sum()) <= 1e-12 and bool((p[0, 4:] == 0).all())
    e = torch.exp(torch.tensor([2.0, 2.0, 5.0], dtype=F64, device=device))
    assert _max_err(p[1, [0, 1, 5]], e / e.sum()) <= 1e-12
    assert bool((p[1, 2:5] == 0).all())
    q = topk_softmax(torch.tensor([2.0, 2.0, 1.0], device=device), 1)
    assert _max_err(q, torch.tensor([0.5, 0.5, 0.0], device=device)) <= 1e-7


def test_topk_softmax_with_k_larger_than_available(device):
    x = _randn((5, 10), 2500, F64, 2.0, device=device)
    mask = _rand_mask(x.shape, 2501, 0.3, device=device)
    mask[0] = False
    mask[1, :] = False
    mask[1, 7] = True
    for k in (4, 10, 11, 100):
        p = topk_softmax(x, k, mask=mask)
        rows = mask.sum(-1) <= k
        assert _max_err(p[rows], softmax(x, mask=mask)[rows]) <= 1e-12
        assert _max_err(p, topk_reference(x, k, -1, mask)) <= 1e-12
    assert _max_err(topk_softmax(x, 10), torch.softmax(x, -1)) <= 1e-12
    assert _max_err(topk_softmax(x, 50), torch.softmax(x, -1)) <= 1e-12


def test_topk_softmax_causal_mask(device):
    T = 7
    x = _randn((2, 3, T, T), 2600, F64, 2.0, device=device)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    k = 3
    p = topk_softmax(x, k, mask=causal)
    assert _max_err(p, topk_reference(x, k, -1, causal)) <= 1e-12
    sm = softmax(x, mask=causal)
    assert _max_err(p[..., :k, :], sm[..., :k, :]) <= 1e-12  # rows with ≤ k keys
    assert bool(((p > 0).sum(-1)[..., k:] == k).all())
    assert bool((p[..., ~causal] == 0).all())
    # Same along dim=-2 (keys on the second-to-last axis).
    pt = topk_softmax(x.transpose(-1, -2), k, dim=-2, mask=causal.t())
    assert _max_err(pt.transpose(-1, -2), p) <= 1e-12


# --------------------------------------------------------------------------- 6. validation


def test_invalid_arguments_raise_value_error(device):
    x = torch.randn(2, 5, device=device)
    with pytest.raises(ValueError, match="alpha"):
        entmax(x, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        entmax(x, 0.999)
    with pytest.raises(ValueError, match="alpha"):
        entmax(x, torch.tensor([[1.5], [0.9]], device=device))
    with pytest.raises(ValueError, match="alpha"):
        entmax(x, torch.full((2, 5), 1.5, device=device))  # dim not of size 1
    with pytest.raises(ValueError, match="alpha"):
        entmax(x, torch.full((5,), 1.5, device=device))  # broadcasts, but along dim
    with pytest.raises(ValueError, match="alpha"):
        entmax(x, torch.full((2, 1), 1.5, device=device), dim=0)  # size 2 along dim=0
    with pytest.raises(ValueError, match="alpha"):
        entmax(x, torch.full((3, 1), 1.5, device=device))  # not broadcastable
    with pytest.raises(ValueError, match="alpha"):
        entmax_threshold(x, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        entmax_threshold(x, torch.full((2, 5), 1.5, device=device))
    for k in (0, -1):
        with pytest.raises(ValueError, match=r"\bk\b"):
            topk_softmax(x, k)
    bad_masks = (
        torch.ones(2, 5, device=device),  # float
        torch.ones(2, 5, dtype=torch.int64, device=device),
        torch.ones(3, dtype=torch.bool, device=device),  # not broadcastable
        torch.ones(4, 5, dtype=torch.bool, device=device),
    )
    for m in bad_masks:
        for call in (
            lambda m=m: softmax(x, mask=m),
            lambda m=m: sparsemax(x, mask=m),
            lambda m=m: entmax15(x, mask=m),
            lambda m=m: entmax(x, 1.3, mask=m),
            lambda m=m: entmax(x, torch.full((2, 1), 1.3, device=device), mask=m),
            lambda m=m: topk_softmax(x, 2, mask=m),
            lambda m=m: entmax_threshold(x, 1.3, mask=m),
        ):
            with pytest.raises(ValueError, match="mask"):
                call()


# --------------------------------------------------------------------------- 7. candidate packing
# Rows of length ≥ 128 whose candidates (x_i > max − 1/(α−1)) fill at most half of every row are
# solved, returned and differentiated on the packed candidates only.


def _packed_case(dtype, *, device):
    x = _randn((2, 3, 5, 300), 2000, dtype, 4.0, device=device)
    mask = _rand_mask(x.shape, 2001, keep=0.8, device=device)
    mask[0, 1, 2] = False  # a fully masked row
    return x, mask


@eager_solvers
@pytest.mark.parametrize("alpha", [1.5, 2.0, "heads"])
def test_candidate_packing_is_used_for_long_sparse_rows(alpha, device):
    x, mask = _packed_case(F32, device=device)
    a = torch.tensor([1.3, 1.5, 1.9], device=device).view(1, 3, 1, 1) if alpha == "heads" else alpha
    xm = x.masked_fill(~mask, -math.inf)
    row_max = xm.amax(-1, keepdim=True).clamp(min=-1e30)
    candidates = normalizers_module._Candidates(
        xm, row_max - 1 / (torch.as_tensor(a, device=device) - 1)
    )
    assert candidates.full_index is not None
    assert candidates.values.shape[-1] * 2 <= x.shape[-1]


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "heads"])
def test_packed_path_matches_oracle_with_gradients(name, dtype, device):
    x, mask = _packed_case(dtype, device=device)
    gout = _randn(x.shape, 2002, dtype, device=device)
    alpha = torch.tensor([1.3, 1.5, 1.9], dtype=dtype, device=device).view(1, 3, 1, 1)
    functions = {
        "sparsemax": (lambda v, a: sparsemax(v, mask=mask), 2.0),
        "entmax15": (lambda v, a: entmax15(v, mask=mask), 1.5),
        "heads": (lambda v, a: entmax(v, a, mask=mask), alpha),
    }
    fn, spec = functions[name]
    xg, ag = x.clone().requires_grad_(), alpha.clone().requires_grad_()
    p = fn(xg, ag)
    (p * gout).sum().backward()

    x64 = x.to(F64).masked_fill(~mask, -1e4)  # the oracle has no mask; −1e4 is far out of support
    x64.requires_grad_()
    a64 = alpha.to(F64).expand(2, 3, 5, 1).clone().requires_grad_()
    references = {  # the package's own autograd gives the reference gradients
        "sparsemax": lambda: ref_sparsemax(x64),
        "entmax15": lambda: ref_entmax15(x64),
        "heads": lambda: ref_entmax_bisect(x64, a64, n_iter=100),
    }
    ref = references[name]().masked_fill(~mask, 0.0)
    (ref * gout.to(F64)).sum().backward()

    assert bool((p[0, 1, 2] == 0).all()) and bool((xg.grad[0, 1, 2] == 0).all())
    _assert_entmax_close(p, ref, spec if name != "heads" else 1.9, x)
    grad_tol = 1e-4 if dtype == F32 else 1e-9
    assert _max_err(xg.grad.masked_fill(~mask, 0.0), x64.grad.masked_fill(~mask, 0.0)) <= grad_tol
    if name == "heads":
        expected = a64.grad.sum(dim=(0, 2), keepdim=True)
        assert _max_err(ag.grad, expected) <= (1e-3 if dtype == F32 else 1e-8)


# --------------------------------------------------------------------------- 8. NaN scores
# A row with a NaN score in an unmasked position is NaN everywhere, forward and backward (as with
# torch.softmax); other rows are exactly what they are without it; a masked NaN is just masked.


def _nan_case(dtype, *, device):
    """x [4, 3, 9] with NaN in three unmasked positions, all in column 1 of dim 1 (a "head"), and
    in one masked position; the mask; the flags of the NaN rows [4, 3, 1]; x with NaN set to 0."""
    x = _randn((4, 3, 9), 2100, dtype, 2.0, device=device)
    mask = _rand_mask(x.shape, 2101, keep=0.7, device=device)
    mask[..., 0] = True
    nan_rows = torch.zeros(4, 3, 1, dtype=torch.bool, device=device)
    for i, k in ((0, 4), (2, 0), (3, 8)):
        x[i, 1, k] = math.nan
        mask[i, 1, k] = True
        nan_rows[i, 1] = True
    mask[1, 0, 3] = False
    x[1, 0, 3] = math.nan  # masked: must not poison row (1, 0)
    return x, mask, nan_rows, torch.nan_to_num(x, nan=0.0)


def _named_case(name):
    return lambda x, a, mask: _run(name, x, -1, mask)


# name -> (f(x, α, mask), α of shape broadcastable to [4, 3, 1] or None, oracle spec of CASES)
NAN_CASES = {
    **{name: (_named_case(name), None, name) for name in NAMES},
    "entmax_heads": (
        lambda x, a, mask: entmax(x, a, mask=mask),
        torch.tensor([1.3, 1.8, 2.6]).view(3, 1),
        None,
    ),
    "entmax_rows_grad": (
        lambda x, a, mask: entmax(x, a, mask=mask),
        torch.tensor(ROW_ALPHAS)[torch.arange(12) % len(ROW_ALPHAS)].view(4, 3, 1),
        None,
    ),
    "entmax_alpha_one_tensor": (
        lambda x, a, mask: entmax(x, a, mask=mask),
        torch.ones(3, 1),
        None,
    ),
}


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", tuple(NAN_CASES))
def test_nan_rows_give_nan_and_leave_other_rows_alone(name, dtype, device):
    x, mask, nan_rows, clean = _nan_case(dtype, device=device)
    gout = _randn(x.shape, 2102, dtype, device=device)
    fn, alpha, spec = NAN_CASES[name]
    alpha = None if alpha is None else alpha.to(device, dtype)
    results = []
    for scores in (x, clean):
        xg = scores.clone().requires_grad_()
        ag = None if alpha is None else alpha.clone().requires_grad_()
        p = fn(xg, ag, mask)
        (p * gout).sum().backward()
        results.append((p.detach(), xg.grad, None if ag is None else ag.grad))
    (p, grad, agrad), (p_clean, grad_clean, agrad_clean) = results
    rows = nan_rows.expand_as(x)
    assert bool(p[rows].isnan().all()), "a row with a NaN score must be NaN"
    assert bool(grad[rows & mask].isnan().all()), "the gradient of a NaN row must be NaN"
    assert bool((grad[~mask] == 0).all()), "masked entries are not inputs: gradient 0"
    assert not bool(p[~rows].isnan().any()) and not bool(grad[~rows].isnan().any())
    # The other rows, row (1, 0) with its masked NaN included, are those of the clean scores.
    assert torch.equal(p[~rows], p_clean[~rows])
    assert torch.equal(grad[~rows], grad_clean[~rows])
    expected = (
        _expected(spec, clean, -1, mask)
        if spec is not None
        else masked_oracle(clean, _expand_alpha(alpha, x, -1), -1, mask)
    )
    assert _max_err(p[~rows], expected[~rows]) <= TOL[dtype]
    if agrad is not None:
        # α's gradient is NaN where it gathers a NaN row: head 1, or the NaN rows themselves.
        poisoned = nan_rows if agrad.shape == nan_rows.shape else nan_rows.any(0)
        assert bool(agrad[poisoned].isnan().all())
        assert torch.equal(agrad[~poisoned], agrad_clean[~poisoned])


@eager_solvers
@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax_1.25", "entmax_2.5"])
def test_nan_rows_keep_the_packed_path_and_stop_at_once(name, monkeypatch, device):
    """Long sparse rows: a NaN row neither disables candidate packing for the batch nor makes
    the solvers iterate (it is solved as an empty row); the other rows are unchanged."""
    x, mask = _packed_case(F32, device=device)
    x[1, 2, 3, 7] = math.nan
    mask[1, 2, 3, 7] = True
    packed = []
    init = normalizers_module._Candidates.__init__

    def spy(self, *args):
        init(self, *args)
        packed.append(self.full_index is not None)

    monkeypatch.setattr(normalizers_module._Candidates, "__init__", spy)
    xg = x.clone().requires_grad_()
    p = _run(name, xg, -1, mask)
    p.backward(torch.ones_like(p))
    assert packed == [True]
    nan_row = torch.zeros(x.shape[:-1], dtype=torch.bool, device=device)
    nan_row[1, 2, 3] = True
    assert bool(p[nan_row].isnan().all())
    assert bool(xg.grad[nan_row[..., None] & mask].isnan().all())
    # The NaN row is solved as an empty row: the rest is exactly as with that row masked out.
    clean, clean_mask = x.nan_to_num(0.0), mask.clone()
    clean_mask[nan_row] = False
    assert torch.equal(p[~nan_row], _run(name, clean, -1, clean_mask)[~nan_row])
    alpha = float(CASES[name][1])
    res = entmax_threshold(x, alpha, mask=mask)
    res_clean = entmax_threshold(clean, alpha, mask=clean_mask)
    assert bool(res.tau[nan_row].isnan().all())
    assert torch.equal(res.tau[~nan_row], res_clean.tau[~nan_row])
    # Iterations as for an empty row (1 or 2), not up to the solver's cap.
    assert torch.equal(res.iterations, res_clean.iterations)
    assert int(res.iterations[nan_row].max()) <= 2


# --------------------------------------------------------------------------- 9. α > 2 in fp32


def _shifted_oracle(x, alpha):
    """float64 α-entmax of x − max: exact in fp64, and entmax is shift invariant. The package
    scales x by α − 1 before subtracting the max, which would cost it ulp(max) in τ."""
    x64 = x.to(F64)
    return ref_entmax_bisect(x64 - x64.amax(-1, keepdim=True), alpha, n_iter=200)


def _near_threshold(alpha, scale, seed, rows=32, d=40, *, device):
    """fp32 scores at ``scale`` with 12 entries per row spread across the support boundary and 4
    placed just above the threshold (base = (α−1)x − τ ≲ 1e-4 after rounding to fp32), where
    p = base^{1/(α−1)} is steepest: an error δ of base costs up to δ^{1/(α−1)} in p there."""
    g = torch.Generator().manual_seed(seed)
    beta = alpha - 1
    x = scale * torch.randn(rows, d, generator=g, dtype=F64)
    top = x.amax(-1, keepdim=True)
    x[:, :12] = top - 1.5 / beta * torch.rand(rows, 12, generator=g, dtype=F64)
    bases = torch.tensor([1e-7, 1e-6, 1e-5, 1e-4], dtype=F64)
    for _ in range(3):  # the placed entries move τ a little: re-place them a few times
        xr = x.to(F32).to(F64)
        p = _shifted_oracle(xr, alpha)
        j = p.argmax(-1, keepdim=True)
        tau = beta * (xr.gather(-1, j) - top) - p.gather(-1, j) ** beta  # of β(x − max)
        x[:, 12:16] = top + (tau + bases) / beta
    return x.to(device, F32)


@pytest.mark.parametrize("scale", [1.0, 10.0, 100.0])
@pytest.mark.parametrize("alpha", [2.5, 3.0, 4.0])
def test_alpha_above_two_in_fp32_matches_the_fp64_oracle(alpha, scale, device):
    x = _near_threshold(alpha, scale, seed=2200 + int(10 * alpha) + int(scale), device=device)
    ref = _shifted_oracle(x, alpha)
    assert bool(((ref > 0).sum(-1) >= 2).all())
    mixed = (
        torch.tensor([alpha, 1.5, 2.0, 1.2], device=device).repeat(8).view(32, 1)
    )  # α ≤ 2 rows beside
    ref_mixed = oracle(x, mixed)
    for a, expected in (
        (alpha, ref),
        (torch.full((32, 1), alpha, device=device), ref),
        (mixed, ref_mixed),
    ):
        p = entmax(x, a)
        assert p.dtype == F32
        assert _max_err(p, expected) <= 1e-5, f"max err {_max_err(p, expected):.3g}"
    xh = x.to(torch.float16)
    eps = torch.finfo(torch.float16).eps
    assert _max_err(entmax(xh, alpha), entmax(xh.float(), alpha)) <= eps
