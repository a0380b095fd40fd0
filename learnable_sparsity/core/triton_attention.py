r"""Triton kernels of fused α-entmax attention with a learned α per head (``fused_attention``).

Per batch·head b with β = α_b − 1 and scores s_ij = scale·⟨q_i, k_j⟩ over the visible keys
(j < key length, and j ≤ i when causal):

    p_ij = [1 + β(s_ij − m_i) − u_i]_+^{1/β} / Σ_j(…),    o_i = Σ_j p_ij v_j,

m_i the row max and u_i the root of Σ_j p_ij = 1 (``triton_kernels._entmax_solve``'s
safeguarded Newton, each step one pass over the keys). The scores are never stored: every pass
recomputes them tile by tile from Q and K, as FlashAttention does. ``forward`` first records each
tile's largest score; a tile whose largest score is at most min_i of the rows' thresholds
m_i + (u_i − 1)/β has no nonzero p and is skipped by every later pass (the root-finding passes
use the bracket's lower end, a lower threshold, so they skip less).

Backward, with p̂ the normalised row, t = p̂^{2−α} on the support and dP_ij = ⟨dO_i, v_j⟩:
ds_ij = t_ij (dP_ij − c_i), c_i = Σ_j t_ij dP_ij / Σ_j t_ij; dQ = scale·dS K, dK = scale·dSᵀQ,
dV = P̂ᵀdO. ``backward_rows`` computes c_i and the α-gradient of each row (the row sums that
``normalizers._alpha_grad`` combines, in its cancellation-free form below β = 0.5);
``backward_dq`` (over query tiles) and ``backward_dkdv`` (over key tiles) the rest.
"""

from __future__ import annotations

import triton
import triton.language as tl

from learnable_sparsity.core.triton_kernels import STABLE_ALPHA_GRAD_BELOW, _expm1, _log1p, _phi

# Cap on the root-finding passes over the keys (Newton converges in a handful; the bracket
# halves otherwise). A row stops at |Σp − 1| ≤ ROOT_TOLERANCE, the float32 row tolerance of
# ``normalizers._tolerance`` for rows of up to 2^15 keys.
ROOT_MAX_PASSES: tl.constexpr = tl.constexpr(40)
ROOT_TOLERANCE: tl.constexpr = tl.constexpr(4 * 2.0**-23 * 16)
EPS32: tl.constexpr = tl.constexpr(2.0**-23)


@triton.jit
def _scores(
    q, k_ptrs, offs_m, offs_n, key_length, masked, scale, CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """The [BM, BN] tile of scale·QKᵀ, −inf where the key is not visible; ``masked`` (a scalar)
    is False for a tile every row sees whole (:func:`_unmasked_keys`), which skips the mask:
    causal attention masks its diagonal tiles only."""
    k = tl.load(k_ptrs, mask=(offs_n < key_length)[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    if masked:
        visible = offs_n[None, :] < key_length
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None])
        s = tl.where(visible, s, float("-inf"))
    return s


@triton.jit
def _unmasked_keys(start_m, key_length, BM: tl.constexpr, CAUSAL: tl.constexpr):
    """The keys every row of query tile ``start_m`` sees (causal: row i sees keys j ≤ i): a key
    tile that ends at or before it needs no mask."""
    if CAUSAL:
        return tl.minimum(key_length, start_m * BM + 1)
    return key_length


@triton.jit
def _program(CAUSAL: tl.constexpr):
    """(batch·head, query tile, query tiles) of this program, on the grid (query tiles,
    batch·head). Causal query tiles run from the last (which sees every key) to the first, so the
    longest start first and the short ones fill the SMs at the end (launched first to last, the
    longest ran last, alone). The grid keeps the tiles on its first axis: (batch·head, tiles)
    would start every head's longest tile first but made the causal forward spill (203 → 255
    registers and 72 bytes of spills, sm_90a)."""
    tile = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    tiles = tl.num_programs(0)
    if CAUSAL:
        tile = tiles - 1 - tile
    return bh, tile, tiles


@triton.jit
def _entmax_tile(s, m, u, beta):
    """(t, p) = ((1 + gap)^{1/β − 1}, (1 + gap)^{1/β}) with gap = max(β(s − m) − u, −1)."""
    gap = tl.maximum(beta * (s - m[:, None]) - u[:, None], -1.0)
    on = gap > -1.0
    t = tl.where(on, tl.exp(_log1p(tl.where(on, gap, 0.0)) * (1.0 / beta - 1.0)), 0.0)
    return t, t + t * gap


@triton.jit
def forward(
    q_ptr, k_ptr, v_ptr, o_ptr, alpha_ptr, lengths_ptr, stats_ptr, tile_max_ptr,
    q_len, k_len, scale, n_tiles_n,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_LENGTHS: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """O and the row statistics (m, u, Σp) of one query tile of one batch·head."""
    bh, start_m, n_tiles_m = _program(CAUSAL)
    offs_m = start_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + bh * q_len * D + offs_m[:, None] * D + offs_d[None, :],
                mask=(offs_m < q_len)[:, None], other=0.0)  # fmt: skip
    k_base = k_ptr + bh * k_len * D
    v_base = v_ptr + bh * k_len * D
    key_length = k_len
    if HAS_LENGTHS:
        key_length = tl.load(lengths_ptr + bh)
    beta = tl.load(alpha_ptr + bh).to(tl.float32) - 1.0
    end_n = key_length
    if CAUSAL:
        end_n = tl.minimum(key_length, (start_m + 1) * BM)
    full = _unmasked_keys(start_m, key_length, BM, CAUSAL)
    tile_row = tile_max_ptr + (bh * n_tiles_m + start_m) * n_tiles_n

    m = tl.full([BM], float("-inf"), tl.float32)
    n = tl.zeros([BM], tl.float32)
    for start_n in tl.range(0, end_n, BN):
        cols = start_n + offs_n
        s = _scores(q, k_base + cols[:, None] * D + offs_d[None, :], offs_m, cols, key_length,
                    start_n + BN > full, scale, CAUSAL, PRECISION)  # fmt: skip
        m = tl.maximum(m, tl.max(s, axis=1))
        n += tl.sum((s > float("-inf")).to(tl.float32), axis=1)
        tl.store(tile_row + start_n // BN, tl.max(s))
    m_safe = tl.where(m > float("-inf"), m, 0.0)

    lo = tl.zeros([BM], tl.float32)
    hi = -_expm1(-beta * tl.log(tl.maximum(n, 1.0)))
    u = tl.zeros([BM], tl.float32)
    prev_err = tl.full([BM], float("inf"), tl.float32)
    done = n < 1.0
    passes = 0
    while (tl.min(done.to(tl.int32)) == 0) & (passes < ROOT_MAX_PASSES):
        floor = tl.min(tl.where(done, float("inf"), m_safe + (lo - 1.0) / beta))
        mass = tl.zeros([BM], tl.float32)
        t_sum = tl.zeros([BM], tl.float32)
        for start_n in tl.range(0, end_n, BN):
            if tl.load(tile_row + start_n // BN) > floor:
                cols = start_n + offs_n
                s = _scores(q, k_base + cols[:, None] * D + offs_d[None, :], offs_m, cols,
                            key_length, start_n + BN > full, scale, CAUSAL, PRECISION)  # fmt: skip
                t, p = _entmax_tile(s, m_safe, u, beta)
                mass += tl.sum(p, axis=1)
                t_sum += tl.sum(t, axis=1)
        err = mass - 1.0
        now_done = done | (tl.abs(err) <= ROOT_TOLERANCE) | (mass == 0.0)
        lo = tl.where(now_done | (err <= 0), lo, u)
        hi = tl.where(now_done | (err >= 0), hi, u)
        # hi first: Triton 3.7's interpreter cannot compare with `constexpr * tensor` (the
        # kernels' `_entmax_solve` says why).
        now_done = now_done | (hi - lo <= hi * (2.0 * EPS32))
        log_mass = tl.log(mass)
        step = _expm1(beta * log_mass) * tl.exp((1.0 - beta) * log_mass)
        newton = u + step / t_sum
        # (A scalar condition as a factor: the interpreter cannot broadcast a scalar bool.)
        slow = tl.abs(err) > 0.5 * prev_err * tl.where(beta > 1.0, 1.0, float("inf"))
        bisect = (newton <= lo) | (newton >= hi) | slow
        u = tl.where(now_done, u, tl.where(bisect, 0.5 * (lo + hi), newton))
        prev_err = tl.abs(err)
        done = now_done
        passes += 1

    floor = tl.min(m_safe + (u - 1.0) / beta)
    acc = tl.zeros([BM, D], tl.float32)
    mass = tl.zeros([BM], tl.float32)
    for start_n in tl.range(0, end_n, BN):
        if tl.load(tile_row + start_n // BN) > floor:
            cols = start_n + offs_n
            s = _scores(q, k_base + cols[:, None] * D + offs_d[None, :], offs_m, cols,
                        key_length, start_n + BN > full, scale, CAUSAL, PRECISION)  # fmt: skip
            _, p = _entmax_tile(s, m_safe, u, beta)
            v = tl.load(v_base + cols[:, None] * D + offs_d[None, :],
                        mask=(cols < key_length)[:, None], other=0.0)  # fmt: skip
            acc += tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            mass += tl.sum(p, axis=1)
    o = acc / tl.where(mass > 0, mass, 1.0)[:, None]
    rows = offs_m < q_len
    tl.store(o_ptr + bh * q_len * D + offs_m[:, None] * D + offs_d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=rows[:, None])  # fmt: skip
    stats = stats_ptr + bh * 3 * q_len + offs_m
    tl.store(stats, m_safe, mask=rows)
    tl.store(stats + q_len, u, mask=rows)
    tl.store(stats + 2 * q_len, mass, mask=rows)


@triton.jit
def _normalised_tile(s, m, u, mass, beta):
    """(t̂, p̂, log p̂) of a score tile: p̂ = p/Σp, t̂ = p̂^{2−α} on the support."""
    _, p = _entmax_tile(s, m, u, beta)
    p = p / tl.where(mass > 0, mass, 1.0)[:, None]
    on = p > 0
    log_p = tl.log(tl.where(on, p, 1.0))
    t = tl.where(on, tl.exp((1.0 - beta) * log_p), 0.0)
    return t, p, log_p


@triton.jit
def _query_tile(
    q_ptr, do_ptr, alpha_ptr, lengths_ptr, stats_ptr, tile_max_ptr, q_len, k_len, n_tiles_n,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_LENGTHS: tl.constexpr,
):  # fmt: skip
    """What both backward passes over a query tile's keys start from: the program's (batch ×
    head) index, the offsets, the tile's Q and dO, the forward's per-row (m, u, Σp), the visible
    keys, β = α − 1, where the key loop ends (causal: the diagonal tile), the keys every row
    sees (:func:`_unmasked_keys`) and the score below which no row of the tile has support (a
    key tile whose recorded maximum is at most this is skipped); ``tile_row`` points at the recorded
    maxima of the tile's key tiles."""
    bh, start_m, n_tiles_m = _program(CAUSAL)
    offs_m = start_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    rows = offs_m < q_len
    tile = offs_m[:, None] * D + offs_d[None, :]
    q = tl.load(q_ptr + bh * q_len * D + tile, mask=rows[:, None], other=0.0)
    do = tl.load(do_ptr + bh * q_len * D + tile, mask=rows[:, None], other=0.0)
    stats = stats_ptr + bh * 3 * q_len + offs_m
    m = tl.load(stats, mask=rows, other=0.0)
    u = tl.load(stats + q_len, mask=rows, other=0.0)
    mass = tl.load(stats + 2 * q_len, mask=rows, other=0.0)
    key_length = k_len
    if HAS_LENGTHS:
        key_length = tl.load(lengths_ptr + bh)
    beta = tl.load(alpha_ptr + bh).to(tl.float32) - 1.0
    end_n = key_length
    if CAUSAL:
        end_n = tl.minimum(key_length, (start_m + 1) * BM)
    full = _unmasked_keys(start_m, key_length, BM, CAUSAL)
    tile_row = tile_max_ptr + (bh * n_tiles_m + start_m) * n_tiles_n
    floor = tl.min(tl.where(rows, m + (u - 1.0) / beta, float("inf")))
    return (bh, offs_m, offs_n, offs_d, rows, tile, q, do, m, u, mass, key_length, beta, end_n,
            full, tile_row, floor)  # fmt: skip


@triton.jit
def backward_rows(
    q_ptr, k_ptr, v_ptr, do_ptr, alpha_ptr, lengths_ptr, stats_ptr, tile_max_ptr, rows_ptr,
    q_len, k_len, scale, n_tiles_n,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_LENGTHS: tl.constexpr, ALPHA_GRAD: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Per row: c_i = Σ t̂ dP / Σ t̂ and Σ_j dP_ij ∂p̂_ij/∂α (``normalizers._alpha_grad``)."""
    (bh, offs_m, offs_n, offs_d, rows, _, q, do, m, u, mass, key_length, beta, end_n, _,
     tile_row, floor) = (
        _query_tile(
            q_ptr, do_ptr, alpha_ptr, lengths_ptr, stats_ptr, tile_max_ptr, q_len, k_len,
            n_tiles_n, D, BM, BN, CAUSAL, HAS_LENGTHS,
        )
    )  # fmt: skip
    t_sum = tl.zeros([BM], tl.float32)
    t_dp = tl.zeros([BM], tl.float32)
    gp_sum = tl.zeros([BM], tl.float32)
    gp_log = tl.zeros([BM], tl.float32)
    neg_entropy = tl.zeros([BM], tl.float32)
    p_rho = tl.zeros([BM], tl.float32)
    gp_rho = tl.zeros([BM], tl.float32)
    for start_n in tl.range(0, end_n, BN):
        if tl.load(tile_row + start_n // BN) > floor:
            cols = start_n + offs_n
            keys = cols[:, None] * D + offs_d[None, :]
            # Every tile masked: skipping the mask off the diagonal raised this kernel's
            # registers from 179 to 255 (sm_90a, causal), where the others lose some.
            s = _scores(q, k_ptr + bh * k_len * D + keys, offs_m, cols, key_length, True, scale,
                        CAUSAL, PRECISION)  # fmt: skip
            t, p, log_p = _normalised_tile(s, m, u, mass, beta)
            v = tl.load(v_ptr + bh * k_len * D + keys, mask=(cols < key_length)[:, None],
                        other=0.0)  # fmt: skip
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION).to(tl.float32)
            t_sum += tl.sum(t, axis=1)
            t_dp += tl.sum(t * dp, axis=1)
            if ALPHA_GRAD:
                gp = dp * p
                gp_sum += tl.sum(gp, axis=1)
                gp_log += tl.sum(gp * log_p, axis=1)
                neg_entropy += tl.sum(p * log_p, axis=1)
                rho = log_p * log_p * _phi(-beta * log_p)
                p_rho += tl.sum(p * rho, axis=1)
                gp_rho += tl.sum(gp * rho, axis=1)
    t_sum = tl.maximum(t_sum, 1e-30)
    c = t_dp / t_sum
    out = rows_ptr + bh * 2 * q_len + offs_m
    tl.store(out, c, mask=rows)
    if ALPHA_GRAD:
        if beta < STABLE_ALPHA_GRAD_BELOW:
            mixed = neg_entropy * gp_rho - p_rho * gp_log
            grad_alpha = (gp_sum * p_rho - gp_rho + beta * mixed) / t_sum
        else:
            grad_alpha = (gp_sum - c) / (beta * beta) - (gp_log - c * neg_entropy) / beta
        tl.store(out + q_len, grad_alpha, mask=rows)


@triton.jit
def backward_dq(
    q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, alpha_ptr, lengths_ptr, stats_ptr, tile_max_ptr,
    rows_ptr, q_len, k_len, scale, n_tiles_n,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_LENGTHS: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dQ of one query tile: scale·Σ_j ds_ij k_j."""
    (bh, offs_m, offs_n, offs_d, rows, tile, q, do, m, u, mass, key_length, beta, end_n, full,
     tile_row, floor) = (
        _query_tile(
            q_ptr, do_ptr, alpha_ptr, lengths_ptr, stats_ptr, tile_max_ptr, q_len, k_len,
            n_tiles_n, D, BM, BN, CAUSAL, HAS_LENGTHS,
        )
    )  # fmt: skip
    c = tl.load(rows_ptr + bh * 2 * q_len + offs_m, mask=rows, other=0.0)
    dq = tl.zeros([BM, D], tl.float32)
    for start_n in tl.range(0, end_n, BN):
        if tl.load(tile_row + start_n // BN) > floor:
            cols = start_n + offs_n
            keys = cols[:, None] * D + offs_d[None, :]
            s = _scores(q, k_ptr + bh * k_len * D + keys, offs_m, cols,
                        key_length, start_n + BN > full, scale, CAUSAL, PRECISION)  # fmt: skip
            t, _, _ = _normalised_tile(s, m, u, mass, beta)
            visible = (cols < key_length)[:, None]
            v = tl.load(v_ptr + bh * k_len * D + keys, mask=visible, other=0.0)
            k = tl.load(k_ptr + bh * k_len * D + keys, mask=visible, other=0.0)
            ds = t * (
                tl.dot(do, tl.trans(v), input_precision=PRECISION).to(tl.float32) - c[:, None]
            )
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(dq_ptr + bh * q_len * D + tile, (dq * scale).to(dq_ptr.dtype.element_ty),
             mask=rows[:, None])  # fmt: skip


@triton.jit
def backward_dkdv(
    q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, alpha_ptr, lengths_ptr, stats_ptr, tile_max_ptr,
    rows_ptr, q_len, k_len, scale, n_tiles_m, n_tiles_n,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_LENGTHS: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dK and dV of one key tile: scale·Σ_i ds_ij q_i and Σ_i p̂_ij dO_i (causal key tiles run
    heaviest first already: the first is seen by every query)."""
    start_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_n = start_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    key_length = k_len
    if HAS_LENGTHS:
        key_length = tl.load(lengths_ptr + bh)
    visible = (offs_n < key_length)[:, None]
    keys = offs_n[:, None] * D + offs_d[None, :]
    k = tl.load(k_ptr + bh * k_len * D + keys, mask=visible, other=0.0)
    v = tl.load(v_ptr + bh * k_len * D + keys, mask=visible, other=0.0)
    beta = tl.load(alpha_ptr + bh).to(tl.float32) - 1.0
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    first_m = 0
    if CAUSAL:
        first_m = (start_n * BN) // BM
    for tile_m in tl.range(first_m, n_tiles_m):
        offs_m = tile_m * BM + tl.arange(0, BM)
        rows = offs_m < q_len
        stats = stats_ptr + bh * 3 * q_len + offs_m
        m = tl.load(stats, mask=rows, other=0.0)
        u = tl.load(stats + q_len, mask=rows, other=0.0)
        floor = tl.min(tl.where(rows, m + (u - 1.0) / beta, float("inf")))
        tile_max = tl.load(tile_max_ptr + (bh * n_tiles_m + tile_m) * n_tiles_n + start_n)
        if tile_max > floor:
            mass = tl.load(stats + 2 * q_len, mask=rows, other=0.0)
            c = tl.load(rows_ptr + bh * 2 * q_len + offs_m, mask=rows, other=0.0)
            tile = offs_m[:, None] * D + offs_d[None, :]
            q = tl.load(q_ptr + bh * q_len * D + tile, mask=rows[:, None], other=0.0)
            do = tl.load(do_ptr + bh * q_len * D + tile, mask=rows[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            seen = (offs_n[None, :] < key_length) & rows[:, None]
            if CAUSAL:
                seen = seen & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(seen, s, float("-inf"))
            t, p, _ = _normalised_tile(s, m, u, mass, beta)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
            ds = t * (
                tl.dot(do, tl.trans(v), input_precision=PRECISION).to(tl.float32) - c[:, None]
            )
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    tl.store(dk_ptr + bh * k_len * D + keys, (dk * scale).to(dk_ptr.dtype.element_ty),
             mask=offs_n[:, None] < k_len)  # fmt: skip
    tl.store(dv_ptr + bh * k_len * D + keys, dv.to(dv_ptr.dtype.element_ty),
             mask=offs_n[:, None] < k_len)  # fmt: skip
