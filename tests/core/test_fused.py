"""The fused CPU kernels (``learnable_sparsity.core.fused``): dispatch, threads, fall-backs, the
build.

The mappings themselves are held to the ``entmax`` package and to brute force by
``test_normalizers.py``, which runs every test on the kernels and on the eager solvers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from entmax import entmax15 as ref_entmax15
from entmax import sparsemax as ref_sparsemax

from learnable_sparsity.core import fused, normalizers
from tests.core.conftest import needs_compiler

ROOT = Path(__file__).resolve().parents[2]


def _functions(alpha: torch.Tensor) -> dict:
    return {
        "sparsemax": normalizers.sparsemax,
        "entmax15": normalizers.entmax15,
        "entmax": lambda x: normalizers.entmax(x, alpha),
        "topk": lambda x: normalizers.topk_softmax(x, 5),
    }


def _forward_backward(fn, x: torch.Tensor, grad: torch.Tensor, alpha: torch.Tensor):
    x = x.detach().clone().requires_grad_()
    alpha.grad = None
    p = fn(x)
    p.backward(grad)
    return p.detach(), x.grad, None if alpha.grad is None else alpha.grad.clone()


@needs_compiler
@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax", "topk"])
def test_cpu_float_tensors_take_the_kernels(name, monkeypatch):
    """A spy on the kernel entry: CPU float32/float64 calls reach it (forward and backward)."""
    assert fused.available()
    calls = []
    call = fused._call
    monkeypatch.setattr(fused, "_call", lambda kernel, *a: calls.append(kernel) or call(kernel, *a))
    alpha = torch.full((3, 1), 1.4, requires_grad=True)
    for dtype in (torch.float32, torch.float64):
        calls.clear()
        x = torch.randn(3, 7, dtype=dtype)
        _forward_backward(_functions(alpha)[name], x, torch.randn_like(x), alpha)
        assert len(calls) == 2 and calls[0].endswith("forward") and calls[1].endswith("backward")
    calls.clear()
    with fused.disabled():
        _functions(alpha)[name](torch.randn(3, 7))
    assert calls == []


@needs_compiler
@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax", "topk"])
def test_threads_split_rows_without_changing_results(name):
    """Large batches are split across torch's threads: results equal the one-thread run's."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 8, 300, generator=g)
    x[0, 0] = float("nan")
    x[1, 1] = float("-inf")
    grad = torch.randn(x.shape, generator=g)
    alpha = (1 + torch.rand(64, 1, 1, generator=g)).requires_grad_()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _forward_backward(_functions(alpha)[name], x, grad, alpha)
        torch.set_num_threads(2)
        two = _forward_backward(_functions(alpha)[name], x, grad, alpha)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, two, strict=True):
        assert (a is None and b is None) or torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))


@needs_compiler
def test_kernels_match_the_eager_solvers_on_attention_shaped_scores():
    """[B, H, T, S] scores with a causal mask and learned per-head α: outputs and both
    gradients agree with the eager solvers."""
    g = torch.Generator().manual_seed(6)
    x = 3 * torch.randn(2, 4, 33, 33, generator=g)
    mask = torch.ones(33, 33, dtype=torch.bool).tril()
    grad = torch.randn(x.shape, generator=g)
    alpha = (1.05 + torch.rand(1, 4, 1, 1, generator=g)).requires_grad_()
    functions = {
        "sparsemax": lambda v: normalizers.sparsemax(v, mask=mask),
        "entmax15": lambda v: normalizers.entmax15(v, mask=mask),
        "entmax": lambda v: normalizers.entmax(v, alpha, mask=mask),
        "topk": lambda v: normalizers.topk_softmax(v, 4, mask=mask),
    }
    for name, fn in functions.items():
        kernels = _forward_backward(fn, x, grad, alpha)
        with fused.disabled():
            eager = _forward_backward(fn, x, grad, alpha)
        for a, b in zip(kernels, eager, strict=True):
            assert (a is None) == (b is None), name
            if a is not None:
                assert (a - b).abs().max() <= 2e-5, name


@needs_compiler
def test_sort_fallback_of_the_exact_kernels(tmp_path, monkeypatch):
    """Built with no Newton step allowed, sparsemax and 1.5-entmax take the sort-based
    threshold on every row; it matches the oracle, short rows and packed long rows alike."""
    library = tmp_path / "fused_no_newton.so"
    fused._build(os.environ.get("CXX", "g++"), library, defines=("LS_EXACT_MAX_ITER=0",))
    monkeypatch.setattr(fused, "_library", lambda: fused._load(library))
    g = torch.Generator().manual_seed(7)
    for d in (40, 3000):  # in place, and packed (kExactPackFrom = 2048)
        x = torch.randn(6, d, generator=g, dtype=torch.float64) * torch.tensor(
            [[0.01], [0.1], [1.0], [3.0], [10.0], [100.0]], dtype=torch.float64
        )
        assert (normalizers.sparsemax(x) - ref_sparsemax(x)).abs().max() <= 1e-12
        assert (normalizers.entmax15(x) - ref_entmax15(x)).abs().max() <= 1e-12


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


CHECK = """
    import torch
    from entmax import sparsemax as reference
    from learnable_sparsity.core import fused, normalizers
    x = torch.randn(4, 9, dtype=torch.float64)
    assert (normalizers.sparsemax(x) - reference(x)).abs().max() < 1e-12
    print("available:", fused.available())
"""


def test_without_a_compiler_the_eager_solvers_run_and_a_warning_says_why(tmp_path):
    result = _python(
        CHECK, {"CXX": "no-such-compiler", "LEARNABLE_SPARSITY_KERNEL_CACHE": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr
    assert "available: False" in result.stdout
    assert "fused CPU normalizers are unavailable" in result.stderr
    assert "no C++ compiler 'no-such-compiler'" in result.stderr


def test_a_failing_build_warns_with_the_compiler_error(tmp_path):
    compiler = tmp_path / "broken-c++"
    compiler.write_text("#!/bin/sh\necho 'fatal: out of ink' >&2\nexit 1\n")
    compiler.chmod(0o755)
    cache = tmp_path / "cache"
    result = _python(CHECK, {"CXX": str(compiler), "LEARNABLE_SPARSITY_KERNEL_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr
    assert "available: False" in result.stdout
    assert "fatal: out of ink" in result.stderr
    assert not list(cache.glob("*.so")) and not list(cache.glob("*.tmp"))


def test_the_switch_turns_the_kernels_off():
    result = _python(CHECK, {"LEARNABLE_SPARSITY_FUSED": "0"})
    assert result.returncode == 0, result.stderr
    assert "available: False" in result.stdout
    assert "unavailable" not in result.stderr


@needs_compiler
def test_parallel_first_uses_build_once_into_the_cache(tmp_path):
    """Four processes start at once on an empty cache: one library, built once, no leftovers;
    a later process loads it without compiling."""
    env = {"LEARNABLE_SPARSITY_KERNEL_CACHE": str(tmp_path)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CHECK)],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        assert "available: True" in out
    libraries = list(tmp_path.glob("*.so"))
    assert len(libraries) == 1 and not list(tmp_path.glob("*.tmp"))
    built = libraries[0].stat().st_mtime_ns
    again = _python(CHECK, env)
    assert "available: True" in again.stdout
    assert libraries[0].stat().st_mtime_ns == built
