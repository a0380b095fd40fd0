r"""Masked-LM pre-training of the smoke BERT (Devlin et al. 2019 without next-sentence
prediction, as RoBERTa).

:func:`pretrain_mlm` trains a ``transformers`` ``BertForMaskedLM`` (its shape:
:class:`PretrainSettings`, :func:`bert_config`): with the masking of :func:`mask_tokens`,
minimise the mean over the selected positions i of −log p(x_i | x̃), x̃ the masked sentence.
The run resumes from its :class:`~learnable_sparsity.checkpoints.Checkpoint` and is saved with
``save_pretrained``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertTokenizerFast,
    )

from learnable_sparsity.ape.wordpiece import SPECIAL_TOKENS
from learnable_sparsity.checkpoints import Checkpoint, restore_rng, rng_state
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.schedules import linear_schedule
from learnable_sparsity.settings import Settings, SettingsError, params_of, setting

# Labels of the positions the MLM loss ignores (torch's cross_entropy default ignore_index).
IGNORE_INDEX = -100

# Of the positions selected for prediction, BERT replaces 80% by [MASK], 10% by a random token
# and leaves 10% unchanged (Devlin et al. 2019, §3.1 and appendix C.2), so that the model cannot
# rely on seeing [MASK], which never occurs at fine-tuning time.
MASK_FRACTION = 0.8
RANDOM_FRACTION = 0.1


def mask_tokens(
    input_ids: Tensor,
    special_mask: Tensor,
    tokenizer_vocab_size: int,
    mask_id: int,
    probability: float,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's masked-LM corruption: (masked input ids, labels), both shaped like ``input_ids``.

    ``special_mask`` (bool, same shape) is True at positions never to be predicted: [CLS],
    [SEP], padding (and whatever else the caller excludes). Each other position i is selected
    independently with probability p = ``probability`` (transformers' collator; the original
    BERT code selects round(p·n) positions per sentence, the same rate in expectation). A
    selected position, with u_i ~ U(0, 1) drawn independently, becomes

        [MASK]                                  if u_i < 0.8                (MASK_FRACTION)
        a token uniform on {0, …, V − 1}        if 0.8 ≤ u_i < 0.9          (RANDOM_FRACTION)
        itself                                  otherwise,

    V = ``tokenizer_vocab_size`` (the whole vocabulary, special tokens included, as in BERT; so
    a "random" token equals the original with probability 1/V). labels_i = x_i at selected
    positions and :data:`IGNORE_INDEX` (−100) elsewhere. All randomness comes from
    ``generator`` (or the global RNG when None), in a fixed order, so a seeded generator gives
    the same corruption every time.
    """
    if input_ids.shape != special_mask.shape:
        raise LearnableSparsityError(
            f"special_mask {tuple(special_mask.shape)} does not match input_ids "
            f"{tuple(input_ids.shape)}"
        )
    if not 0 < probability < 1:
        raise LearnableSparsityError(f"probability must lie in (0, 1), got {probability}")
    if not 0 <= mask_id < tokenizer_vocab_size:
        raise LearnableSparsityError(
            f"mask_id {mask_id} is not in a vocabulary of {tokenizer_vocab_size} tokens"
        )
    draw = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    selected = (draw < probability) & ~special_mask.bool()
    u = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    random_tokens = torch.randint(
        tokenizer_vocab_size, input_ids.shape, generator=generator, device=input_ids.device
    )
    masked = input_ids.clone()
    masked[selected & (u < MASK_FRACTION)] = mask_id
    to_random = selected & (u >= MASK_FRACTION) & (u < MASK_FRACTION + RANDOM_FRACTION)
    masked[to_random] = random_tokens[to_random]
    labels = input_ids.masked_fill(~selected, IGNORE_INDEX)
    return masked, labels


# Settings a pre-training checkpoint may be resumed under although they differ: they do not
# change the updates already made (``steps`` changes the schedule's length, so a longer run
# continues with the new schedule from the saved step).
RESUMABLE_PRETRAIN = ("steps", "log_every", "checkpoint_every")


@dataclass(frozen=True, kw_only=True)
class PretrainSettings(Settings):
    """Masked-LM pre-training of a small BERT (smoke stand-in for mBERT-cased).

    mBERT: 110k WordPiece vocabulary, 12 layers of width 768 (12 heads, feed-forward 3072),
    sequences of 512, 1M steps of 256 sequences, peak lr 1e-4 with 10k warm-up steps, 15%
    masking. ``vocab_size`` is the WordPiece training target (:func:`train_wordpiece`); the
    model's vocabulary is the tokenizer's actual size.
    """

    vocab_size: int = setting(at_least=len(SPECIAL_TOKENS) + 1)
    hidden_size: int = setting(at_least=1)
    num_layers: int = setting(at_least=1)
    num_heads: int = setting(at_least=1)
    intermediate_size: int = setting(at_least=1)
    max_length: int = setting(at_least=3)  # [CLS], one token, [SEP]
    steps: int = setting(at_least=1)
    batch_size: int = setting(at_least=1)
    lr: float = setting(above=0)
    warmup: int = setting(at_least=1)
    mask_probability: float = setting(0.15, above=0, below=1)
    dropout: float = setting(0.1, at_least=0, below=1)
    weight_decay: float = setting(0.01, at_least=0)
    clip_norm: float = setting(1.0, at_least=0)  # 0: no clipping
    log_every: int = setting(10, at_least=1)
    checkpoint_every: int = setting(100, at_least=1)
    seed: int = setting(0, at_least=0)

    def validate(self) -> None:
        if self.hidden_size % self.num_heads:
            raise SettingsError(
                "hidden_size",
                f"must be divisible by num_heads {self.num_heads}, got {self.hidden_size}",
            )
        if self.warmup > self.steps:
            raise SettingsError("warmup", f"must not exceed steps {self.steps}, got {self.warmup}")


def bert_config(settings: PretrainSettings, tokenizer: BertTokenizerFast) -> BertConfig:
    """The ``BertConfig`` of the model :func:`pretrain_mlm` trains (vocabulary: the tokenizer's)."""
    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        intermediate_size=settings.intermediate_size,
        max_position_embeddings=settings.max_length,
        hidden_dropout_prob=settings.dropout,
        attention_probs_dropout_prob=settings.dropout,
        pad_token_id=tokenizer.pad_token_id,
    )


def _encode(texts: Sequence[str], tokenizer: BertTokenizerFast, max_length: int) -> list[Tensor]:
    """Each text as ``[CLS] pieces [SEP]`` ids, truncated to ``max_length``.

    Raises LearnableSparsityError for a text with no piece to predict (empty, or [UNK] only).
    """
    special = set(tokenizer.all_special_ids)
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    for index, ids in enumerate(encoded):
        if all(i in special for i in ids):
            raise LearnableSparsityError(
                f"text {index} has no token to predict after tokenisation: {texts[index]!r}"
            )
    return [torch.tensor(ids) for ids in encoded]


def _batch(step: int, n: int, batch_size: int, seed: int) -> list[int]:
    """Sentence indices of update ``step`` (from 1): positions (step − 1)·b … step·b − 1 of the
    stream that visits range(n) in a fresh random permutation every epoch, the permutation of
    epoch e drawn from seed ``seed · 1_000_003 + e``. A pure function of its arguments, so a
    resumed run reads the same batches without saving the data order."""
    indices = []
    for position in range((step - 1) * batch_size, step * batch_size):
        epoch, offset = divmod(position, n)
        indices.append(_permutation(n, seed * 1_000_003 + epoch)[offset])
    return indices


@functools.lru_cache(maxsize=2)
def _permutation(n: int, seed: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def pretrain_mlm(
    texts: Sequence[str],
    tokenizer: BertTokenizerFast,
    settings: PretrainSettings,
    *,
    on_log: Callable[[int, float], None] | None = None,
    checkpoint_dir: Path | None = None,
    before_checkpoint: Callable[[int], None] | None = None,
) -> BertForMaskedLM:
    """A ``BertForMaskedLM`` (:func:`bert_config`) trained by masked-LM on ``texts``; eval mode.

    Each of ``settings.steps`` updates takes the next ``batch_size`` sentences of a random
    permutation of ``texts`` (a new one every epoch), padded to the longest, masks them with
    :func:`mask_tokens` (never [CLS], [SEP], [PAD], [UNK] or [MASK]: the tokenizer's special
    ids, as transformers' collator) and minimises the mean cross-entropy over the selected
    positions (a batch in which no position was selected is masked again). AdamW (weight decay
    on matrices and embeddings only, as BERT) with the linear schedule
    (:func:`~learnable_sparsity.nmt.training.linear_schedule`), gradients clipped to ``clip_norm``.
    ``on_log(step, loss)`` receives the mean loss of the last ``log_every`` updates after every
    ``log_every``-th update (step counted from 1). Runs on the CPU.

    Deterministic given ``settings.seed``: initialisation and dropout use torch's global RNG
    inside ``torch.random.fork_rng`` seeded with it (the caller's RNG state is left as it
    was), masking a generator seeded with it, the data order :func:`_batch`.

    With ``checkpoint_dir``, a checkpoint (:class:`~learnable_sparsity.checkpoints.Checkpoint`:
    model, optimizer, schedule, both random states, the step and the unlogged losses) is written
    every ``checkpoint_every`` updates and at the end, after ``before_checkpoint(step)``; a run
    started again with the same settings resumes from it and ends with the same weights as one
    never interrupted (``steps``, ``log_every`` and ``checkpoint_every`` may change between the
    two). No validation loss, no device choice; a non-finite loss raises
    LearnableSparsityError.
    """
    if not texts:
        raise LearnableSparsityError("pretrain_mlm needs at least one text")
    sentences = _encode(texts, tokenizer, settings.max_length)
    special_ids = torch.tensor(tokenizer.all_special_ids)
    generator = torch.Generator().manual_seed(settings.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        model = BertForMaskedLM(bert_config(settings, tokenizer))
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            [
                {"params": [p for p in params if p.dim() >= 2]},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
            ],
            lr=settings.lr,
            weight_decay=settings.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: linear_schedule(step, settings.warmup, settings.steps)
        )
        since_log: list[float] = []
        start = 0
        resume = None
        if checkpoint_dir is not None:
            resume = Checkpoint(checkpoint_dir, params_of(settings), resumable=RESUMABLE_PRETRAIN)
            state = resume.load()
            if state is not None:
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                scheduler.load_state_dict(state["scheduler"])
                restore_rng(state["rng"], generator)
                start, since_log = state["step"], state["since_log"]

        def checkpoint(step: int, final: bool) -> None:
            if before_checkpoint is not None:
                before_checkpoint(step)
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": rng_state(generator),
                "step": step,
                "since_log": since_log,
            }
            resume.save(state, final=final)

        for step in range(start + 1, settings.steps + 1):
            indices = _batch(step, len(sentences), settings.batch_size, settings.seed)
            batch = [sentences[i] for i in indices]
            input_ids = torch.nn.utils.rnn.pad_sequence(
                batch, batch_first=True, padding_value=tokenizer.pad_token_id
            )
            attention_mask = input_ids != tokenizer.pad_token_id
            special = torch.isin(input_ids, special_ids)
            labels = torch.full_like(input_ids, IGNORE_INDEX)
            while (labels == IGNORE_INDEX).all():
                masked, labels = mask_tokens(
                    input_ids,
                    special,
                    len(tokenizer),
                    tokenizer.mask_token_id,
                    settings.mask_probability,
                    generator,
                )
            loss = model(input_ids=masked, attention_mask=attention_mask, labels=labels).loss
            if not torch.isfinite(loss):
                raise LearnableSparsityError(f"masked-LM loss is {loss.item()} at step {step}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if settings.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, settings.clip_norm)
            optimizer.step()
            scheduler.step()
            since_log.append(loss.item())
            if step % settings.log_every == 0:
                if on_log is not None:
                    on_log(step, math.fsum(since_log) / len(since_log))
                since_log = []
            if resume is not None and (
                step % settings.checkpoint_every == 0 or step == settings.steps
            ):
                checkpoint(step, final=step == settings.steps)
    return model.eval()
