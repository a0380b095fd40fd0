"""The publications' numbers: read-only access to ``paper_results.yaml``.

The yaml ships with this package (a verbatim copy of the project's transcription of the four
papers). It holds a list of ``tables`` and of ``in_text_results``; each entry has an ``id``, a
``source`` (the citation), its ``metrics`` and ``rows``, and each row a ``system`` name and one
field per published metric. :func:`paper_table` returns one entry, :func:`published_row` the row
of one system.

The publications' data sets, in this project's naming (the corpus names of
``learnable_sparsity.data.registry``): :data:`EST_SPEED_CORPUS` (EST Table 4: BLEU de-en and speeds)
and
:data:`AST_HEADS_CORPUS` (AST's head-role analysis); the latent-variable experiments' are in their
table specs (:class:`~learnable_sparsity.reporting.lvm_tables.LvmTableSpec`).
"""

from __future__ import annotations

import copy
from functools import cache
from importlib import resources
from typing import Any

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    import yaml

from learnable_sparsity.errors import LearnableSparsityError

# Data sets of the publications, in this project's naming.
EST_SPEED_CORPUS = "iwslt14_de_en"  # EST Table 4: BLEU de-en and speeds on IWSLT 2014 De-En
AST_HEADS_CORPUS = "wmt14_en_de"  # AST head-role analysis: the WMT 2014 en->de models


@cache
def _paper_results() -> dict[str, dict[str, Any]]:
    """{id: entry} over the yaml's ``tables`` and ``in_text_results`` (parsed once)."""
    text = resources.files(__package__).joinpath("paper_results.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    return {entry["id"]: entry for entry in [*data["tables"], *data["in_text_results"]]}


def _entry(table_id: str) -> dict[str, Any]:
    """The cached entry ``table_id`` (not a copy: never hand it out)."""
    entries = _paper_results()
    if table_id not in entries:
        raise LearnableSparsityError(
            f"unknown paper table id {table_id!r}; known ids: {', '.join(entries)}"
        )
    return entries[table_id]


def paper_table(table_id: str) -> dict[str, Any]:
    """A copy of the published table or in-text result ``table_id`` of ``paper_results.yaml``."""
    return copy.deepcopy(_entry(table_id))


def published_row(table_id: str, system: str) -> dict[str, Any]:
    """A copy of the row of published table ``table_id`` whose ``system`` is ``system``."""
    for row in _entry(table_id)["rows"]:
        if row["system"] == system:
            return copy.deepcopy(row)
    raise LearnableSparsityError(f"paper table {table_id!r} has no row {system!r}")
