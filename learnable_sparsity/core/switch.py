"""A process-wide on/off setting of a kernel path, read at every call and overridable in a block.

The fused paths (C++ kernels, Triton kernels, fused attention) are each switched on by default
and off by an environment variable for a whole process; tests and benchmarks turn one off (or,
for Triton's interpreter, on for CPU tensors) for the length of a ``with`` block to compare it
with the path it replaces.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class Switch:
    """One boolean setting; truthy while on. Not thread-safe: a block's value is the process's."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __bool__(self) -> bool:
        return self.on

    @contextmanager
    def turned(self, on: bool) -> Iterator[None]:
        """The setting is ``on`` inside the block and what it was before after it."""
        previous, self.on = self.on, on
        try:
            yield
        finally:
            self.on = previous
