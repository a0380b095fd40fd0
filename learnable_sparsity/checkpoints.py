"""Resumable training state: one checkpoint mechanism for every training loop (NMT, LVM, APE).

A :class:`Checkpoint` is a directory holding ``last.pt``: everything a loop needs to continue
exactly where it stopped (weights, optimizer, scheduler, random states, step, history — the loop
decides) plus the settings it was written under. The same run writes the same bytes, whether or
not it was interrupted and resumed (:func:`~learnable_sparsity.files.save_atomic` writes a
canonical form; :func:`~learnable_sparsity.files.load_file` reads plain data only). Writes are
atomic (temporary file + rename), and the previous ``last.pt`` is kept as ``previous.pt``, so a
checkpoint that cannot be read (a truncated file, a full disk) falls back to the one before it
instead of losing the run. Resuming under other settings is refused with the differing keys
named, except for the keys a loop declares ``resumable`` (e.g. the number of steps, to train
longer).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.files import load_file, save_atomic

log = logging.getLogger(__name__)

LAST = "last.pt"
PREVIOUS = "previous.pt"


def rng_state(*generators: torch.Generator) -> dict[str, Any]:
    """The global torch random state, every CUDA device's once CUDA is in use (dropout on a GPU
    draws from those), and the state of ``generators`` (for :func:`restore_rng`)."""
    state = {"torch": torch.get_rng_state(), "generators": [g.get_state() for g in generators]}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any], *generators: torch.Generator) -> None:
    """Put back the random states saved by :func:`rng_state` (same generators, same order).

    The states are byte tensors that torch accepts only on the CPU, wherever the checkpoint was
    loaded to (``map_location``)."""
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state:
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    for generator, saved in zip(generators, state["generators"], strict=True):
        generator.set_state(saved.cpu())


class Checkpoint:
    """``directory/last.pt`` of a training run under ``settings`` (a JSON-like mapping).

    ``resumable``: settings keys that may differ between the run that wrote the checkpoint and
    the one resuming from it.
    """

    def __init__(
        self, directory: Path, settings: Mapping[str, Any], *, resumable: Collection[str] = ()
    ) -> None:
        self.directory = Path(directory)
        self.settings = dict(settings)
        self.resumable = frozenset(resumable)
        self.loaded_from: Path | None = None  # the file load() read (previous.pt if last.pt failed)

    @property
    def path(self) -> Path:
        return self.directory / LAST

    def load(self, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
        """The saved state, or None when nothing was saved yet.

        An unreadable ``last.pt`` is reported and ``previous.pt`` is used instead; when neither
        can be read the error names both files. A state written under other settings raises.
        """
        candidates = [self.path, self.directory / PREVIOUS]
        existing = [path for path in candidates if path.exists()]
        if not existing:
            return None
        errors = []
        for path in existing:
            try:
                state = load_file(path, map_location)
            except LearnableSparsityError as error:
                log.warning("%s; trying the previous checkpoint", error)
                errors.append(str(error))
                continue
            self._check_settings(path, state.get("settings", {}))
            self.loaded_from = path
            return state
        raise LearnableSparsityError(
            "no readable checkpoint in "
            f"{self.directory}: {'; '.join(errors)}; remove the directory to train from scratch"
        )

    def _check_settings(self, path: Path, saved: Mapping[str, Any]) -> None:
        keys = set(saved) | set(self.settings)
        changed = sorted(k for k in keys if saved.get(k) != self.settings.get(k))
        refused = [k for k in changed if k not in self.resumable]
        if refused:
            raise LearnableSparsityError(
                f"checkpoint {path} was written with other settings ({', '.join(refused)}); "
                f"remove {self.directory} to train from scratch"
            )

    def save(self, state: Mapping[str, Any], *, final: bool = False) -> None:
        """Write ``state`` (with the settings) as ``last.pt``; the old one becomes previous.

        ``final``: the run is complete; the new file is read back once to prove it whole, and
        the previous one is deleted (a finished run keeps one full checkpoint).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            os.replace(self.path, self.directory / PREVIOUS)
        save_atomic({**state, "settings": self.settings}, self.path)
        if final:
            load_file(self.path)
            (self.directory / PREVIOUS).unlink(missing_ok=True)
