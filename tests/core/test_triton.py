"""The Triton kernels (``learnable_sparsity.core.fused_triton``) against the oracles, on any
machine.

With a GPU the kernels run compiled on CUDA tensors; without one, Triton's interpreter runs the
same kernels on CPU tensors (the root conftest sets ``TRITON_INTERPRET=1``), so CI checks their
arithmetic without a GPU. Forward: the ``entmax`` package in float64 (softmax at α = 1);
backward: the eager solvers (themselves checked against finite differences and the package in
``test_normalizers``) and ``gradcheck`` in float64. A last test compiles every kernel for a
Hopper GPU (sm_90) on the CPU, which catches what the interpreter forgives (types of
loop-carried values, branches that disagree).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import torch
from entmax import entmax15 as ref_entmax15
from entmax import entmax_bisect as ref_entmax_bisect
from entmax import sparsemax as ref_sparsemax
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from learnable_sparsity.core import fused, fused_triton
from learnable_sparsity.core.normalizers import entmax, entmax15, sparsemax

triton = pytest.importorskip(
    "triton", reason="Triton is not installed (a test-only dependency on CPU)"
)
# A function the interpreter runs as a kernel's callee must see triton.language in its globals.
tl = pytest.importorskip("triton.language")

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
F32, F64 = torch.float32, torch.float64
TOL = {F32: 1e-5, F64: 1e-10}
# α on both sides of every branch of the kernels: softmax (α − 1 < 1e-7), the float64 solve of
# float32 rows (α − 1 < 0.01), the cancellation-free α-gradient (α − 1 < 0.5), sparsemax's
# Newton, α > 2 (computed in float64 by ``entmax``).
ROW_ALPHAS = (1.0, 1.0001, 1.005, 1.05, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0)


@pytest.fixture(scope="module", autouse=True)
def kernels() -> Iterator[None]:
    """The kernels loaded and, without CUDA, CPU tensors routed to them (interpreted: the root
    conftest sets ``TRITON_INTERPRET=1`` before triton is first imported)."""
    with ExitStack() as stack:
        assert fused_triton.available(), "Triton is installed but the kernels did not load"
        if not CUDA:
            stack.enter_context(fused_triton.on_cpu())
            # The C++ kernels take CPU tensors first: off, so that CPU tensors reach Triton.
            stack.enter_context(fused.disabled())
        yield


def _scores(rows: int, d: int, dtype: torch.dtype, seed: int, scale: float = 3.0) -> torch.Tensor:
    """Random scores with a partly masked row, an empty row and a NaN row (rows ≥ 4)."""
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(rows, d, generator=g, dtype=F64)
    x[1, max(1, d // 3) :] = float("-inf")
    x[2] = float("-inf")
    x[3, d // 2] = float("nan")
    return x.to(dtype).to(DEVICE)


def _oracle(name: str, x: torch.Tensor, alpha: torch.Tensor | None) -> torch.Tensor:
    """float64 reference on the ordinary rows (0, 1, 4, …) of ``x``."""
    x64 = x.to(F64)
    if name == "sparsemax":
        return ref_sparsemax(x64, dim=-1)
    if name == "entmax15":
        return ref_entmax15(x64, dim=-1)
    a = alpha.to(F64)
    # The package returns the uniform distribution at α = 1: softmax is the reference there.
    bisect = ref_entmax_bisect(x64, a.clamp(min=1.0001), dim=-1, n_iter=100)
    return torch.where(a == 1, torch.softmax(x64, dim=-1), bisect)


def _row_alphas(rows: int, dtype: torch.dtype) -> torch.Tensor:
    values = torch.tensor(ROW_ALPHAS, dtype=dtype)
    return values[torch.arange(rows) % len(ROW_ALPHAS)].unsqueeze(-1).to(DEVICE)


def _call(name: str, x: torch.Tensor, alpha: torch.Tensor | None) -> torch.Tensor:
    if name == "sparsemax":
        return sparsemax(x)
    if name == "entmax15":
        return entmax15(x)
    return entmax(x, alpha)


ORDINARY = [0, 1, *range(4, 2 * len(ROW_ALPHAS))]


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("d", [1, 7, 130])
@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax"])
def test_forward_matches_the_oracle(name: str, d: int, dtype: torch.dtype) -> None:
    rows = 2 * len(ROW_ALPHAS)
    x = _scores(rows, d, dtype, seed=d)
    alpha = _row_alphas(rows, dtype) if name == "entmax" else None
    if d > 1:
        assert fused_triton.usable(x)
    p = _call(name, x, alpha)
    ordinary = torch.tensor(ORDINARY, device=DEVICE)
    a = None if alpha is None else alpha[ordinary]
    expected = _oracle(name, x[ordinary], a)
    torch.testing.assert_close(p[ordinary].to(F64), expected, atol=TOL[dtype], rtol=0)
    if d > 1:
        assert torch.equal(p[2], torch.zeros_like(p[2])), "a row with no finite score: zeros"
        assert bool(p[3].isnan().all()), "a row with a NaN score: NaN everywhere"


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax"])
def test_backward_matches_the_eager_solvers(name: str, dtype: torch.dtype) -> None:
    rows, d = 2 * len(ROW_ALPHAS), 33
    x = _scores(rows, d, dtype, seed=1).requires_grad_()
    alpha = _row_alphas(rows, dtype).requires_grad_() if name == "entmax" else None
    g = torch.randn(rows, d, generator=torch.Generator().manual_seed(2), dtype=dtype).to(DEVICE)

    def gradients() -> list[torch.Tensor]:
        inputs = [x] if alpha is None else [x, alpha]
        return list(torch.autograd.grad((_call(name, x, alpha) * g).sum(), inputs))

    ours = gradients()
    with fused_triton.disabled():
        eager = gradients()
    for got, expected in zip(ours, eager, strict=True):
        torch.testing.assert_close(got, expected, atol=10 * TOL[dtype], rtol=10 * TOL[dtype],
                                   equal_nan=True)  # fmt: skip
    assert bool(ours[0][3].isnan().all()), "a NaN row's gradient is NaN"
    assert torch.equal(ours[0][2], torch.zeros_like(ours[0][2])), "an empty row's gradient is 0"


@pytest.mark.parametrize("alpha", [1.2, 1.7, 2.0, 2.4])
def test_gradcheck_in_float64(alpha: float) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 6, generator=g, dtype=F64).to(DEVICE).requires_grad_()
    a = torch.full((3, 1), alpha, dtype=F64, device=DEVICE).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, a: entmax(x, a), (x, a))
    assert torch.autograd.gradcheck(sparsemax, (x,))
    assert torch.autograd.gradcheck(entmax15, (x,))


def test_half_precision_and_masks_run_in_float32_and_come_back() -> None:
    x = _scores(6, 40, F32, seed=4)[[0, 1, 4, 5]]
    mask = torch.rand(4, 40, generator=torch.Generator().manual_seed(5)) < 0.7
    mask = mask.to(DEVICE)
    alpha = torch.tensor([1.2, 1.5, 1.8, 1.3], device=DEVICE).unsqueeze(-1)
    for half in (torch.float16, torch.bfloat16):
        p = entmax(x.to(half), alpha, mask=mask)
        assert p.dtype == half
        expected = _oracle("entmax", x.to(half).float().masked_fill(~mask, float("-inf")), alpha)
        torch.testing.assert_close(p.to(F64), expected, atol=1e-2, rtol=0)
        assert not bool(p[~mask].any()), "masked entries get exactly zero"


# Calls of the modelled GPU division, one per step of the sparsemax loop (the test below).
_DIVISIONS = [0]


@triton.jit
def _reciprocal_times(a, b):
    """a / b as ``div.full.f32`` is modelled: 1/b rounded to float32, times a, rounded."""
    _DIVISIONS[0] += 1
    return a * (1.0 / b)


@pytest.mark.skipif(CUDA, reason="models the GPU's division in the interpreter")
def test_sparsemax_stops_when_the_support_stops_shrinking_under_inexact_division(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 37: ``/`` compiles to ``div.full.f32``, not correctly rounded. Modelled as the
    round-to-nearest reciprocal times the numerator (each rounded to float32), two of 2048
    bf16-valued rows of 1024 scores (seed 0: rows 1035 and 1661) put a score exactly at τ: it
    left the support at |S| = 8 and entered again at 7, and a loop run while the support
    *changed* went to its cap, 1025 steps. Run while it *shrinks*, every row stops within 7
    steps (exact division: the same 7) with sparsemax's output. The kernel divides with a
    counting model of the GPU's division here; the compile test checks it uses ``div.rn``."""
    from learnable_sparsity.core import triton_kernels

    monkeypatch.setattr(triton_kernels, "_divide", _reciprocal_times)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 1024, generator=g).to(torch.bfloat16)[[1035, 1661, 0, 1]].float()
    for row in x:
        _DIVISIONS[0] = 0
        p = sparsemax(row)
        assert _DIVISIONS[0] <= 7, _DIVISIONS[0]
        torch.testing.assert_close(p.to(F64), ref_sparsemax(row.to(F64)), atol=1e-6, rtol=0)


def test_alpha_reaches_the_kernels_in_float32_at_least() -> None:
    """Issue 37: α cast to the scores' dtype loses β = α − 1 in half precision (bf16 holds 1.01
    as 1.0078: β off by 22%); float64 scores keep a float64 α."""
    alpha = torch.tensor([[1.01], [1.5]], dtype=F64)
    for dtype, kept in ((torch.bfloat16, F32), (torch.float16, F32), (F32, F32), (F64, F64)):
        rows = fused_triton._per_row(alpha, torch.zeros(2, 3, dtype=dtype))
        assert rows.dtype == kept and rows.is_contiguous()
        assert rows[0, 0].item() == pytest.approx(1.01, rel=1e-7)
    assert torch.tensor(1.01, dtype=torch.bfloat16).item() == 1.0078125


def test_rows_longer_than_the_kernels_hold_go_to_the_eager_solvers() -> None:
    long = torch.zeros(1, fused_triton.MAX_D + 1, device=DEVICE)
    assert not fused_triton.usable(long)
    assert fused_triton.usable(long[:, :-1])
    with fused_triton.disabled():
        assert not fused_triton.usable(long[:, :-1])


HOPPER_COMPILE = """
import triton, torch
from triton.backends.compiler import GPUTarget
from learnable_sparsity.core import fused_triton, triton_kernels as K
# Half precision is loaded and stored by the kernels (issue 37); α and its gradient float32.
for dtype, name in ((torch.float32, "fp32"), (torch.float64, "fp64"), (torch.bfloat16, "bf16")):
    alpha = "*fp64" if name == "fp64" else "*fp32"
    for kind, wide in ((0, False), (1, False), (2, False), (2, True)):
        constants = dict(KIND=kind, BLOCK=128, WIDE=wide, **fused_triton._solver_constants(dtype))
        signature = {"x_ptr": f"*{name}", "alpha_ptr": alpha, "p_ptr": f"*{name}",
                     "d": "i32", "bits": "i32", **dict.fromkeys(constants, "constexpr")}
        compiled = triton.compile(triton.compiler.ASTSource(K.forward, signature, constants),
                                  target=GPUTarget("cuda", 90, 32))
        ptx = compiled.asm["ptx"]
        if kind == 0:  # sparsemax's τ correctly rounded: div.full cycles (issue 37)
            assert f"div.rn.f{'64' if name == 'fp64' else '32'}" in ptx, name
            assert "div.full" not in ptx, name
        if name != "fp64" and not wide:  # the float64 solve has a launch of its own (issue 37)
            assert ".f64" not in ptx, (kind, [l for l in ptx.splitlines() if ".f64" in l][:5])
        for alpha_grad in (False, True) if kind == 2 and not wide else (False,) * (not wide):
            constants = dict(KIND=kind, BLOCK=128, ALPHA_GRAD=alpha_grad)
            pointers = ("p_ptr", "g_ptr", "grad_x_ptr")
            signature = {**dict.fromkeys(pointers, f"*{name}"), "alpha_ptr": alpha,
                         "grad_alpha_ptr": alpha, "d": "i32",
                         **dict.fromkeys(constants, "constexpr")}
            signature = {key: signature[key] for key in K.backward.arg_names}
            triton.compile(triton.compiler.ASTSource(K.backward, signature, constants),
                           target=GPUTarget("cuda", 90, 32))
from learnable_sparsity.core import triton_attention as A
tensors = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "do_ptr", "dq_ptr", "dk_ptr", "dv_ptr")
arguments = {
    A.forward: ("q_ptr k_ptr v_ptr o_ptr alpha_ptr lengths_ptr stats_ptr tile_max_ptr",
                "n_tiles_n"),
    A.backward_rows: ("q_ptr k_ptr v_ptr do_ptr alpha_ptr lengths_ptr stats_ptr tile_max_ptr "
                      "rows_ptr", "n_tiles_n"),
    A.backward_dq: ("q_ptr k_ptr v_ptr do_ptr dq_ptr alpha_ptr lengths_ptr stats_ptr "
                    "tile_max_ptr rows_ptr", "n_tiles_n"),
    A.backward_dkdv: ("q_ptr k_ptr v_ptr do_ptr dk_ptr dv_ptr alpha_ptr lengths_ptr stats_ptr "
                      "tile_max_ptr rows_ptr", "n_tiles_m n_tiles_n"),
}
for kernel, (pointers, tiles) in arguments.items():
    for causal in (False, True):
        constants = dict(D=64, BM=64, BN=64, CAUSAL=causal, HAS_LENGTHS=True, PRECISION="tf32")
        if kernel is A.backward_rows:
            constants["ALPHA_GRAD"] = True
        signature = {p: "*bf16" if p in tensors else "*i32" if p == "lengths_ptr" else "*fp32"
                     for p in pointers.split()}
        signature |= {"q_len": "i32", "k_len": "i32", "scale": "fp32"}
        signature |= dict.fromkeys(tiles.split(), "i32") | dict.fromkeys(constants, "constexpr")
        triton.compile(triton.compiler.ASTSource(kernel, signature, constants),
                       target=GPUTarget("cuda", 90, 32))
print("compiled")
"""


@pytest.mark.skipif(CUDA, reason="on a GPU the other tests compile and run every kernel")
def test_every_kernel_compiles_for_a_hopper_gpu() -> None:
    """Compiled in a fresh process: the interpreter, loaded above, would replace the compiler."""
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HOPPER_COMPILE)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
    )
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]


class _HostOps(TorchDispatchMode):
    """Counts, per aten op name, the ops dispatched inside the block (the kernels' launches are
    not ops; the interpreter's own copies are not dispatched either)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.counts[func.overloadpacket.__name__] += 1
        sources = [a for a in args if isinstance(a, torch.Tensor)]
        if isinstance(out, torch.Tensor) and any(t.dtype != out.dtype for t in sources[:1]):
            self.casts += func.overloadpacket.__name__ in ("_to_copy", "copy_")
        return out


class _HostReads(TorchFunctionMode):
    """Counts the reads of a tensor's value on the host inside the block: each waits for the
    device on CUDA (``tolist`` is not an aten op, so a dispatch mode would miss it)."""

    READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero")

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.reads[name] += 1
        return func(*args, **(kwargs or {}))


def test_a_tensor_alpha_reaches_the_kernels_without_waiting_for_the_device() -> None:
    """Issue 37: α was checked with a host read on every call (18 waits per Transformer step).
    On the kernels an invalid α gives NaN rows instead; elsewhere it still raises."""
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    alpha = torch.tensor([[1.3], [0.5], [float("nan")], [3.0]], device=DEVICE)
    with _HostReads() as host:
        p = entmax(x, alpha)
    assert not host.reads, host.reads
    assert bool(p[1:3].isnan().all()), "an α below 1 or NaN: NaN rows"
    torch.testing.assert_close(p[[0, 3]].to(F64), _oracle("entmax", x[[0, 3]], alpha[[0, 3]]),
                               atol=1e-5, rtol=0)  # fmt: skip
    with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
        entmax(x, 0.5)
    with fused_triton.disabled(), pytest.raises(ValueError, match=r"finite and >= 1 .*got 0.5"):
        entmax(x, alpha)


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax"])
def test_half_precision_reaches_the_kernels_without_cast_kernels(name: str) -> None:
    """Issue 37: bf16 scores were cast to float32 and the output back, forward and backward;
    the kernels now load and store bf16 and compute in float32."""
    x = _scores(6, 40, F32, seed=7)[[0, 1, 4, 5]].to(torch.bfloat16).requires_grad_()
    alpha = torch.tensor([[1.2], [1.5], [1.8], [2.5]], device=DEVICE) if name == "entmax" else None
    g = torch.randn(4, 40, generator=torch.Generator().manual_seed(8)).to(DEVICE, torch.bfloat16)
    with _HostOps() as ops:
        p = _call(name, x, alpha)
        (grad,) = torch.autograd.grad(p, x, g)
    assert ops.casts == 0, ops.counts
    assert p.dtype == grad.dtype == torch.bfloat16
    x32 = x.detach().float().requires_grad_()
    with fused_triton.disabled():
        p32 = _call(name, x32, alpha)
        (grad32,) = torch.autograd.grad(p32, x32, g.float())
    torch.testing.assert_close(p.float(), p32, atol=1e-2, rtol=0)
    torch.testing.assert_close(grad.float(), grad32, atol=2e-2, rtol=2e-2)
