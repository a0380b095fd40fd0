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

Backward (implicit differentiation of the KKT system on the support S, where p > 0):
solve [[Q, 1], [1ᵀ, 0]] [v; ν] = [∂L/∂p_S; 0], then ∂L/∂t = A_S v.

MAP oracles are callables t [B, D] -> best structure [B, D]: :func:`bernoulli_map` (independent
bits: z_i = [t_i > 0]) and :func:`budget_map` (at most B bits on).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from components.core.marginalize import BitVectorDistribution

MapOracle = Callable[[Tensor], Tensor]

# Solves run in float64: the KKT systems are small and the stopping test compares inner products.
_SOLVE_DTYPE = torch.float64
# Relative tolerance of the optimality test and of the feasibility of the QP solution.
_TOL = 1e-10
# Grid (relative to max |t|) the gaps t − μ are snapped to before the oracle sees them.
_GAP_TOL = 1e-9


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
    scale = 1.0 + t.abs().amax(-1) ** 2 + D
    quantum = _GAP_TOL * (1.0 + t.abs().amax(-1, keepdim=True))

    for _ in range(max_iter):
        live = ~converged
        if not bool(live.any()):
            break
        iterations += live.long()
        p_hat = _solve_equality_qp(gram, scores, active)

        # Infeasible rows: move towards p_hat until the first weight hits 0 and drop it.
        negative = active & (p_hat < -_TOL)
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


class SparseMAPFunction(torch.autograd.Function):
    """p = SparseMAP(t) on given structures; backward through the KKT system on the support."""

    @staticmethod
    def forward(ctx, t: Tensor, configs: Tensor, p: Tensor) -> Tensor:
        ctx.save_for_backward(configs, p)
        return p.to(t.dtype)

    @staticmethod
    def backward(ctx, grad_p: Tensor) -> tuple[Tensor, None, None]:
        configs, p = ctx.saved_tensors
        support = p > 0
        kkt = _kkt_matrix(configs @ configs.transpose(1, 2), support)
        rhs = torch.cat([grad_p.to(p.dtype) * support, p.new_zeros(p.shape[0], 1)], 1)
        v = torch.linalg.solve(kkt, rhs)[:, :-1] * support
        grad_t = torch.einsum("bc,bcd->bd", v, configs)
        return grad_t.to(grad_p.dtype), None, None


def sparsemap(
    t: Tensor, oracle: MapOracle = bernoulli_map, max_iter: int = 300
) -> BitVectorDistribution:
    r"""SparseMAP over bit vectors z ∈ {0,1}^D scored by ⟨t, z⟩; t [B, D].

    Returns a :class:`BitVectorDistribution` whose slots hold the support (at most D + 1
    configurations, padded to the largest support of the batch), probabilities differentiable in
    t, its ``marginals`` μ (the projection of t onto the polytope of ``oracle``) and the
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
    probs = SparseMAPFunction.apply(t, configs, p)
    return BitVectorDistribution(configs.to(t.dtype), probs, iterations=iterations)
