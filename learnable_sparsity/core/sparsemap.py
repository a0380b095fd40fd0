r"""SparseMAP over bit vectors with the active-set algorithm (Niculae et al. 2018), batched.

For structures z with vectors a_z ∈ R^D (here the bit vectors themselves) and scores t ∈ R^D,

    SparseMAP(t) = argmin_{p ∈ Δ^{|Z|}} ½ ‖A p − t‖²,     μ = A p = Σ_z p(z) a_z,

i.e. μ is the Euclidean projection of t onto the marginal polytope conv{a_z}, and p is a sparse
distribution with at most D + 1 configurations (Carathéodory). Over z ∈ {0,1}^D the polytope is
the cube [0,1]^D (μ = clip(t, 0, 1)); with a budget Σz ≤ B it is {μ ∈ [0,1]^D : Σμ ≤ B}.

Active set (Nocedal & Wright §16.5 on the simplex-constrained QP). Start from the MAP structure.
Each iteration solves the equality-constrained QP on the current set S (the KKT system of
Q = A_Sᵀ A_S bordered by the simplex constraint). If the solution has a negative weight, step from
the current p towards it as far as feasibility allows and drop the blocking structure. Otherwise
ask the MAP oracle for the most violated structure z* = argmax_z ⟨a_z, t − μ⟩ and stop when
⟨a_{z*}, t − μ⟩ ≤ ⟨μ, t − μ⟩ (no dual variable is negative), else add z*. All examples of a
batch iterate together on padded sets of D + 2 slots; finished rows are left out of the solves.

Backward of p (implicit differentiation of the KKT system on the support S, where p > 0):
solve [[Q, 1], [1ᵀ, 0]] [v; ν] = [∂L/∂p_S; 0], then ∂L/∂t = A_S v. Through μ = A_Sᵀ p this gives
the projector onto the directions of aff(S), which is the Jacobian of μ only when S spans the
minimal face F of the polytope containing μ. It need not: at ties (t = ½·1 on the cube ends on
S = {0, 1}, a segment of the 3-dimensional F), and, at large D, wherever the active set stops
within its tolerance on fewer structures than F needs (about 35 instead of ~45 at D = 128 with
t ~ N(0, 1)). p itself is not differentiable at such points (the decomposition of μ is not
unique); the support-only backward is the derivative of the affine extension of ∂L/∂p_S to F,
which keeps the gradient of E_p[f] invariant to f + c and needs no f off the support.

Backward of μ (``BitVectorDistribution.marginals``, an output of its own): the Jacobian of the
projection, the orthogonal projector onto the directions of F, exact wherever the projection is
differentiable (there F is the face exposed by t − μ). It completes the directions of S lazily,
in the backward, by asking the oracle for vertices of that face off the current span: maximisers
of ⟨z, (t − μ) ± ε d⟩ for generic directions d projected off the span, with ties of t − μ merged
and ε small enough to only break them (``_face_directions``). Rows whose support spans F stop
after one probe; the marginals' backward costs about one forward at D = 128.

MAP oracles are callables t [B, D] -> best structure [B, D]: :func:`bernoulli_map` (independent
bits: z_i = [t_i > 0]) and :func:`budget_map` (at most B bits on).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from learnable_sparsity.core.amp import autocast_off_backward, autocast_off_forward
from learnable_sparsity.core.marginalize import BitVectorDistribution

MapOracle = Callable[[Tensor], Tensor]

# Solves run in float64: the KKT systems are small and the stopping test compares inner products.
_SOLVE_DTYPE = torch.float64
# Relative tolerance of the optimality test and of the feasibility of the QP solution.
_TOL = 1e-10
# A weight of the equality-constrained solve above −_WEIGHT_TOL counts as 0, not as negative: the
# solve's round-off grows with the active set (about 2e-9 with 36 structures at D = 128), and
# treating it as a negative weight makes the method cycle (drop a structure, re-add it, ...).
_WEIGHT_TOL = 1e-8
# Grid (relative to max |t|) the gaps t − μ are snapped to before the oracle sees them.
_GAP_TOL = 1e-9
# Norm below which a direction counts as 0 in the face's basis: the learnable_sparsity of 0/1
# vectors outside a span of 0/1 vectors are orders of magnitude larger, round-off is ~1e-15.
_RANK_TOL = 1e-9
# Gaps t − μ closer than this (relative to the scale of the optimality test) are ties when the
# backward finds the face of μ: the forward stops with gaps accurate to within _TOL on that
# scale (a few 1e-9 seen at D = 128), so true ties can differ by that much; 100 times more only
# also merges the gaps of points within ~1e-6 of a kink, where either face is a fair derivative.
_TIE_TOL = 100 * _TOL
# Seed of the fixed sequence of Gaussian directions that probe a face for vertices off the
# current span (generic directions: orthogonal to a given face direction with probability 0).
_PROBE_SEED = 20180323


def bernoulli_map(t: Tensor) -> Tensor:
    """MAP of independent bits: z_i = [t_i > 0], O(D)."""
    return (t > 0).to(t.dtype)


def budget_map(budget: int) -> MapOracle:
    """MAP oracle for at most ``budget`` bits on: the positive scores among the top ``budget``."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget must be a non-negative integer, got {budget!r}")

    def oracle(t: Tensor) -> Tensor:
        z = torch.zeros_like(t)
        if budget == 0:
            return z
        top = t.topk(min(budget, t.shape[-1]), dim=-1)
        return z.scatter_(-1, top.indices, (top.values > 0).to(t.dtype))

    return oracle


def _scale(t: Tensor) -> Tensor:
    """Scale of the inner products of the optimality test, per row: 1 + max|t|² + D."""
    return 1.0 + t.abs().amax(-1) ** 2 + t.shape[-1]


def _kkt_matrix(gram: Tensor, active: Tensor) -> Tensor:
    """[[Q, a], [aᵀ, 0]] with Q the Gram matrix A Aᵀ on active slots, identity on inactive ones."""
    n, C, _ = gram.shape
    a = active.to(gram.dtype)
    kkt = gram.new_zeros(n, C + 1, C + 1)
    kkt[:, :C, :C] = gram * (a[:, :, None] * a[:, None, :]) + torch.diag_embed(1 - a)
    kkt[:, :C, C] = a
    kkt[:, C, :C] = a
    return kkt


def _solve_equality_qp(gram: Tensor, scores: Tensor, active: Tensor) -> Tensor:
    """argmin_{p: Σp = 1, p = 0 off the active set} ½‖Aᵀp − t‖² (no sign constraint), [n, C].

    ``gram`` = A Aᵀ and ``scores`` = A t over the slots (only active slots are read).
    """
    rhs = torch.cat([scores * active, scores.new_ones(scores.shape[0], 1)], 1)
    solution = torch.linalg.solve(_kkt_matrix(gram, active), rhs)
    return solution[:, :-1] * active


@torch.no_grad()
def _active_set(
    t: Tensor, oracle: MapOracle, max_iter: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Run the active-set method on t [B, D]; returns configs, p, iterations and convergence.

    The state holds W slots per example (inactive slots are identity rows of the KKT system and
    are reused by later additions); W grows only when some example needs a new slot, so the
    systems stay about as wide as the largest active set rather than D + 2.
    """
    B, D = t.shape
    capacity = D + 2  # at most D + 1 affinely independent structures, plus the one being added
    configs = oracle(t)[:, None, :]
    # Gram matrix and scores ⟨a_z, t⟩ of the slots, updated when a structure enters a slot.
    gram = (configs * configs).sum(-1, keepdim=True)
    scores = (configs[:, 0] * t).sum(-1, keepdim=True)
    active = torch.ones(B, 1, dtype=torch.bool, device=t.device)
    p = t.new_ones(B, 1)
    iterations = torch.zeros(B, dtype=torch.long, device=t.device)
    converged = torch.zeros(B, dtype=torch.bool, device=t.device)
    rows = torch.arange(B, device=t.device)
    scale = _scale(t)
    quantum = _GAP_TOL * (1.0 + t.abs().amax(-1, keepdim=True))

    for _ in range(max_iter):
        live = ~converged
        if not bool(live.any()):
            break
        iterations += live.long()
        p_hat = _solve_equality_qp(gram, scores, active)

        # Infeasible rows: move towards p_hat until the first weight hits 0 and drop it.
        negative = active & (p_hat < -_WEIGHT_TOL)
        infeasible = live & negative.any(-1)
        ratio = torch.where(negative, p / (p - p_hat).clamp(min=1e-300), 2.0)
        step, blocking = ratio.min(-1)
        stepped = p + step[:, None] * (p_hat - p)
        stepped[rows, blocking] = 0.0
        dropped = active.clone()
        dropped[rows, blocking] = False

        # Feasible rows: accept p_hat, ask the oracle for the most violated structure.
        p_ok = p_hat.clamp(min=0.0)
        mu = (p_ok[..., None] * configs).sum(1)
        # Gaps that are equal in exact arithmetic (0 on coordinates μ already fits, λ on every
        # fractional coordinate under a budget) differ by round-off; snapping them to a grid
        # keeps the oracle from breaking those ties by noise, so the path and p are locally
        # smooth in t (a finite-difference step does not change the support).
        gap = torch.round((t - mu) / quantum) * quantum
        best = oracle(gap)
        violation = (best * gap).sum(-1) - (mu * gap).sum(-1)
        # ⟨a_z, best⟩ per slot; binary vectors are equal iff it matches both squared norms.
        products = (configs * best[:, None, :]).sum(-1)
        norms = torch.diagonal(gram, dim1=1, dim2=2)
        equal = (products == norms) & (products == (best * best).sum(-1, keepdim=True))
        already = (equal & active).any(-1)
        done = live & ~infeasible & ((violation <= _TOL * scale) | already)
        add = live & ~infeasible & ~done

        # A structure whose weight the feasible solve set to 0 leaves the set.
        kept = active & ~(p_ok <= 0)
        feasible = live & ~infeasible
        p = torch.where(infeasible[:, None], stepped, torch.where(feasible[:, None], p_ok, p))
        active = torch.where(
            infeasible[:, None], dropped, torch.where(feasible[:, None], kept, active)
        )
        if bool((add & active.all(-1)).any()):
            if configs.shape[1] == capacity:
                raise RuntimeError("SparseMAP active set exceeded D + 2 structures (degenerate)")
            configs = nn.functional.pad(configs, (0, 0, 0, 1))
            gram = nn.functional.pad(gram, (0, 1, 0, 1))
            scores = nn.functional.pad(scores, (0, 1))
            active = nn.functional.pad(active, (0, 1))
            p = nn.functional.pad(p, (0, 1))
        add_rows = add.nonzero(as_tuple=True)[0]
        free_slot = (~active[add_rows]).to(torch.int8).argmax(-1)
        active[add_rows, free_slot] = True
        configs[add_rows, free_slot] = best[add_rows]
        products = nn.functional.pad(products, (0, gram.shape[1] - products.shape[1]))[add_rows]
        products[torch.arange(add_rows.numel(), device=t.device), free_slot] = (
            best[add_rows] * best[add_rows]
        ).sum(-1)
        gram[add_rows, free_slot] = products
        gram[add_rows, :, free_slot] = products
        scores[add_rows, free_slot] = (best[add_rows] * t[add_rows]).sum(-1)
        p = p * active
        converged |= done

    return configs, p, iterations, converged


def _merge_ties(gap: Tensor, tol: Tensor) -> Tensor:
    """``gap`` [B, D] with the values of each row that chain together at spacings ≤ ``tol`` made
    equal (to their smallest), and set to 0 where the chain reaches 0."""
    B, D = gap.shape
    values, order = torch.cat([gap, gap.new_zeros(B, 1)], dim=-1).sort(dim=-1)
    start = torch.ones_like(values, dtype=torch.bool)
    start[:, 1:] = values.diff(dim=-1) > tol
    position = torch.arange(D + 1, device=gap.device).expand(B, -1)
    first = torch.where(start, position, 0).cummax(dim=-1).values  # where each chain starts
    zero_chain = first.gather(-1, (order == D).to(torch.int8).argmax(-1, keepdim=True))
    merged = torch.where(first == zero_chain, 0.0, values.gather(-1, first))
    return torch.empty_like(merged).scatter_(-1, order, merged)[:, :D]


def _project(basis: Tensor, v: Tensor) -> Tensor:
    """U Uᵀ v per row for an orthonormal basis U [B, D, K] (zero columns allowed) and v [B, D]."""
    return torch.einsum("bdk,bk->bd", basis, torch.einsum("bdk,bd->bk", basis, v))


@torch.no_grad()
def _face_directions(t: Tensor, configs: Tensor, p: Tensor, oracle: MapOracle) -> Tensor:
    """Orthonormal basis [B, D, K] (unused columns 0) of the directions of the face exposed by
    t − μ, which is the minimal face containing μ wherever the projection is differentiable.

    Starts from the support (its slots come first, slot 0 is in it), then probes: with d a new
    generic direction each round, projected off the current span, the oracle's maximisers of
    ⟨z, g ± ε d⟩ (g the gaps with ties merged, ε‖d‖_∞ a quarter of the tie tolerance, so only ties
    are broken) are vertices of the face with ±⟨z − z₀, d⟩ maximal; any positive one adds a
    direction. A row stops when neither does: the face has no extent along d, hence (d being
    generic) none off the span.

    Ties are merged coordinate-wise, which suits oracles whose maximiser depends only on the
    order of the scores and on their signs (independent bits, a budget).
    """
    B, _, D = configs.shape
    s0 = configs[:, 0]
    on = (p > 0)[:, 1:, None]
    q, r = torch.linalg.qr(((configs[:, 1:] - s0[:, None]) * on).transpose(1, 2))
    # Support slots come first and are affinely independent: padding columns alone give R_jj = 0.
    kept = torch.diagonal(r, dim1=1, dim2=2).abs() > _RANK_TOL
    basis = torch.cat([q * kept[:, None, :], q.new_zeros(B, D, D)], dim=-1)
    slot = torch.full((B,), q.shape[-1], dtype=torch.long, device=t.device)
    rows = torch.arange(B, device=t.device)
    tol = _TIE_TOL * _scale(t)[:, None]
    gap = _merge_ties(t - torch.einsum("bs,bsd->bd", p, configs), tol)
    generator = torch.Generator().manual_seed(_PROBE_SEED)
    open_rows = torch.ones(B, dtype=torch.bool, device=t.device)
    for _ in range(D):
        # A fresh direction each round: the vertices found along one direction absorb it, and
        # what is left of it off the span shrinks geometrically.
        probe = torch.randn(D, generator=generator, dtype=t.dtype).to(t.device).expand(B, D)
        # The columns in use and the two this round can fill (a view: it sees them filled).
        used = basis[..., : int(slot.max()) + 2]
        d = probe - _project(used, probe)
        norm = d.norm(dim=-1, keepdim=True)
        open_rows &= norm[:, 0] > _RANK_TOL  # the span is the whole space
        if not bool(open_rows.any()):
            break
        d = d / norm.clamp(min=_RANK_TOL)
        eps = tol / (4 * d.abs().amax(-1, keepdim=True))  # moves no gap past another or 0
        found = torch.zeros_like(open_rows)
        for sign in (1.0, -1.0):
            w = oracle(gap + sign * eps * d) - s0
            extent = sign * (w * d).sum(-1)
            for _ in range(2):  # Gram–Schmidt twice is orthogonal to working precision
                w = w - _project(used, w)
            length = w.norm(dim=-1)
            new = open_rows & (extent > _RANK_TOL) & (length > _RANK_TOL)
            basis[rows[new], :, slot[new]] = w[new] / length[new, None]
            slot += new.long()
            found |= new
        open_rows &= found
    return basis


class SparseMAPFunction(torch.autograd.Function):
    """p = SparseMAP(t) on given structures and μ = Σ p(z) z; see the module docstring for the
    two backwards (p: the KKT system on the support; μ: the projector onto the face's directions).

    Under autocast t is cast to float32 and autocast is off inside (``core.amp``): the solver
    works in float64, and p and μ, which weight the losses of the support, come back in float32
    rather than bf16.
    """

    @staticmethod
    @autocast_off_forward(cast_inputs=torch.float32)
    def forward(
        ctx, t: Tensor, configs: Tensor, p: Tensor, oracle: MapOracle
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        ctx.oracle, ctx.dtype = oracle, t.dtype
        ctx.save_for_backward(t.detach().to(p.dtype), configs, p)
        mu = torch.einsum("bs,bsd->bd", p, configs)
        return p.to(t.dtype), mu.to(t.dtype)

    @staticmethod
    @autocast_off_backward
    def backward(
        ctx, grad_p: Tensor | None, grad_mu: Tensor | None
    ) -> tuple[Tensor | None, None, None, None]:
        t, configs, p = ctx.saved_tensors
        grad_t = torch.zeros_like(t)
        if grad_p is not None:
            support = p > 0
            kkt = _kkt_matrix(configs @ configs.transpose(1, 2), support)
            rhs = torch.cat([grad_p.to(p.dtype) * support, p.new_zeros(p.shape[0], 1)], 1)
            v = torch.linalg.solve(kkt, rhs)[:, :-1] * support
            grad_t += torch.einsum("bc,bcd->bd", v, configs)
        if grad_mu is not None:
            basis = _face_directions(t, configs, p, ctx.oracle)
            grad_t += _project(basis, grad_mu.to(p.dtype))
        return grad_t.to(ctx.dtype), None, None, None


def sparsemap(
    t: Tensor, oracle: MapOracle = bernoulli_map, max_iter: int = 300
) -> BitVectorDistribution:
    r"""SparseMAP over bit vectors z ∈ {0,1}^D scored by ⟨t, z⟩; t [B, D].

    Returns a :class:`BitVectorDistribution` whose slots hold the support (at most D + 1
    configurations, padded to the largest support of the batch), probabilities differentiable in
    t, its ``marginals`` μ (the projection of t onto the polytope of ``oracle``, differentiable
    with the projection's Jacobian, ties included: see the module docstring) and the
    active-set ``iterations`` per example. ``max_iter`` caps the iterations (the authors used
    300); rows that do not converge raise an error naming the cap.
    """
    if t.dim() != 2:
        raise ValueError(f"scores t must be [batch, D], got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError("SparseMAP scores t contain NaN or Inf")
    t64 = t.detach().to(_SOLVE_DTYPE)
    configs, p, iterations, converged = _active_set(t64, oracle, max_iter)
    if not bool(converged.all()):
        raise RuntimeError(
            f"SparseMAP did not converge within max_iter={max_iter} for "
            f"{int((~converged).sum())} of {t.shape[0]} examples"
        )
    p = torch.where(p > _TOL, p, 0.0)
    p = p / p.sum(-1, keepdim=True)
    # Compact: support first, then trim the slots no example uses.
    order = (p > 0).to(torch.int8).argsort(dim=-1, descending=True, stable=True)
    p = p.gather(1, order)
    configs = configs.gather(1, order[..., None].expand_as(configs))
    width = max(int((p > 0).sum(-1).max()), 1)
    p, configs = p[:, :width].contiguous(), configs[:, :width].contiguous()
    probs, mu = SparseMAPFunction.apply(t, configs, p, oracle)
    return BitVectorDistribution(configs.to(t.dtype), probs, iterations=iterations, projection=mu)
