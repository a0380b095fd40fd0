r"""The normalizers as ``nn.Module``\ s, entmax-style: one per mapping, with ``dim``.

Each module's ``forward(x, mask=None)`` is its function of ``learnable_sparsity.core.normalizers``
along ``dim`` (``mask``: True = may receive probability). :class:`EntmaxAlpha` learns α:

    entmax_α(x),   α = ALPHA_MIN + (ALPHA_MAX − ALPHA_MIN)·sigmoid(w) ∈ (1.01, 2),

with w a parameter of the shape given at construction, parametrised as the learned α per head of
``MultiHeadAttention`` (``core.attention.alpha_of_logit``): α stays in range without a clamp,
and its gradient never vanishes at the ends.
"""

from __future__ import annotations

from torch import Tensor, nn

from learnable_sparsity.core.attention import alpha_logit_parameter, alpha_of_logit
from learnable_sparsity.core.normalizers import entmax, entmax15, sparsemax, topk_softmax


class _AlongDim(nn.Module):
    """A parameter-free mapping along ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Sparsemax(_AlongDim):
    """sparsemax(x) along ``dim``: the Euclidean projection onto the simplex (α = 2)."""

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return sparsemax(x, dim=self.dim, mask=mask)


class Entmax15(_AlongDim):
    """1.5-entmax(x) along ``dim`` (α = 1.5, exact threshold)."""

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return entmax15(x, dim=self.dim, mask=mask)


class Entmax(nn.Module):
    """α-entmax(x) along ``dim`` with a fixed ``alpha`` ≥ 1 (entmax's ``EntmaxBisect``)."""

    def __init__(self, alpha: float = 1.5, dim: int = -1) -> None:
        super().__init__()
        if not alpha >= 1:
            raise ValueError(f"alpha must be at least 1, got {alpha!r}")
        self.alpha = float(alpha)
        self.dim = dim

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return entmax(x, self.alpha, dim=self.dim, mask=mask)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, dim={self.dim}"


class EntmaxAlpha(nn.Module):
    """α-entmax(x) along ``dim`` with a learned α of ``shape``: one α per head, per row group, …

    ``shape`` must broadcast against x with ``dim`` of size 1 (torch's rules): ``()`` one α for
    every row; ``(H, 1, 1)`` one per head of scores [B, H, q, k] normalised along the last dim.
    Every α starts at ``alpha_init`` ∈ (1.01, 2); the parameter ``alpha_logit`` is w above.
    """

    def __init__(
        self, shape: int | tuple[int, ...] = (), dim: int = -1, alpha_init: float = 1.5
    ) -> None:
        super().__init__()
        self.dim = dim
        self.alpha_logit = alpha_logit_parameter(shape, alpha_init)

    @property
    def alpha(self) -> Tensor:
        """The current α (detached), of the constructor's shape."""
        return alpha_of_logit(self.alpha_logit).detach()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return entmax(x, alpha_of_logit(self.alpha_logit), dim=self.dim, mask=mask)

    def extra_repr(self) -> str:
        return f"shape={tuple(self.alpha_logit.shape)}, dim={self.dim}"


class TopkSoftmax(nn.Module):
    """Softmax over the ``k`` largest entries along ``dim`` (ties at the k-th kept), 0 elsewhere."""

    def __init__(self, k: int, dim: int = -1) -> None:
        super().__init__()
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self.k = k
        self.dim = dim

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return topk_softmax(x, self.k, dim=self.dim, mask=mask)

    def extra_repr(self) -> str:
        return f"k={self.k}, dim={self.dim}"
