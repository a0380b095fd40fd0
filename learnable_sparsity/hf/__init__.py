"""The project's sparse attention inside Hugging Face ``transformers`` models (for APE).

Importing it registers the normalizers' names with transformers (``attention.register``,
idempotent): a model built or loaded by one of those names after ``import learnable_sparsity.hf``
finds it, so transformers' own "not supported" error, which cannot name ``register()``, only
comes before the package is imported at all.
"""

from learnable_sparsity.hf.attention import register

register()
