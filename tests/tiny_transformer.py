"""The one tiny Transformer of the tests (d_model 32, 2 heads, 2+2 layers, vocabulary 20), with
random sentences for it; the NMT, training-loop, head-analysis and device tests vary it by
overrides rather than each building its own.

"topk" keeps k = 2 keys so that it is actually sparse on these short sequences; "entmax_alpha"
heads get different α (1.2 and 1.8) so that the per-head broadcasting is exercised. Special ids
are the config defaults: pad 0, bos 2, eos 3; random sentences use the ordinary ids 4..19.
"""

from __future__ import annotations

import torch

from learnable_sparsity.core.attention import logit_of_alpha
from learnable_sparsity.nmt.model import Transformer, TransformerConfig

VOCAB = 20
PAD = 0
HEAD_ALPHAS = (1.2, 1.8)


def tiny_config(normalizer: str = "softmax", **overrides: object) -> TransformerConfig:
    """The tiny config, ``overrides`` replacing its settings (any of ``TransformerConfig``)."""
    settings = {
        "src_vocab": VOCAB,
        "tgt_vocab": VOCAB,
        "d_model": 32,
        "n_heads": 2,
        "d_ff": 64,
        "enc_layers": 2,
        "dec_layers": 2,
        "normalizer": normalizer,
        "topk_k": 2,
        "max_positions": 64,
    }
    settings.update(overrides)
    return TransformerConfig(**settings)


def tiny_model(
    normalizer: str = "softmax", seed: int = 0, *, training: bool = False, **overrides: object
) -> Transformer:
    """A tiny model drawn from ``seed``: in eval mode (no dropout) for tests of what it computes,
    in training mode (as PyTorch builds it) with ``training`` for those of a caller's mode. With
    a fixed ``alpha_init`` its heads get ``HEAD_ALPHAS``; with ``alpha_init=None`` they keep the
    random α that training starts from."""
    torch.manual_seed(seed)
    model = Transformer(tiny_config(normalizer, **overrides))
    for block in model.attention_blocks().values():
        if block.alpha_logit is not None and model.config.alpha_init is not None:
            with torch.no_grad():
                block.alpha_logit.copy_(logit_of_alpha(torch.tensor(HEAD_ALPHAS)))
    return model.train(training)


def random_tokens(lengths: list[int], seed: int) -> torch.Tensor:
    """[len(lengths), max(lengths)] right-padded ids drawn from the non-special tokens 4..19."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(4, VOCAB, (n,), generator=g)
    return out
