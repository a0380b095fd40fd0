"""The pinned CPU kernels of `make repro` (docs/pipeline.md, "Rerunning on another machine") give
the same bytes whatever instruction set the machine has.

Another x86 machine is emulated here by telling torch, MKL and oneDNN to use a smaller
instruction set than this CPU has (``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``,
``ONEDNN_MAX_CPU_ISA``): the kernels an AVX2 or an SSE4.2 machine would pick. A few training
updates of a small Transformer (softmax, α-entmax and sparsemax attention) and of a small BERT
(whose GELU oneDNN computes, as in APE's models) give different weights
under the native kernels of two such machines, and identical weights under the pinned kernels on
all of them —
the fused CPU normalizers, compiled on each machine, compiled for the x86-64 baseline then."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from learnable_sparsity.core import fused
from tests.conftest import load_script

# The weights' digest after a few updates with each attention normalizer, one thread.
TRAIN = """
import hashlib, torch
from learnable_sparsity.nmt.model import Transformer, TransformerConfig
torch.set_num_threads(1)
digest = hashlib.sha256()
for variant in ("softmax", "entmax_alpha", "sparsemax"):
    torch.manual_seed(0)
    config = TransformerConfig(
        d_model=32, n_heads=4, d_ff=64, enc_layers=1, dec_layers=1, share_embeddings=True
    ).for_vocabulary(500, variant)
    model = Transformer(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    for _ in range(8):
        src = torch.randint(4, 500, (16, 20), generator=data)
        tgt = torch.randint(4, 500, (16, 22), generator=data)
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for _, tensor in sorted(model.state_dict().items()):
        digest.update(tensor.detach().numpy().tobytes())
# APE's BERT: its GELU is oneDNN's, not torch's
from transformers import BertConfig, BertModel
torch.manual_seed(0)
bert = BertModel(BertConfig(
    vocab_size=500, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
    intermediate_size=64, max_position_embeddings=32,
))
optimizer = torch.optim.Adam(bert.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1)
for _ in range(8):
    hidden = bert(input_ids=torch.randint(4, 500, (16, 20), generator=data)).last_hidden_state
    optimizer.zero_grad()
    hidden.square().mean().backward()
    optimizer.step()
for _, tensor in sorted(bert.state_dict().items()):
    digest.update(tensor.detach().numpy().tobytes())
print(digest.hexdigest())
"""
PINNED = load_script("tools/kernel_settings.py").PORTABLE  # make repro's PORTABLE_KERNELS
MACHINES = {
    "this CPU": {},
    "an AVX2 machine": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    },
    "an SSE4.2 machine": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}
KERNEL_VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
)


def _flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return {f for line in info if line.startswith("flags") for f in line.split()}
    except OSError:
        return set()


def _weights_digest(kernels: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES} | kernels
    done = subprocess.run(
        [sys.executable, "-c", TRAIN], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.skipif(
    not {"avx2", "avx512f"} <= _flags(), reason="emulating an AVX2 machine needs an AVX-512 CPU"
)
def test_pinned_kernels_give_the_same_weights_on_every_emulated_machine() -> None:
    native = {name: _weights_digest(kernels) for name, kernels in MACHINES.items()}
    assert native["this CPU"] != native["an AVX2 machine"], "the emulation changed no kernel"
    pinned = {name: _weights_digest(kernels | PINNED) for name, kernels in MACHINES.items()}
    assert len(set(pinned.values())) == 1, pinned


def test_pinned_kernels_compile_the_fused_normalizers_for_the_x86_64_baseline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fused CPU kernels are compiled on each machine: for its own instruction set, their
    vectorised sums would differ from another machine's; pinned, every x86 machine compiles the
    same code."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    expected = fused.PORTABLE if platform.machine() in ("x86_64", "AMD64") else fused.NATIVE
    assert fused.instruction_set() == expected
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert fused.instruction_set() == fused.NATIVE
