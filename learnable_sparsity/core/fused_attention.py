r"""α-entmax attention with a learned α per head, fused in Triton where it can be.

    entmax_attention(Q, K, V, α) = entmax_α(scale · Q Kᵀ; mask) V,    per batch and head,

differentiable in Q, K, V and α (one α per head, or per batch and head). The fused kernels
(``triton_attention``) never store the L_q × L_k scores: they recompute them tile by tile and skip
the tiles where every probability is zero, for the forward pass (root finding and output) and for
the backward pass. Elsewhere — a CPU tensor, a head size the kernels do not take, Triton absent
or :func:`disabled` — the same function is computed from the scores by ``normalizers.entmax``,
which is also the oracle the tests hold the kernels to.

Masks: ``causal`` (query i sees keys j ≤ i; self-attention, L_q = L_k) and ``key_lengths``
(batch b sees its first ``key_lengths[b]`` keys: right-padded batches). A query with no visible
key gets a zero output and zero gradients, as in ``normalizers``. α must lie in (1, 2]: the
attention's learned α does (``attention.ALPHA_MIN``, ``ALPHA_MAX``); it is not checked on the
GPU, which would cost a device synchronisation per call.
"""

from __future__ import annotations

import math
import os
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from learnable_sparsity.core import fused_triton
from learnable_sparsity.core.amp import autocast_off_backward, autocast_off_forward
from learnable_sparsity.core.normalizers import entmax
from learnable_sparsity.core.switch import Switch

# Head sizes the kernels take (tl.dot needs a power of two ≥ 16).
HEAD_SIZES = (16, 32, 64, 128)
_enabled = Switch(os.environ.get("LEARNABLE_SPARSITY_TRITON", "1") != "0")


def disabled() -> AbstractContextManager[None]:
    """Compute from the materialised scores inside the block (comparisons; not thread-safe)."""
    return _enabled.turned(False)


def usable(q: Tensor) -> bool:
    """Whether a call with queries ``q`` runs the fused kernels (``fused_triton.usable``'s device
    rule, a head size of ``HEAD_SIZES``; on a GPU, float32 only at the head sizes of
    ``GPU_LAUNCH``: at 128 its launches spilled registers)."""
    device = q.is_cuda or (bool(fused_triton._on_cpu) and q.device.type == "cpu")
    spills = q.is_cuda and q.dtype == torch.float32 and q.shape[-1] not in GPU_LAUNCH[q.dtype]
    return (
        bool(_enabled)
        and fused_triton.available()
        and device
        and q.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and q.shape[-1] in HEAD_SIZES
        and not spills
    )


# The kernels' launch on a GPU, (query tile BM, key tile BN, warps), by Q/K/V dtype and head
# size, from what compiles for sm_90a (ptxas: benchmarks/gpu/proxy_attention.py) with the fewest
# register spills. 16-bit inputs: 64 × 64 tiles on 4 warps. float32 tiles hold twice the bytes
# and its exact ("ieee") dots run as FMA loops in registers: at head size 64 that launch used 32
# registers with 31 KB of spill stores per thread (forward), 32 × 32 tiles on 8 warps 168-239
# registers and no spill in any of the four kernels (at head size 32: 76 bytes in the forward,
# where 64 × 64 on 4 warps spilled 2.6 KB; at 16: 8 bytes in one kernel). At head size 128 every
# float32 launch tried spilled (32 × 32 on 8 warps up to 1.5 KB, 16 × 16 on 4 warps 1.1 KB):
# float32 there is not fused (``usable``).
GPU_LAUNCH = {torch.float32: {16: (32, 32, 8), 32: (32, 32, 8), 64: (32, 32, 8)}}
WIDE_LAUNCH = (64, 64, 4)
# In Triton's interpreter (on the CPU), whose time grows with the tiles.
INTERPRETER_TILES = (16, 16)


def launch(dtype: torch.dtype, head_size: int, *, gpu: bool = True) -> dict[str, object]:
    """The kernels' tile sizes ``BM``, ``BN``, warps (``num_warps``, on a GPU only) and dot
    precision (``PRECISION``: exact for float32 inputs, TF32-class for 16-bit ones) for Q/K/V
    of ``dtype`` with ``head_size`` (``GPU_LAUNCH``)."""
    precision = "ieee" if dtype == torch.float32 else "tf32"
    if not gpu:
        bm, bn = INTERPRETER_TILES
        return {"BM": bm, "BN": bn, "PRECISION": precision}
    bm, bn, warps = GPU_LAUNCH.get(dtype, {}).get(head_size, WIDE_LAUNCH)
    return {"BM": bm, "BN": bn, "num_warps": warps, "PRECISION": precision}


class _FusedEntmaxAttention(torch.autograd.Function):
    # Under autocast (off inside, core.amp): q, k, v in their dtype (the kernels load bf16 and
    # accumulate in float32), α float32 (entmax_attention makes it so), so is α's gradient.
    @staticmethod
    @autocast_off_forward(cast_inputs=None)
    def forward(ctx, q, k, v, alpha, lengths, causal, scale):
        kernels = _kernels()
        bh, q_len, d = q.shape
        k_len = k.shape[1]
        options = launch(q.dtype, d, gpu=q.is_cuda)
        tiles_m, tiles_n = math.ceil(q_len / options["BM"]), math.ceil(k_len / options["BN"])
        o = torch.empty_like(q)
        stats = torch.empty(bh, 3, q_len, device=q.device, dtype=torch.float32)
        tile_max = torch.full((bh, tiles_m, tiles_n), -math.inf, device=q.device)
        kernels.forward[(tiles_m, bh)](
            q, k, v, o, alpha, lengths if lengths is not None else alpha, stats, tile_max,
            q_len, k_len, scale, tiles_n, D=d, CAUSAL=causal, HAS_LENGTHS=lengths is not None,
            **options,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, alpha, lengths, stats, tile_max)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    @autocast_off_backward
    def backward(ctx, do):
        q, k, v, alpha, lengths, stats, tile_max = ctx.saved_tensors
        kernels = _kernels()
        do = do.contiguous()
        bh, q_len, d = q.shape
        k_len = k.shape[1]
        tiles_m, tiles_n = tile_max.shape[1:]
        common = {"D": d, "CAUSAL": ctx.causal, "HAS_LENGTHS": lengths is not None,
                  **launch(q.dtype, d, gpu=q.is_cuda)}  # fmt: skip
        lengths_arg = lengths if lengths is not None else alpha
        rows = torch.empty(bh, 2, q_len, device=q.device, dtype=torch.float32)
        kernels.backward_rows[(tiles_m, bh)](
            q, k, v, do, alpha, lengths_arg, stats, tile_max, rows, q_len, k_len, ctx.scale,
            tiles_n, ALPHA_GRAD=ctx.needs_input_grad[3], **common,
        )  # fmt: skip
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        kernels.backward_dq[(tiles_m, bh)](
            q, k, v, do, dq, alpha, lengths_arg, stats, tile_max, rows, q_len, k_len, ctx.scale,
            tiles_n, **common,
        )  # fmt: skip
        kernels.backward_dkdv[(tiles_n, bh)](
            q, k, v, do, dk, dv, alpha, lengths_arg, stats, tile_max, rows, q_len, k_len,
            ctx.scale, tiles_m, tiles_n, **common,
        )  # fmt: skip
        grad_alpha = rows[:, 1].sum(dim=-1) if ctx.needs_input_grad[3] else None
        return dq, dk, dv, grad_alpha, None, None, None


def _kernels():
    from learnable_sparsity.core import triton_attention

    return triton_attention


def _reference(q, k, v, alpha, causal, key_lengths, scale) -> Tensor:
    """entmax_α(scale·QKᵀ; mask) V from the materialised scores (``normalizers.entmax``)."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    q_len, k_len = scores.shape[-2:]
    mask = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device)
    if causal:
        mask = torch.tril(mask)
    if key_lengths is not None:
        keys = torch.arange(k_len, device=q.device)
        mask = mask & (keys < key_lengths.to(q.device)[:, None, None, None])
    p = entmax(scores, alpha[..., None, None], dim=-1, mask=mask)
    return torch.matmul(p.to(v.dtype), v)


def entmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: Tensor,
    *,
    causal: bool = False,
    key_lengths: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """entmax_α(scale · Q Kᵀ; mask) V for q [B, H, L_q, D], k and v [B, H, L_k, D].

    ``alpha``: one α per head, broadcastable to [B, H] (e.g. the [H] learned α of a layer);
    ``key_lengths``: [B] visible keys per batch (right padding); ``scale`` defaults to 1/√D.
    """
    b, h, q_len, d = q.shape
    if k.shape != v.shape or k.shape[:2] != (b, h) or k.shape[-1] != d:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree")
    if causal and k.shape[2] != q_len:
        raise ValueError(f"causal attention needs L_q = L_k, got {q_len} and {k.shape[2]}")
    if key_lengths is not None and (
        key_lengths.shape != (b,) or key_lengths.is_floating_point() or (key_lengths < 0).any()
    ):
        raise ValueError(
            f"key_lengths must be [{b}] non-negative integers (one per batch), got "
            f"{key_lengths.dtype} {tuple(key_lengths.shape)}"
        )
    scale = 1 / math.sqrt(d) if scale is None else scale
    alpha = alpha.expand(b, h)
    if not usable(q):
        return _reference(q, k, v, alpha, causal, key_lengths, scale)
    if key_lengths is not None:
        key_lengths = key_lengths.to(device=q.device, dtype=torch.int32)
        key_lengths = key_lengths.clamp(max=k.shape[2])[:, None].expand(b, h).reshape(-1)
        key_lengths = key_lengths.contiguous()
    flat = [t.reshape(b * h, t.shape[2], d).contiguous() for t in (q, k, v)]
    alpha_rows = alpha.reshape(-1).float().contiguous()
    o = _FusedEntmaxAttention.apply(*flat, alpha_rows, key_lengths, causal, scale)
    return o.view(b, h, q_len, d)
