r"""Triton kernels of the sparse normalizers, one program per row; launched by ``fused_triton``.

The same mappings and solvers as the eager path (``normalizers``) and the C++ kernels
(``fused_cpu.cpp``), over rows of a contiguous [rows, d] tensor held whole in registers
(d ≤ ``fused_triton.MAX_D``). With z = x − max x (−inf for masked entries):

* sparsemax, p = [z − τ]_+: Michelot's steps τ ← (Σ_S z_i − 1)/|S| on the support
  S = {z_i > τ} from τ = −1; they never overshoot and stop, exact, when S stops shrinking. The
  division is correctly rounded (``div_rn``: ``/`` compiles to ``div.full.f32``, 2 ulps) and the
  loop stops as soon as S does not shrink, not when it is unchanged: with an inexact τ a score
  equal to τ can leave S and enter it again, a cycle that ran bf16-valued rows to the cap.
* 1.5-entmax, p = [z/2 − τ]_+²: Newton on the convex ‖[z/2 − τ]_+‖₂ − 1 from τ = −1; once a
  step leaves the support unchanged, the closed form τ_S of Σ_S (z_i/2 − τ)² = 1 is tried and
  kept when the support at τ_S is still S (then it is the exact threshold).
* α-entmax, p = [1 + βz − u]_+^{1/β} with β = α − 1 per row: safeguarded Newton on
  (Σp)^β − 1 inside the bisection bracket u ∈ [0, 1 − n^{−β}] (n finite entries), stopped at
  |Σp − 1| ≤ 4·eps·bits(d) or when the bracket collapses to two ulps, then p/Σp. Rows with
  β < ``DOUBLE_BELOW_BETA`` (the 1/β power multiplies the solve's rounding) or α >
  ``FLOAT64_ABOVE_ALPHA`` are solved in float64 whatever the input, by a launch of their own
  (``WIDE``); β below ``MIN_BETA`` is softmax, exactly; an α below 1, NaN or +inf gives NaN.

Half precision is loaded and stored as it is and computed in float32.

A row with a NaN or +inf score gives NaN everywhere (and NaN gradients); a row with no finite
score gives zeros (and zero gradients). Backward, with s = p^{2−α} on the support (the
indicator for sparsemax, √p for 1.5-entmax): ∂L/∂x = s ⊙ (g − ⟨s, g⟩/Σs); the α-gradient per row is
``normalizers._alpha_grad``'s, in its cancellation-free form below β = ``STABLE_ALPHA_GRAD_BELOW``.

Only ``tl`` primitives are used (no libdevice), so ``TRITON_INTERPRET=1`` runs every kernel on
the CPU: that is how the tests check them without a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

SPARSEMAX: tl.constexpr = tl.constexpr(0)
ENTMAX15: tl.constexpr = tl.constexpr(1)
ENTMAX: tl.constexpr = tl.constexpr(2)
# The same constants as ``normalizers`` and ``fused_cpu.cpp`` (each explains its reason there).
MIN_BETA: tl.constexpr = tl.constexpr(1e-7)
DOUBLE_BELOW_BETA: tl.constexpr = tl.constexpr(1e-2)
FLOAT64_ABOVE_ALPHA: tl.constexpr = tl.constexpr(2.0)
STABLE_ALPHA_GRAD_BELOW: tl.constexpr = tl.constexpr(0.5)
# float64's machine epsilon, Newton/bisection cap (twice its mantissa bits) and ½ log(tiny).
EPS64: tl.constexpr = tl.constexpr(2.220446049250313e-16)
MAX_ITER64: tl.constexpr = tl.constexpr(104)
HALF_LOG_TINY64: tl.constexpr = tl.constexpr(-354.0)
# Cap on the 1.5-entmax steps (Newton from the left converges long before; see the module doc).
ENTMAX15_MAX_ITER: tl.constexpr = tl.constexpr(64)


@triton.jit
def _log1p(g):
    """log(1 + g), accurate for small g (Kahan's log(w)·g/(w − 1) with w = 1 + g)."""
    w = 1.0 + g
    return tl.where(w == 1.0, g, tl.log(w) * (g / (w - 1.0)))


@triton.jit
def _expm1(y):
    """e^y − 1, accurate for small y (Kahan's (u − 1)·y/log u with u = e^y)."""
    u = tl.exp(y)
    return tl.where(u == 1.0, y, tl.where(u - 1.0 == -1.0, -1.0, (u - 1.0) * (y / tl.log(u))))


@triton.jit
def _scalar(value, like):
    """``value`` as a 0-d tensor of ``like``'s dtype (loop-carried values keep one type)."""
    return tl.full([], value, like.dtype)


@triton.jit
def _divide(a, b):
    """a / b, correctly rounded: float32's ``/`` compiles to ``div.full.f32``, which is not
    (float64's to ``div.rn.f64``, which is; ``div_rn`` takes float32 only)."""
    # A static if: Triton compiles the taken branch only (div_rn refuses float64 operands).
    if a.dtype == tl.float64:  # noqa: SIM108
        quotient = a / b
    else:
        quotient = tl.math.div_rn(a, b)
    return quotient


@triton.jit
def _sparsemax_row(z, d):
    tau = _scalar(-1.0, z)
    size = _scalar(d + 1.0, z)  # more than any support: the first step always shrinks it
    shrank = size > 0
    steps = 0
    while shrank & (steps <= d):
        on = z > tau
        new_size = tl.sum(on.to(z.dtype), axis=0)
        shrank = new_size < size
        total = tl.sum(tl.where(on, z, 0.0), axis=0)
        tau = tl.where(shrank, _divide(total - 1.0, tl.maximum(new_size, 1.0)), tau)
        size = tl.minimum(new_size, size)
        steps += 1
    return tl.maximum(z - tau, 0.0)


@triton.jit
def _entmax15_row(z):
    tau = _scalar(-1.0, z)
    size = _scalar(-1.0, z)
    done = size > 0
    steps = 0
    while (not done) & (steps < ENTMAX15_MAX_ITER):
        gap = tl.maximum(z - tau, 0.0)
        n = tl.sum((gap > 0).to(z.dtype), axis=0)
        s1 = tl.sum(gap, axis=0)
        s2 = tl.sum(gap * gap, axis=0)
        # Smaller root δ of n δ² − 2 s1 δ + s2 − 1 = 0 (δ ≥ 0 up to rounding).
        disc = tl.maximum(s1 * s1 - n * (s2 - 1.0), 0.0)
        delta = tl.maximum((s1 - tl.sqrt(disc)) / tl.maximum(n, 1.0), 0.0)
        kept = tl.sum((gap - delta > 0).to(z.dtype), axis=0)
        exact = (n == size) & (kept == n)
        newton = tau + (s2 - tl.sqrt(s2)) / tl.maximum(s1, 1e-30)
        tau = tl.where(exact, tau + delta, newton)
        done = exact | (n == 0)
        size = n
        steps += 1
    gap = tl.maximum(z - tau, 0.0)
    return gap * gap


@triton.jit
def _entmax_terms(gap, inv_beta_m1, below_two, half_log_tiny):
    """s = p^{1−β} and p = (1 + gap)^{1/β} for gap ∈ [−1, 0] (``normalizers._entmax_terms``),
    with one exp per entry: floored at ½ log(tiny) for α < 2, zeroed off the support above."""
    exponent = _log1p(gap) * inv_beta_m1
    s = tl.exp(tl.where(below_two, tl.maximum(exponent, half_log_tiny), exponent))
    s = tl.where(below_two, s, tl.where(gap > -1.0, s, 0.0))
    return s, s + s * gap


@triton.jit
def _entmax_solve(
    shifted, beta, n, bits, EPS: tl.constexpr, MAX_ITER: tl.constexpr, HALF_LOG_TINY: tl.constexpr
):
    """p of α = 1 + β for x − max = ``shifted`` (``normalizers._entmax_root``, then p/Σp)."""
    z = beta * shifted
    # Tensors left of constexprs: Triton 3.7's interpreter turns `constexpr * tensor` into a
    # constexpr wrapping a tensor, which a later comparison cannot convert (compiled code is not
    # affected; the product is the same either way round).
    tol = bits * (4.0 * EPS)
    inv_beta_m1 = 1.0 / beta - 1.0
    below_two = beta < 1.0
    lo = _scalar(0.0, z)
    hi = -_expm1(-beta * tl.log(tl.maximum(n, 1.0)))
    u = _scalar(0.0, z)
    prev_err = _scalar(float("inf"), z)
    done = n < 1.0
    steps = 0
    while (not done) & (steps < MAX_ITER):
        s, p = _entmax_terms(tl.maximum(z - u, -1.0), inv_beta_m1, below_two, HALF_LOG_TINY)
        mass = tl.sum(p, axis=0)
        err = mass - 1.0
        done = (tl.abs(err) <= tol) | (mass == 0.0)
        lo = tl.where(done | (err <= 0), lo, u)
        hi = tl.where(done | (err >= 0), hi, u)
        done = done | (hi - lo <= hi * (2.0 * EPS))
        # Newton on h(u) = (Σp)^β − 1, h' = −(Σp)^{β−1} Σ p^{1−β}.
        log_mass = tl.log(mass)
        step = _expm1(beta * log_mass) * tl.exp((1.0 - beta) * log_mass)
        newton = u + step / tl.sum(s, axis=0)
        slow = (tl.abs(err) > 0.5 * prev_err) & (beta > 1.0)
        bisect = (newton <= lo) | (newton >= hi) | slow
        u = tl.where(done, u, tl.where(bisect, 0.5 * (lo + hi), newton))
        prev_err = tl.abs(err)
        steps += 1
    _, p = _entmax_terms(tl.maximum(z - u, -1.0), inv_beta_m1, below_two, HALF_LOG_TINY)
    return p / tl.sum(p, axis=0)


@triton.jit
def _wide(alpha):
    """Whether a row of this α and narrower scores than float64 is solved in float64: β below
    ``DOUBLE_BELOW_BETA`` (the 1/β power multiplies the solve's rounding) but not softmax, or α
    above ``FLOAT64_ABOVE_ALPHA`` (``normalizers._FLOAT64_ABOVE_ALPHA`` gives the reason)."""
    beta = alpha - 1.0
    return ((beta >= MIN_BETA) & (beta < DOUBLE_BELOW_BETA)) | (alpha > FLOAT64_ABOVE_ALPHA)


@triton.jit
def forward(
    x_ptr,
    alpha_ptr,
    p_ptr,
    d,
    bits,
    BLOCK: tl.constexpr,
    KIND: tl.constexpr,
    EPS: tl.constexpr,
    MAX_ITER: tl.constexpr,
    HALF_LOG_TINY: tl.constexpr,
    WIDE: tl.constexpr,
):
    """p = KIND(x) for row ``program_id`` of x (α from ``alpha_ptr`` for α-entmax).

    x and p are float64, float32, or half precision computed in float32 (no cast kernels around
    the launch). α-entmax of rows narrower than float64 takes two launches that share out the
    rows: WIDE=False the softmax rows, rows of an invalid α (NaN, +inf or below 1: NaN
    everywhere, as the host does not sync to check α) and the float32 solve; WIDE=True only
    the rows ``_wide`` sends to the float64 solve, so that the float32 kernel carries no
    float64 code (registers, issue 37). A launch neither reads nor writes the other's rows.
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < d
    if KIND == ENTMAX:
        alpha = tl.load(alpha_ptr + row)
        if x_ptr.dtype.element_ty != tl.float64:
            wide = _wide(alpha)
            if not WIDE:
                wide = not wide
            inside = tl.where(wide, inside, False)  # `&` of these fails in the interpreter
    x = tl.load(x_ptr + row * d + cols, mask=inside, other=float("-inf"))
    if x.dtype != tl.float64:
        x = x.to(tl.float32)
    nan_row = tl.sum((x != x).to(tl.int32), axis=0) > 0
    x = tl.where(x != x, float("-inf"), x)
    row_max = tl.max(x, axis=0)
    nan_row = nan_row | (row_max == float("inf"))  # a +inf score: NaN, as torch.softmax
    live = row_max > float("-inf")
    shifted = x - tl.where(live, row_max, 0.0)
    if KIND == SPARSEMAX:
        p = _sparsemax_row(shifted, d)
    elif KIND == ENTMAX15:
        p = _entmax15_row(0.5 * shifted)
    else:
        nan_row = nan_row | (alpha != alpha) | (alpha < 1.0) | (alpha == float("inf"))
        n = tl.sum((shifted > float("-inf")).to(shifted.dtype), axis=0)
        if WIDE:
            p = _entmax_solve(
                shifted.to(tl.float64), alpha.to(tl.float64) - 1.0, n.to(tl.float64), bits,
                EPS64, MAX_ITER64, HALF_LOG_TINY64,
            ).to(shifted.dtype)  # fmt: skip
        elif alpha - 1.0 < MIN_BETA:
            e = tl.exp(shifted)
            p = e / tl.sum(e, axis=0)
        else:
            beta = (alpha - 1.0).to(shifted.dtype)
            p = _entmax_solve(shifted, beta, n, bits, EPS, MAX_ITER, HALF_LOG_TINY)
    p = tl.where(live, p, 0.0)
    p = tl.where(nan_row, float("nan"), p)
    tl.store(p_ptr + row * d + cols, p.to(p_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _phi(y):
    """(e^y − 1 − y)/y² for y ≥ 0, by its series below 0.1 (``normalizers``' φ)."""
    series = 0.5 + y * (1.0 / 6 + y * (1.0 / 24 + y * (1.0 / 120 + y / 720)))
    y_big = tl.where(y < 0.1, 1.0, y)
    return tl.where(y < 0.1, series, (_expm1(y_big) - y_big) / (y_big * y_big))


@triton.jit
def backward(
    p_ptr,
    alpha_ptr,
    g_ptr,
    grad_x_ptr,
    grad_alpha_ptr,
    d,
    BLOCK: tl.constexpr,
    KIND: tl.constexpr,
    ALPHA_GRAD: tl.constexpr,
):
    """∂L/∂x of row ``program_id`` from p and g = ∂L/∂p; with ALPHA_GRAD, Σ_i g_i ∂p_i/∂α.

    p, g and ∂L/∂x in p's dtype (half precision computed in float32); α and its gradient in
    float32 at least."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < d
    p = tl.load(p_ptr + row * d + cols, mask=inside, other=0.0)
    g = tl.load(g_ptr + row * d + cols, mask=inside, other=0.0)
    if p.dtype != tl.float64:
        p = p.to(tl.float32)
        g = g.to(tl.float32)
    nan_row = tl.sum((p != p).to(tl.int32), axis=0) > 0
    on = p > 0
    log_p = tl.log(tl.where(on, p, 1.0))
    if KIND == SPARSEMAX:
        s = on.to(p.dtype)
    elif KIND == ENTMAX15:
        s = tl.sqrt(p)
    else:
        beta = tl.maximum(tl.load(alpha_ptr + row) - 1.0, 0.0)
        s = tl.where(on, tl.exp((1.0 - beta) * log_p), 0.0)
    # A row with no support (no finite score) has s = 0: its gradients are 0, not 0/0.
    s_sum = tl.sum(s, axis=0)
    s_sum_safe = tl.where(s_sum > 0, s_sum, 1.0)
    gs_hat = tl.sum(s * g, axis=0) / s_sum_safe
    grad_x = tl.where(nan_row, float("nan"), s * (g - gs_hat))
    tl.store(grad_x_ptr + row * d + cols, grad_x.to(grad_x_ptr.dtype.element_ty), mask=inside)
    if ALPHA_GRAD:
        gp = g * p
        gp_sum = tl.sum(gp, axis=0)
        gp_log = tl.sum(gp * log_p, axis=0)
        neg_entropy = tl.sum(p * log_p, axis=0)
        if beta < STABLE_ALPHA_GRAD_BELOW:
            rho = log_p * log_p * _phi(-beta * log_p)
            p_rho = tl.sum(p * rho, axis=0)
            gp_rho = tl.sum(gp * rho, axis=0)
            mixed = neg_entropy * gp_rho - p_rho * gp_log
            grad_alpha = (gp_sum * p_rho - gp_rho + beta * mixed) / s_sum_safe
        else:
            grad_alpha = (gp_sum - gs_hat) / (beta * beta) - (gp_log - gs_hat * neg_entropy) / beta
        tl.store(grad_alpha_ptr + row, tl.where(nan_row, float("nan"), grad_alpha))
