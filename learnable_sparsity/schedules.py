"""Learning-rate schedules: the multiplier of the peak rate after a number of updates.

Both warm up linearly and differ in the decay: :func:`inverse_sqrt_schedule` (Vaswani et al.'s
"Noam" schedule, fairseq's ``inverse_sqrt``: the NMT models) and :func:`linear_schedule` (BERT's
linear decay: the masked-LM pre-training and the APE models). Plain functions of the step,
for ``torch.optim.lr_scheduler.LambdaLR``.
"""

from __future__ import annotations

import math

from learnable_sparsity.errors import LearnableSparsityError


def inverse_sqrt_schedule(step: int, warmup: int) -> float:
    """Multiplier of the peak learning rate after ``step`` updates (LambdaLR's 0-based count).

    With s = step + 1 (the update about to be made): min(s / warmup, √(warmup / s)), which rises
    linearly to 1 at s = warmup and then decays as s^{-1/2}. Use with
    ``LambdaLR(optimizer, functools.partial(inverse_sqrt_schedule, warmup=warmup))``.
    """
    if warmup < 1:
        raise LearnableSparsityError(f"warmup must be a positive integer, got {warmup}")
    s = step + 1
    return min(s / warmup, math.sqrt(warmup / s))


def linear_schedule(step: int, warmup: int, steps: int) -> float:
    """Multiplier of the peak learning rate after ``step`` updates (LambdaLR's 0-based count).

    With s = step + 1 (the update about to be made): min(s / warmup, (steps + 1 − s) /
    (steps + 1 − warmup)), which rises linearly to 1 at s = warmup and then falls linearly to
    1 / (steps + 1 − warmup) at the last update s = steps (never 0, so no update is wasted).
    """
    s = step + 1
    return min(s / warmup, (steps + 1 - s) / (steps + 1 - warmup))
