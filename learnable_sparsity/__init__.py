"""learnable-sparsity: sparse and adaptively sparse attention in PyTorch.

The library's face (``docs/library.md``), entmax-style::

    import learnable_sparsity as ls
    p = ls.entmax15(scores, dim=-1)                      # or ls.Entmax15(dim=-1)(scores)
    attention = ls.MultiHeadAttention(512, 8, normalizer="entmax_alpha")   # α learned per head

The names of :data:`__all__` load their module at first use: ``import learnable_sparsity`` itself
imports neither torch nor any extra, so the torch-free parts (the reporting package) stay light.
"""

from __future__ import annotations

import importlib
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

# The public API, the one list of it: name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "softmax": "learnable_sparsity.core.normalizers",
    "sparsemax": "learnable_sparsity.core.normalizers",
    "entmax15": "learnable_sparsity.core.normalizers",
    "entmax": "learnable_sparsity.core.normalizers",
    "topk_softmax": "learnable_sparsity.core.normalizers",
    "Sparsemax": "learnable_sparsity.core.modules",
    "Entmax15": "learnable_sparsity.core.modules",
    "Entmax": "learnable_sparsity.core.modules",
    "EntmaxAlpha": "learnable_sparsity.core.modules",
    "TopkSoftmax": "learnable_sparsity.core.modules",
    "MultiHeadAttention": "learnable_sparsity.core.attention",
    "entmax_attention": "learnable_sparsity.core.fused_attention",
    "Normalizer": "learnable_sparsity.core.registry",
    "NORMALIZERS": "learnable_sparsity.core.registry",
    "LearnableSparsityError": "learnable_sparsity.errors",
}
__all__ = ["__version__", *_EXPORTS]


def _version() -> str:
    """The installed distribution's version; in a checkout that is not installed, pyproject's."""
    try:
        return metadata.version("learnable-sparsity")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        if pyproject.is_file():
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        return "0+unknown"


__version__ = _version()


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
