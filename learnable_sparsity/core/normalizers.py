r"""Sparse normalizing functions: softmax, sparsemax, 1.5-entmax, α-entmax and top-k softmax.

Every function maps scores ``x`` to a probability vector along ``dim``. α-entmax is

    entmax_α(x) = argmax_{p ∈ Δ} ⟨p, x⟩ + H^T_α(p),
    H^T_α(p) = (1 / (α(α−1))) Σ_j (p_j − p_j^α),

whose solution is p_i = [(α−1) x_i − τ]_+^{1/(α−1)} with the threshold τ chosen so that Σp = 1.
α → 1 is softmax, α = 1.5 is ``entmax15`` and α = 2 is ``sparsemax`` (the Euclidean projection of
x onto the simplex). For α > 1 entries below the threshold get exactly zero probability.

Conventions shared by every function here:

* ``mask`` is boolean and broadcastable to ``x``; True means "may receive probability". Masked
  entries, and entries equal to −inf, get exactly 0.
* A row with no unmasked entry returns all zeros, and its gradient is zero (never NaN).
* A row with a NaN or +inf score in an unmasked position returns NaN in every entry, as
  ``torch.softmax`` does, and so does its gradient (and the α-gradient it feeds); other rows are
  unaffected, and a NaN or +inf in a masked position is replaced by the mask like any other
  score. The sparse solvers find such rows from the row max (which NaN propagates to, and which
  is +inf with a +inf score: no extra pass) and solve them as empty rows, so they neither stall
  the batch's iterations nor disable the candidate packing.
* Empty input (no rows, or rows of length 0) returns an empty result of the same shape, on every
  path.
* fp16/bf16 inputs are computed in fp32 and the result is cast back to the input dtype (the
  Triton kernels load and store half precision themselves: no cast kernels). α-entmax with α > 2
  is computed in fp64 (see ``_FLOAT64_ABOVE_ALPHA``) and cast back likewise.
* α is a Python number, a tensor, or anything ``torch.as_tensor`` takes (a list, a NumPy array).
  It is checked (1 ≤ α < ∞, not NaN) with a clear error, except a tensor α on the Triton
  kernels: the check would wait for the device on every call, so an invalid α gives NaN rows
  there instead.
* Under ``torch.autocast`` the autograd Functions run with autocast off (``core.amp``), the scores
  in their dtype and α in float32: autocast would narrow the solvers' row sums to bf16.
* Any ``dim``; non-contiguous inputs are fine.

Root finding. With scaled scores z = (α−1)(x − max x) ≤ 0 the threshold lies in
τ ∈ [−1, −d^{1−α}]. ``sparsemax`` and ``entmax15`` run safeguarded Newton steps from the left end
of that bracket (the map τ ↦ Σ_i [z_i − τ]_+^{1/(α−1)} is convex and decreasing for α ≤ 2, so
these steps never overshoot), and finish with the exact threshold in closed form from the support
found, verified against the KKT conditions; rows that fail verification go to the sort-based
algorithm, which is also kept as the internal oracle. General α uses Newton steps on
(Σ_i p_i)^β − 1 (β = α − 1) inside a bisection bracket with a tolerance-based stop, or a stop
once the bracket has collapsed to adjacent floats (exact in one step for α → 1).

Kernels. sparsemax, ``entmax15`` and ``entmax`` run these solvers, fused, in C++ for CPU tensors
(``fused``) and in Triton for CUDA tensors (``fused_triton``); the eager code below is the
fall-back (no compiler, no Triton, rows longer than the Triton kernels hold) and the oracle the
tests hold both to.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import NamedTuple

import torch
from torch import Tensor

from learnable_sparsity.core import fused, fused_triton
from learnable_sparsity.core.amp import autocast_off_backward, autocast_off_forward

# Below this α − 1 the general solver uses α − 1 = _MIN_BETA: softmax to within ~1e-7.
_MIN_BETA = 1e-7
# Cap on Newton iterations for the exact solvers; rows still unconverged use the sort fallback.
_EXACT_MAX_ITER = 32
# The α-gradient switches to its cancellation-free form below this α − 1 (see _alpha_grad).
_STABLE_ALPHA_GRAD_BELOW = 0.5
# Above this α, entmax is computed in float64 whatever the input dtype. For α > 2 the output
# p = base^{1/(α−1)} has an infinite slope at base = 0, so an error δ of base (a few ulps of 1,
# which τ cannot beat in the working dtype) moves p by up to δ^{1/(α−1)}: 4e-3 at α = 4 in fp32,
# 6e-6 in fp64. For α ≤ 2 the error stays O(δ) and the input dtype is kept.
_FLOAT64_ABOVE_ALPHA = 2.0


class EntmaxThreshold(NamedTuple):
    """Threshold of α-entmax: p_i = [(α−1) x_i − tau]_+^{1/(α−1)}, and root-finder iterations.

    ``tau`` has the shape of ``x`` with ``dim`` of size 1 (``+inf`` for fully masked rows, NaN
    for rows with a NaN score); ``iterations`` counts the solver's passes over each row.
    """

    tau: Tensor
    iterations: Tensor


# --------------------------------------------------------------------------- input handling


def _compute_dtype(x: Tensor) -> torch.dtype:
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _to_last_dim(x: Tensor, dim: int, mask: Tensor | None, native: bool = False) -> Tensor:
    """Move ``dim`` last, replace masked entries by −inf and cast to the compute dtype; with
    ``native``, half precision stays as it is where the Triton kernels take the result."""
    if not -x.ndim <= dim < max(x.ndim, 1):
        raise ValueError(f"dim={dim} is out of range for a tensor with {x.ndim} dimensions")
    compute = _compute_dtype(x)
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension")
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be a boolean tensor, got {type(mask).__name__} "
                f"{getattr(mask, 'dtype', '')}".rstrip()
            )
        try:
            shape = torch.broadcast_shapes(mask.shape, x.shape)
        except RuntimeError:
            shape = None
        if shape != x.shape:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} is not broadcastable to x of shape "
                f"{tuple(x.shape)}"
            )
        x = x.masked_fill(~mask, float("-inf"))
    x = x if dim % x.ndim == x.ndim - 1 else x.movedim(dim, -1)
    if x.dtype == compute or (native and fused_triton.usable(x)):
        return x
    return x.to(compute)


def _from_last_dim(p: Tensor, dim: int, dtype: torch.dtype) -> Tensor:
    # Skipping the no-op movedim and cast saves microseconds per call, which count on small rows.
    p = p if dim % p.ndim == p.ndim - 1 else p.movedim(-1, dim)
    return p if p.dtype == dtype else p.to(dtype)


class _Candidates:
    """The entries of each row above a per-row floor, packed into [..., K] (padded with −inf).

    The threshold of α-entmax is never below −1 on the scaled scores (α−1)(x − max), so an entry
    with x_i ≤ max − 1/(α−1) is outside the support at every step of every solver and gets
    p_i = 0: the solvers, the output and the backward pass only touch the K candidates, and
    ``scatter`` puts results back in place. With short rows, or when candidates are more than
    half of some row, the rows are used as they are.
    """

    def __init__(self, x: Tensor, floor: Tensor) -> None:
        self.shape = x.shape
        self.values = x
        # Flat positions of the candidates in the full [rows, d] and the packed [rows, K] views.
        self.full_index: Tensor | None = None
        self.packed_index: Tensor | None = None
        d = x.shape[-1]
        if d < 128 or x.numel() == 0:
            return
        flat = x.reshape(-1, d)
        floor = floor.expand(*x.shape[:-1], 1).reshape(-1, 1)
        step = max(1, flat.shape[0] // 32)  # a cheap look at a few rows first
        if float((flat[::step] > floor[::step]).to(x.dtype).sum(dim=-1).max()) * 2 > d:
            return
        full_index = (flat > floor).view(-1).nonzero().squeeze(1)
        rows = full_index // d
        counts = torch.bincount(rows, minlength=flat.shape[0])
        self.width = max(int(counts.max()), 1) if rows.numel() else 1
        if self.width * 2 > d:
            return
        slots = torch.arange(rows.numel(), device=x.device) - (counts.cumsum(0) - counts)[rows]
        self.full_index = full_index
        self.packed_index = rows * self.width + slots
        self.values = self.gather(x, fill=float("-inf"))

    def gather(self, full: Tensor, fill: float = 0.0) -> Tensor:
        """[..., d] -> [..., K]: the candidates' entries of ``full``."""
        if self.full_index is None:
            return full
        out = full.new_full((*self.shape[:-1], self.width), fill)
        picked = full.reshape(-1).index_select(0, self.full_index)
        return out.view(-1).index_copy_(0, self.packed_index, picked).view(out.shape)

    def scatter(self, packed: Tensor) -> Tensor:
        """[..., K] -> [..., d]: ``packed`` in place, zeros for the other entries."""
        if self.full_index is None:
            return packed
        picked = packed.reshape(-1).index_select(0, self.packed_index)
        out = packed.new_zeros(self.shape)
        return out.view(-1).index_copy_(0, self.full_index, picked).view(self.shape)


# --------------------------------------------------------------------------- exact solvers


def _sparsemax_threshold_sort(z: Tensor) -> Tensor:
    """Exact sparsemax threshold by sorting: τ = (Σ_{i≤k} z_(i) − 1) / k for the largest valid k."""
    z_sorted = z.sort(dim=-1, descending=True).values
    csum = z_sorted.cumsum(dim=-1) - 1
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    support = (k * z_sorted > csum).sum(dim=-1, keepdim=True).clamp(min=1)
    return csum.gather(-1, support - 1) / support.to(z.dtype)


def _entmax15_threshold_sort(z: Tensor) -> Tensor:
    """Exact 1.5-entmax threshold by sorting (Peters et al. 2019) for p = [z − τ]_+²."""
    z_sorted = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    mean = z_sorted.cumsum(dim=-1) / k
    mean_sq = (z_sorted * z_sorted).cumsum(dim=-1) / k
    delta = (1 - k * (mean_sq - mean * mean)) / k
    tau = mean - delta.clamp(min=0).sqrt()
    # NaN (from −inf entries) compares False, so masked positions never count as support.
    support = (tau <= z_sorted).sum(dim=-1, keepdim=True).clamp(min=1)
    return tau.gather(-1, support - 1)


def _fallback_to_sort(z: Tensor, tau: Tensor, done: Tensor, sort_threshold) -> Tensor:
    """Replace the threshold of the rows not verified as exact by the sort-based one."""
    rows = ~done.squeeze(-1) & (z.amax(dim=-1) > float("-inf"))  # rows with no entry are done
    if not bool(rows.any()):
        return tau
    tau = tau.clone()
    tau[rows] = sort_threshold(z[rows])
    return tau


def _count_positive(gap: Tensor) -> Tensor:
    """Number of positive entries per row of ``gap`` ∈ [0, 1] (float; keeps the row dim).

    ceil is the indicator on [0, 1], and float sums are several times faster than boolean
    reductions on CPU. Gaps z − τ never exceed 1 here because z ≤ 0 and τ ≥ −1.
    """
    return gap.ceil().sum(dim=-1, keepdim=True)


def _sparsemax_threshold(z: Tensor) -> tuple[Tensor, Tensor]:
    """Exact sparsemax threshold of shifted scores z (row max 0) and iterations per row.

    Newton's step on f(τ) = Σ_i [z_i − τ]_+ − 1 from a point left of the root is the closed
    form on the current support S = {z_i > τ}: τ ← (Σ_S z_i − 1) / |S| (Michelot's algorithm).
    It never overshoots; once S stops shrinking, τ is the exact threshold of its own support.
    """
    tau = torch.full_like(z[..., :1], -1.0)
    size = torch.full_like(tau, -1.0)
    iterations = torch.zeros_like(tau, dtype=torch.long)
    for _ in range(_EXACT_MAX_ITER):
        gap = (z - tau).clamp_(min=0)
        new_size = _count_positive(gap)
        done = new_size == size
        if bool(done.all()):
            return tau, iterations
        iterations += ~done
        step = (gap.sum(dim=-1, keepdim=True) - 1) / new_size.clamp(min=1)
        tau = torch.where(done, tau, tau + step)
        size = new_size
    return _fallback_to_sort(z, tau, done, _sparsemax_threshold_sort), iterations


def _entmax15_threshold(z: Tensor) -> tuple[Tensor, Tensor]:
    """Exact threshold for p = [z − τ]_+² (z = (x − max)/2) and iterations per row.

    Newton on the convex decreasing h(τ) = ‖[z − τ]_+‖₂ − 1 from τ = −1 never overshoots.
    Once the support S = {z_i > τ} survives a step unchanged, the candidate τ_S solving
    Σ_S (z_i − τ)² = 1 is tried: it is the exact threshold iff every z_i in S exceeds it (the
    entries outside S are ≤ τ ≤ τ_S already), i.e. iff the support at τ_S is still S.
    """
    tau = torch.full_like(z[..., :1], -1.0)
    size = torch.full_like(tau, -1.0)
    done = torch.zeros_like(tau, dtype=torch.bool)
    iterations = torch.zeros_like(tau, dtype=torch.long)
    for _ in range(_EXACT_MAX_ITER):
        gap = (z - tau).clamp_(min=0)
        new_size = _count_positive(gap)
        s1 = gap.sum(dim=-1, keepdim=True)
        s2 = torch.linalg.vecdot(gap, gap).unsqueeze(-1)
        iterations += ~done
        check = (new_size == size) & ~done
        if bool(check.any()):
            # Smaller root δ of |S| δ² − 2 s1 δ + s2 − 1 = 0, shifted by τ for accuracy.
            disc = (s1 * s1 - new_size * (s2 - 1)).clamp(min=0)
            # δ ≥ 0 in exact arithmetic (τ is left of the root); rounding can flip its sign.
            delta = ((s1 - disc.sqrt()) / new_size.clamp(min=1)).clamp(min=0)
            exact = check & (_count_positive((gap - delta).clamp_(min=0)) == new_size)
            tau = torch.where(exact, tau + delta, tau)
            done = done | exact
            if bool(done.all()):
                return tau, iterations
        # Newton on the convex h(τ) = ‖[z − τ]_+‖₂ − 1: far fewer steps than on ‖·‖₂² − 1.
        norm = s2.sqrt()
        tau = torch.where(done, tau, tau + (s2 - norm) / s1.clamp(min=1e-30))
        size = new_size
    return _fallback_to_sort(z, tau, done, _entmax15_threshold_sort), iterations


# --------------------------------------------------------------------------- general α solver


def _tolerance(dtype: torch.dtype, d: int) -> float:
    # |Σp − 1| target: a few ulps of the row sum, which carries ~log2(d) rounding steps.
    eps = torch.finfo(dtype).eps
    return 4 * eps * max(1, d.bit_length())


def _entmax_terms(gap: Tensor, inv_beta_m1: Tensor, below_two: bool) -> tuple[Tensor, Tensor]:
    """s = p^{1−β} and p = (1 + gap)^{1/β} for gap = z − u ∈ [−1, 0]; p = 0 at gap = −1.

    With α < 2 (1/β − 1 > 0) the exponent is floored at ½ log(tiny) (1e-19 in fp32, far below
    its resolution): exp of −inf, or of an argument near underflow, takes a slow path on CPU,
    and p = s (1 + gap) is still exactly 0 at gap = −1. With α ≥ 2, s = p^{1−β} ≥ 1 on the
    support and must be zeroed off it explicitly.
    """
    exponent = torch.log1p(gap) * inv_beta_m1
    if below_two:
        s = torch.exp(exponent.clamp_(min=0.5 * math.log(torch.finfo(gap.dtype).tiny)))
    else:
        s = torch.where(gap > -1, torch.exp(exponent), 0.0)
    return s, torch.addcmul(s, s, gap)


def _entmax_root(z: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """Solve Σ_i [1 + z_i − u]_+^{1/β} = 1 for u ∈ [0, 1 − d^{−β}] (τ = u − 1).

    z = β (x − max) ≤ 0. The unknown u = τ + 1 keeps the problem well conditioned as β → 0.
    Newton steps on h(u) = ‖[1 + z − u]_+‖_{1/β} − 1 = (Σ_i p_i)^β − 1, which is convex for
    α ≤ 2, so steps from u = 0 never overshoot; h is linear on each support for sparsemax and
    tends to β log Σp (linear in u) for softmax, so α near 1 or 2 converges in a few steps. A
    step that leaves the bisection bracket [lo, hi] is replaced by bisection. Stops when
    |Σp − 1| ≤ tol for every row, or where the bracket has shrunk to two ulps: with α > 2, Σp is
    so steep near the root (slope Σ p^{2−α}/β) that adjacent floats can straddle it with
    |Σp − 1| > tol, and such a row would otherwise hold the batch until ``max_iter``.

    Rows with no finite entry stop at once. Returns (u, iterations per row).
    """
    d = z.shape[-1]  # K ≤ d candidates (p_i ≤ 1/K at the upper end) tighten the bracket
    tol = _tolerance(z.dtype, d)
    eps = torch.finfo(z.dtype).eps
    # Twice the mantissa bits: every bisection step halves the bracket, Newton steps do better.
    max_iter = 2 * round(-math.log2(torch.finfo(z.dtype).eps))
    inv_beta_m1 = 1 / beta - 1
    shape = torch.broadcast_shapes(z[..., :1].shape, beta.shape)
    lo = torch.zeros(shape, dtype=z.dtype, device=z.device)
    hi = -torch.expm1(-beta * math.log(d)).expand(shape)
    u = lo.clone()
    prev_err = torch.full_like(u, float("inf"))
    done = torch.zeros_like(u, dtype=torch.bool)
    iterations = torch.zeros_like(u, dtype=torch.long)
    below_two = bool((beta < 1).all())
    for _ in range(max_iter):
        s, p = _entmax_terms((z - u).clamp_(min=-1), inv_beta_m1, below_two)
        mass = p.sum(dim=-1, keepdim=True)
        err = mass - 1
        done = done | (err.abs() <= tol) | (mass == 0)
        if bool(done.all()):
            break
        iterations += ~done
        lo = torch.where(err > 0, u, lo)
        hi = torch.where(err < 0, u, hi)
        done = done | (hi - lo <= 2 * eps * hi)
        # Newton on h(u) = (Σp)^β − 1 = ‖[1 + z − u]_+‖_{1/β} − 1, h' = −(Σp)^{β−1} Σ p^{1−β}.
        log_mass = torch.log(mass)
        step = torch.expm1(beta * log_mass) * torch.exp((1 - beta) * log_mass)
        newton = u + step / s.sum(dim=-1, keepdim=True)
        # For α ≤ 2 the norm is convex and the steps climb monotonically to the root; for α > 2
        # it is not, and a step that does not halve the error is replaced by bisection.
        slow = (err.abs() > 0.5 * prev_err) & (beta > 1)
        bisect = (newton <= lo) | (newton >= hi) | slow
        u = torch.where(done, u, torch.where(bisect, (lo + hi) / 2, newton))
        prev_err = err.abs()
    return u, iterations


# --------------------------------------------------------------------------- backward helpers


def _jacobian_vector_product(s: Tensor, grad: Tensor) -> Tensor:
    """∂L/∂x for p = entmax_α(x): (diag(s) − s sᵀ/Σs) g with s = p^{2−α} on the support."""
    s_sum = s.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny)
    return s * (grad - (s * grad).sum(dim=-1, keepdim=True) / s_sum)


def _expm1_minus_x_over_x2(y: Tensor) -> Tensor:
    """φ(y) = (e^y − 1 − y) / y² for y ≥ 0, without cancellation near 0 (φ(0) = 1/2)."""
    series = 1 / 2 + y * (1 / 6 + y * (1 / 24 + y * (1 / 120 + y / 720)))
    small = y < 0.1
    y_big = torch.where(small, 1.0, y)
    return torch.where(small, series, (torch.expm1(y_big) - y_big) / (y_big * y_big))


def _alpha_grad(p: Tensor, log_p: Tensor, s: Tensor, grad: Tensor, beta: Tensor) -> Tensor:
    """Σ_i g_i ∂p_i/∂α per row (Correia et al. 2019, Prop. 1), with β = α − 1, ŝ = s/Σs:

        ∂p_i/∂α = (p_i − ŝ_i)/β² − (p_i log p_i − ŝ_i Σ_j p_j log p_j)/β.

    Both terms are O(1/β) and cancel as β → 0, so for small β the same quantity is evaluated as
    (1/Σs)[⟨gp,1⟩⟨p,ρ⟩ − ⟨gp,ρ⟩ + β(H⟨gp,ρ⟩ − ⟨p,ρ⟩⟨gp,log p⟩)] with gp = g ⊙ p,
    H = Σ p log p and ρ_i = log²p_i · φ(−β log p_i), which tends to the α = 1 derivative
    (−p_i log²p_i + p_i Σ_j p_j log²p_j)/2.
    """
    s_sum = s.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny)
    gp = grad * p
    gp_sum = gp.sum(dim=-1, keepdim=True)
    gp_log = (gp * log_p).sum(dim=-1, keepdim=True)
    neg_entropy = (p * log_p).sum(dim=-1, keepdim=True)
    small = beta < _STABLE_ALPHA_GRAD_BELOW

    def direct() -> Tensor:
        gs_hat = (grad * s).sum(dim=-1, keepdim=True) / s_sum
        return (gp_sum - gs_hat) / beta**2 - (gp_log - gs_hat * neg_entropy) / beta

    def stable() -> Tensor:
        rho = log_p * log_p * _expm1_minus_x_over_x2(-beta * log_p)
        p_rho = (p * rho).sum(dim=-1, keepdim=True)
        gp_rho = (gp * rho).sum(dim=-1, keepdim=True)
        return (gp_sum * p_rho - gp_rho + beta * (neg_entropy * gp_rho - p_rho * gp_log)) / s_sum

    if bool(small.all()):
        return stable()
    if not bool(small.any()):
        return direct()
    return torch.where(small, stable(), direct())


# --------------------------------------------------------------------------- autograd functions


class _Rows(NamedTuple):
    """Scores of a call, prepared for the solvers by ``_scaled_candidates``."""

    candidates: _Candidates
    shifted: Tensor  # the candidates' x − row max ([..., K])
    row_max: Tensor  # 0 on rows with no finite entry ([..., 1])
    live: Tensor  # whether the row has a finite entry (False on NaN rows)
    nan: Tensor | None  # rows with a NaN score, solved as empty rows; None when there is none


def _poison(t: Tensor, nan: Tensor | None) -> Tensor:
    """``t`` with NaN on every entry of the rows flagged in ``nan`` (rows with a NaN score)."""
    return t if nan is None else t.masked_fill(nan, math.nan)


def _scaled_candidates(x: Tensor, beta: float | Tensor) -> _Rows:
    """Candidates of x for α = 1 + β, their shifted scores x − max, the row max and liveness.

    Rows with a NaN (the row max propagates it, so finding them costs no pass over x) are
    replaced by empty rows: the solvers stop on them at once and the packing sees no candidate
    there. The callers put NaN back on their outputs and gradients (``_poison``).
    """
    row_max = x.amax(dim=-1, keepdim=True)
    nan = torch.isnan(row_max) | (row_max == float("inf"))
    if bool(nan.any()):
        x = x.masked_fill(nan, float("-inf"))
        row_max = row_max.masked_fill(nan, float("-inf"))
    else:
        nan = None
    live = row_max > float("-inf")
    row_max = row_max.masked_fill(~live, 0.0)
    candidates = _Candidates(x, row_max - 1 / beta)
    return _Rows(candidates, candidates.values - row_max, row_max, live, nan)


def _kernels(x: Tensor) -> ModuleType | None:
    """The fused kernels for ``x``: C++ on the CPU (``fused``), Triton on CUDA (``fused_triton``);
    None sends ``x`` to the eager solvers."""
    if fused.usable(x):
        return fused
    if fused_triton.usable(x):
        return fused_triton
    return None


class SparsemaxFunction(torch.autograd.Function):
    """sparsemax(x) = argmin_{p ∈ Δ} ‖p − x‖² = [x − τ]_+ over the last dimension.

    Backward: J = diag(s) − s sᵀ/|S| with s the indicator of the support S.
    """

    @staticmethod
    @autocast_off_forward(cast_inputs=None)
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.kernels = _kernels(x)
        if ctx.kernels is not None:
            p = ctx.kernels.sparsemax(x)
            ctx.save_for_backward(p)
            return p
        rows = _scaled_candidates(x, 1.0)
        tau, _ = _sparsemax_threshold(rows.shifted)
        p = (rows.shifted - tau).clamp_(min=0)
        ctx.candidates, ctx.nan = rows.candidates, rows.nan
        ctx.save_for_backward(p)
        return _poison(rows.candidates.scatter(p), rows.nan)

    @staticmethod
    @autocast_off_backward
    def backward(ctx, grad: Tensor) -> Tensor:
        (p,) = ctx.saved_tensors
        if ctx.kernels is not None:
            return ctx.kernels.sparsemax_backward(p, grad)
        grad = ctx.candidates.gather(grad)
        grad_x = _jacobian_vector_product((p > 0).to(grad.dtype), grad)
        return _poison(ctx.candidates.scatter(grad_x), ctx.nan)


class Entmax15Function(torch.autograd.Function):
    """1.5-entmax(x) = [x/2 − τ]_+² over the last dimension.

    Backward: J = diag(s) − s sᵀ/Σs with s = √p.
    """

    @staticmethod
    @autocast_off_forward(cast_inputs=None)
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.kernels = _kernels(x)
        if ctx.kernels is not None:
            p = ctx.kernels.entmax15(x)
            ctx.save_for_backward(p)
            return p
        rows = _scaled_candidates(x, 0.5)
        z = rows.shifted / 2
        tau, _ = _entmax15_threshold(z)
        sqrt_p = (z - tau).clamp_(min=0)
        ctx.candidates, ctx.nan = rows.candidates, rows.nan
        ctx.save_for_backward(sqrt_p)
        return _poison(rows.candidates.scatter(sqrt_p.square()), rows.nan)

    @staticmethod
    @autocast_off_backward
    def backward(ctx, grad: Tensor) -> Tensor:
        if ctx.kernels is not None:
            return ctx.kernels.entmax15_backward(*ctx.saved_tensors, grad)
        (sqrt_p,) = ctx.saved_tensors
        grad = ctx.candidates.gather(grad)
        return _poison(ctx.candidates.scatter(_jacobian_vector_product(sqrt_p, grad)), ctx.nan)


class EntmaxFunction(torch.autograd.Function):
    """α-entmax(x) = [(α−1)x − τ]_+^{1/(α−1)} over the last dimension, α broadcast per row.

    Backward in x: J = diag(s) − s sᵀ/Σs with s = p^{2−α}; in α: see ``_alpha_grad``.
    """

    @staticmethod
    @autocast_off_forward(cast_inputs=None)
    def forward(ctx, x: Tensor, alpha: Tensor) -> Tensor:
        ctx.kernels = _kernels(x)
        if ctx.kernels is not None:
            p = ctx.kernels.entmax(x, alpha)
            ctx.save_for_backward(p, alpha)
            return p
        beta = (alpha - 1).clamp(min=_MIN_BETA)
        rows = _scaled_candidates(x, beta)
        z = beta * rows.shifted
        u, _ = _entmax_root(z, beta)
        _, p = _entmax_terms((z - u).clamp_(min=-1), 1 / beta - 1, bool((beta < 1).all()))
        p = p / p.sum(dim=-1, keepdim=True)
        softmax_rows = alpha - 1 < _MIN_BETA
        if bool(softmax_rows.any()):  # the α → 1 limit, exactly
            p = torch.where(softmax_rows, torch.softmax(rows.shifted, dim=-1), p)
        p = p.masked_fill(~rows.live, 0.0)
        ctx.candidates, ctx.nan = rows.candidates, rows.nan
        ctx.save_for_backward(p, alpha)
        return _poison(rows.candidates.scatter(p), rows.nan)

    @staticmethod
    @autocast_off_backward
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor | None]:
        p, alpha = ctx.saved_tensors
        if ctx.kernels is not None:
            grad_x, per_row = ctx.kernels.entmax_backward(p, alpha, grad, ctx.needs_input_grad[1])
            return grad_x, None if per_row is None else per_row.sum_to_size(alpha.shape)
        grad = ctx.candidates.gather(grad)
        beta = (alpha - 1).clamp(min=0)  # both gradients are well defined at α = 1
        on = p > 0
        log_p = torch.where(on, p, 1.0).log()
        s = torch.where(on, torch.exp((1 - beta) * log_p), 0.0)
        grad_x = _poison(ctx.candidates.scatter(_jacobian_vector_product(s, grad)), ctx.nan)
        grad_alpha = None
        if ctx.needs_input_grad[1]:
            per_row = _poison(_alpha_grad(p, log_p, s, grad, beta), ctx.nan)
            grad_alpha = per_row.sum_to_size(alpha.shape)
        return grad_x, grad_alpha


class TopkSoftmaxFunction(torch.autograd.Function):
    """Softmax over the entries ≥ the k-th largest of the last dimension (the fused kernel; the
    eager ``topk_softmax`` is composed of torch ops).

    Backward: the softmax Jacobian on the kept entries, p ⊙ (g − ⟨p, g⟩).
    """

    @staticmethod
    @autocast_off_forward(cast_inputs=None)
    def forward(ctx, x: Tensor, k: int) -> Tensor:
        p = fused.topk_softmax(x, k)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    @autocast_off_backward
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (p,) = ctx.saved_tensors
        return fused.softmax_backward(p, grad), None


# --------------------------------------------------------------------------- public API


def _number_or_tensor(alpha: object) -> float | Tensor:
    """α as a Python number or a tensor: lists, NumPy arrays and the like via torch.as_tensor."""
    if isinstance(alpha, (Tensor, int, float)) and not isinstance(alpha, bool):
        return alpha
    try:
        return torch.as_tensor(alpha)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"alpha must be a number or a tensor, got {alpha!r}") from error


def _empty_like(x: Tensor) -> Tensor:
    """The result for an ``x`` with no entries: empty, of x's shape and dtype, in x's graph."""
    return x * 0


def _alpha_to_last_dim(alpha: float | Tensor, x: Tensor, dim: int) -> Tensor:
    """α in x's compute dtype on x's device, checked broadcastable to x with size 1 along
    ``dim`` (one α per row), with ``dim`` moved last. Its values are ``_checked``'s."""
    dtype = _compute_dtype(x)
    if isinstance(alpha, Tensor):
        a = alpha.to(device=x.device, dtype=dtype)
    else:
        a = torch.tensor(alpha, dtype=dtype, device=x.device)
    if a.ndim > x.ndim:
        raise ValueError(
            f"alpha of shape {tuple(a.shape)} has more dimensions than x of shape {tuple(x.shape)}"
        )
    a = a.reshape((1,) * (x.ndim - a.ndim) + tuple(a.shape))
    d = dim % x.ndim
    if a.shape[d] != 1:
        raise ValueError(
            f"alpha must have size 1 along dim={dim} (one α per row); got alpha of shape "
            f"{tuple(a.shape)} for x of shape {tuple(x.shape)}"
        )
    try:
        ok = torch.broadcast_shapes(a.shape, x.shape) == x.shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"alpha of shape {tuple(a.shape)} is not broadcastable to x of shape {tuple(x.shape)}"
        )
    return a if d == x.ndim - 1 else a.movedim(d, -1)


def _checked(a: Tensor) -> bool:
    """Raise unless every α ≥ 1; whether some α exceeds ``_FLOAT64_ABOVE_ALPHA``. One wait for
    the device (a single transfer for both answers): the Triton path does without it."""
    bad = torch.isnan(a) | (a < 1) | (a == math.inf)
    any_bad, above = torch.stack([bad.any(), (a > _FLOAT64_ABOVE_ALPHA).any()]).tolist()
    if any_bad:
        raise ValueError(
            f"alpha must be finite and >= 1 (α = 1 is softmax); got {a[bad].flatten()[0].item()}"
        )
    return above


def _softmax_with_empty_rows(x: Tensor, row_max: Tensor) -> Tensor:
    """Softmax over the last dim; rows whose max is −inf (nothing unmasked) give zeros.

    The empty rows are zeroed whether there are any or not: asking would wait for the device
    (a host sync in every attention layer), and the fills change no other row's values or
    gradients."""
    empty = row_max == float("-inf")
    # A zero row instead of −inf keeps softmax and its backward free of NaN.
    return torch.softmax(x.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)


def softmax(x: Tensor, dim: int = -1, mask: Tensor | None = None) -> Tensor:
    """Masked softmax: p_i ∝ exp(x_i) over unmasked entries; fully masked rows give zeros."""
    xl = _to_last_dim(x, dim, mask)
    if xl.numel() == 0:
        return _from_last_dim(_empty_like(xl), dim, x.dtype)
    return _from_last_dim(_softmax_with_empty_rows(xl, xl.amax(dim=-1, keepdim=True)), dim, x.dtype)


def sparsemax(x: Tensor, dim: int = -1, mask: Tensor | None = None) -> Tensor:
    """sparsemax(x) = argmin_{p ∈ Δ} ‖p − x‖² = [x − τ]_+ (Martins & Astudillo 2016); exact."""
    xl = _to_last_dim(x, dim, mask, native=True)
    p = _empty_like(xl) if xl.numel() == 0 else SparsemaxFunction.apply(xl)
    return _from_last_dim(p, dim, x.dtype)


def entmax15(x: Tensor, dim: int = -1, mask: Tensor | None = None) -> Tensor:
    """1.5-entmax(x) = [x/2 − τ]_+² (Peters et al. 2019); exact."""
    xl = _to_last_dim(x, dim, mask, native=True)
    p = _empty_like(xl) if xl.numel() == 0 else Entmax15Function.apply(xl)
    return _from_last_dim(p, dim, x.dtype)


def entmax(x: Tensor, alpha: float | Tensor, dim: int = -1, mask: Tensor | None = None) -> Tensor:
    """α-entmax(x) = [(α−1)x − τ]_+^{1/(α−1)} for any α ≥ 1 (Correia et al. 2019).

    ``alpha`` is a float or a tensor broadcastable to ``x`` with size 1 along ``dim`` (one α per
    row, per head with shape [1, H, 1, 1], ...); the result is differentiable in x and in α.
    Float α = 1, 1.5 and 2 dispatch to softmax, ``entmax15`` and ``sparsemax``. Calls where some
    α exceeds 2 are computed in float64 (``_FLOAT64_ABOVE_ALPHA``; the Triton kernels: those
    rows); others in the input dtype. A list or array α is taken as ``torch.as_tensor(alpha)``.
    An α below 1, +inf or NaN raises ValueError, except a tensor α on the Triton kernels
    (CUDA), which gives NaN rows: checking it would wait for the device.
    """
    alpha = _number_or_tensor(alpha)
    if not isinstance(alpha, Tensor):
        if not 1 <= alpha < math.inf:  # NaN too
            raise ValueError(f"alpha must be finite and >= 1 (α = 1 is softmax); got {alpha}")
        if alpha == 1:
            return softmax(x, dim, mask)
        if alpha == 1.5:
            return entmax15(x, dim, mask)
        if alpha == 2:
            return sparsemax(x, dim, mask)
    xl = _to_last_dim(x, dim, mask, native=True)
    a = _alpha_to_last_dim(alpha, x, dim)
    # The Triton kernels solve α > 2 rows in float64 themselves, and make rows of an invalid
    # (tensor) α NaN: no wait for the device there. Elsewhere α is checked.
    if not fused_triton.usable(xl) and _checked(a):
        xl, a = xl.to(torch.float64), a.to(torch.float64)
    p = _empty_like(xl) if xl.numel() == 0 else EntmaxFunction.apply(xl, a)
    return _from_last_dim(p, dim, x.dtype)


def topk_softmax(x: Tensor, k: int, dim: int = -1, mask: Tensor | None = None) -> Tensor:
    """Explicit sparse attention (Zhao et al. 2019): softmax over the k largest scores of a row.

    Scores below the k-th largest are masked; ties at the threshold are kept; k is clipped to
    the number of unmasked entries.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    xl = _to_last_dim(x, dim, mask)
    if xl.numel() == 0:
        return _from_last_dim(_empty_like(xl), dim, x.dtype)
    if fused.usable(xl):
        return _from_last_dim(TopkSoftmaxFunction.apply(xl, k), dim, x.dtype)
    top = xl.topk(min(k, xl.shape[-1]), dim=-1).values
    # Fewer than k unmasked entries make the k-th value −inf, which keeps all unmasked ones. A NaN
    # is never below the k-th value, so a row with a NaN stays NaN. Adding −inf (not masked_fill)
    # keeps dropped entries in the graph: their gradient p_i (g_i − ⟨p, g⟩) is exactly 0 on
    # ordinary rows and NaN on a NaN row, as softmax's.
    kept = xl + torch.where(xl < top[..., -1:], float("-inf"), 0.0)
    return _from_last_dim(_softmax_with_empty_rows(kept, top[..., :1]), dim, x.dtype)


@torch.no_grad()
def entmax_threshold(
    x: Tensor, alpha: float | Tensor, dim: int = -1, mask: Tensor | None = None
) -> EntmaxThreshold:
    """The threshold τ of α-entmax (p_i = [(α−1)x_i − τ]_+^{1/(α−1)}) and solver iterations.

    Uses the same solver as ``entmax`` (the exact ones for float α = 1.5 and 2); for benchmarks
    and for checking optimality conditions. Not differentiable.
    """
    xl = _to_last_dim(x, dim, mask)
    alpha = _number_or_tensor(alpha)
    if isinstance(alpha, Tensor) or alpha not in (1.5, 2):
        a = _alpha_to_last_dim(alpha, x, dim)
        if _checked(a):
            xl, a = xl.to(torch.float64), a.to(torch.float64)
        beta = (a - 1).clamp(min=_MIN_BETA)
        rows = _scaled_candidates(xl, beta)
        u, iterations = _entmax_root(beta * rows.shifted, beta)
        scaled_tau = u - 1
    else:
        beta = alpha - 1
        rows = _scaled_candidates(xl, beta)
        solve = _sparsemax_threshold if alpha == 2 else _entmax15_threshold
        scaled_tau, iterations = solve(beta * rows.shifted)
    tau = scaled_tau + beta * rows.row_max
    tau = _poison(tau.masked_fill(~rows.live, float("inf")), rows.nan)
    tau = tau.to(_compute_dtype(x))
    return EntmaxThreshold(tau.movedim(-1, dim), iterations.movedim(-1, dim))
