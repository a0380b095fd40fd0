"""CPU proxies of the sparse normalizers' GPU cost (issue 37), for ``benchmarks/gpu_proxies.py``.

Run as ``python benchmarks/gpu/proxy_normalizers.py [--quick]`` with ``PYTHONPATH`` naming the root
of the ``learnable_sparsity`` to measure (the working tree's or a baseline's export: only its
public functions and the kernels' module are used, so an older tree is measured the same way).
Prints one JSON object:

* ``compiled``: per kernel (α-entmax forward in float32 at the row lengths d, the launch that
  carries the float32 solve; where the tree has a separate float64 launch, that one too; in the
  full run sparsemax and 1.5-entmax as well), compiled by ``triton.compile`` for sm_90a on the
  CPU: registers and spilled bytes per thread (``ptxas -v`` on the PTX), SASS instructions of the
  whole kernel and of its loops (``nvdisasm`` on the cubin; a loop is the span from a backward
  branch's target to the branch), and loop instructions per score element (divided by the
  elements each thread holds, BLOCK / threads): the cost of one solver pass per element.
* ``host``: per call on the path CUDA tensors take (``fused_triton``), with the kernel launch
  replaced by a stub that records it: host reads of a tensor's value (each a wait for the GPU on
  CUDA: ``tolist``, ``item``, ``bool``, ... counted by a TorchFunctionMode), aten ops, cast
  kernels (``_to_copy``/``copy_`` that change the dtype: each a kernel on CUDA), kernel launches,
  and host microseconds per call (the stub costs nothing; a real Triton launch adds its own
  launcher time per launch), for float32 and bfloat16 scores of 8 rows × 64, α per row.
  ``cpu_us``: microseconds per call of the same calls on the CPU's C++ kernels.
* ``passes``: solver passes per row (mean, max) of the eager solvers, which the kernels share,
  on bf16-rounded Gaussian rows (scale 1: scores at initialisation; scale 4: peaked ones) at d.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

# The host proxies route CPU tensors to the kernels' module (``on_cpu`` asks for the interpreter);
# the compiled ones run in a child process without it (``--compiled``): interpreted kernels do not
# compile.
COMPILING = "--compiled" in sys.argv
os.environ["TRITON_INTERPRET"] = "0" if COMPILING else "1"

import torch  # noqa: E402
from sm90 import ptxas_usage, sass_counts  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from learnable_sparsity.core import fused, fused_triton, normalizers  # noqa: E402

# Each host timing: the best of ROUNDS means over CALLS calls (the minimum is the least disturbed
# by other processes on a shared machine).
ROUNDS, CALLS = 5, 200
READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero")


class _HostReads(TorchFunctionMode):
    """Reads of a tensor's value on the host (each waits for the device on CUDA)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in READS
        return func(*args, **(kwargs or {}))


class _AtenOps(TorchDispatchMode):
    """aten ops, and the copies among them that change the dtype (cast kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        if func.overloadpacket.__name__ in ("_to_copy", "copy_") and isinstance(out, torch.Tensor):
            source = next((a for a in args if isinstance(a, torch.Tensor)), None)
            self.casts += source is not None and source.dtype != out.dtype
        return out


class _Launch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` records the launch, runs nothing."""

    def __init__(self) -> None:
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs) -> None:
            self.launches += 1

        return launch


def _calls(dtype: torch.dtype, grad: bool) -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=g).to(dtype).requires_grad_(grad)
    alpha = torch.full((8, 1), 1.3, requires_grad=grad)
    return {
        "softmax": lambda: torch.softmax(x, dim=-1),
        "sparsemax": lambda: normalizers.sparsemax(x),
        "entmax15": lambda: normalizers.entmax15(x),
        "entmax_alpha_tensor": lambda: normalizers.entmax(x, alpha),
    }


def _per_call_us(call) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        best = min(best, (time.perf_counter() - start) / CALLS)
    return round(best * 1e6, 2)


def host() -> dict[str, object]:
    """Host cost per forward call on the CUDA path (launch stubbed) and on the CPU kernels."""
    stub = SimpleNamespace(forward=_Launch(), backward=_Launch())
    real = fused_triton._kernels
    fused_triton._kernels = lambda: stub
    out: dict[str, object] = {}
    try:
        with fused.disabled(), fused_triton.on_cpu(), torch.no_grad():
            for dtype in (torch.float32, torch.bfloat16):
                for name, call in _calls(dtype, grad=False).items():
                    stub.forward.launches = 0
                    with _HostReads() as reads, _AtenOps() as ops:
                        call()
                    out[f"{name}/{str(dtype)[6:]}"] = {
                        "host_reads": reads.count,
                        "aten_ops": ops.ops,
                        "cast_kernels": ops.casts,
                        "launches": stub.forward.launches,
                        "host_us": _per_call_us(call),
                    }
    finally:
        fused_triton._kernels = real
    with torch.no_grad():
        cpu = {name: _per_call_us(call) for name, call in _calls(torch.float32, False).items()}
    return {"cuda_path": out, "cpu_us": cpu}


def passes(dims: tuple[int, ...], rows: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for d in dims:
        for scale in (1.0, 4.0):
            g = torch.Generator().manual_seed(d)
            x = (scale * torch.randn(rows, d, generator=g)).to(torch.bfloat16).float()
            for label, alpha in (("1.3", torch.tensor(1.3)), ("1.5", 1.5), ("2", 2.0)):
                it = normalizers.entmax_threshold(x, alpha).iterations.float()
                key = f"alpha={label}/d={d}/scale={scale:g}"
                out[key] = {"mean": round(float(it.mean()), 3), "max": int(it.max())}
    return out


def _compile(kind: int, d: int, wide: bool | None) -> dict[str, object]:
    import triton
    from triton.backends.compiler import GPUTarget

    from learnable_sparsity.core import triton_kernels

    options = fused_triton._launch_options(d)
    constants = {"KIND": kind, "BLOCK": options["BLOCK"]}
    constants.update(fused_triton._solver_constants(torch.float32))
    if wide is not None:
        constants["WIDE"] = wide
    signature = {"x_ptr": "*fp32", "alpha_ptr": "*fp32", "p_ptr": "*fp32"}
    signature.update({"d": "i32", "bits": "i32", **dict.fromkeys(constants, "constexpr")})
    signature = {name: signature[name] for name in triton_kernels.forward.arg_names}
    compiled = triton.compile(
        triton.compiler.ASTSource(triton_kernels.forward, signature, constants),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": options["num_warps"]},
    )
    counts = sass_counts(compiled.asm["cubin"])
    per_thread = options["BLOCK"] / (32 * options["num_warps"])
    return {
        **ptxas_usage(compiled.asm["ptx"]),
        "f64_ptx_lines": sum(".f64" in line for line in compiled.asm["ptx"].splitlines()),
        **counts,
        "loop_instructions_per_element": round(counts["loop_sass_instructions"] / per_thread, 1),
    }


def compiled(dims: tuple[int, ...], quick: bool) -> dict[str, object]:
    from learnable_sparsity.core import triton_kernels

    has_wide = "WIDE" in triton_kernels.forward.arg_names
    kernels = [("entmax_f32", 2, False if has_wide else None)]
    if has_wide:
        kernels.append(("entmax_f64_rows", 2, True))
    if not quick:
        kernels += [("sparsemax_f32", 0, False if has_wide else None)]
        kernels += [("entmax15_f32", 1, False if has_wide else None)]
    return {f"{name}/d={d}": _compile(kind, d, wide) for name, kind, wide in kernels for d in dims}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="d = 1024 only, fewer kernels")
    parser.add_argument("--compiled", action="store_true", help="only the compiled kernels")
    args = parser.parse_args()
    dims = (1024,) if args.quick else (1024, 4096)
    if args.compiled:
        json.dump(compiled(dims, args.quick), sys.stdout)
        return
    child = [sys.executable, __file__, "--compiled", *(["--quick"] if args.quick else [])]
    result = {
        "host": host(),
        "passes": passes(dims, rows=64 if args.quick else 256),
        "compiled": json.loads(subprocess.run(child, capture_output=True, check=True).stdout),
    }
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
