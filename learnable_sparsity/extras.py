"""Imports of the optional extras, whose failure names the extra to install.

The library needs torch only (``pip install learnable-sparsity``); a module that imports a package
of an extra (``pyproject.toml``'s ``[project.optional-dependencies]``) does it inside
:func:`needs_extra`, so that importing it without the extra says what to install::

    with needs_extra("hf", __name__):
        from transformers import AttentionInterface

    ModuleNotFoundError: learnable_sparsity.hf.attention needs transformers, which the extra
    'hf' installs: pip install "learnable-sparsity[hf]"
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

# The extras of pyproject.toml a library module may need (tests/test_library_api.py holds them to
# it): "hf" brings transformers; "pipeline" everything the experiments import (hf included).
EXTRAS = ("hf", "pipeline")
DISTRIBUTION = "learnable-sparsity"


def install_command(extra: str) -> str:
    """The pip command that installs ``extra``."""
    return f'pip install "{DISTRIBUTION}[{extra}]"'


@contextmanager
def needs_extra(extra: str, module: str) -> Iterator[None]:
    """Imports inside the block come with ``extra``: a missing third-party module raises a
    ModuleNotFoundError that names ``module`` (the importer), the missing package and
    :func:`install_command`; a missing module of this package itself is re-raised as it is."""
    if extra not in EXTRAS:
        raise ValueError(f"extra must be one of {', '.join(EXTRAS)}, got {extra!r}")
    try:
        yield
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if not missing or missing == "learnable_sparsity":
            raise
        raise ModuleNotFoundError(
            f"{module} needs {missing}, which the extra {extra!r} installs: "
            f"{install_command(extra)}",
            name=error.name,
        ) from error
