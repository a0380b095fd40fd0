r"""The WordPiece vocabulary of the smoke BERT: mBERT's tokenizer, learned at toy scale.

:func:`train_wordpiece` learns a cased multilingual WordPiece vocabulary on both monolingual
sides of a corpus (Hugging Face ``tokenizers``' normaliser, pre-tokenizer and WordPiece model;
the pieces by deterministic byte-pair merges), normalised as mBERT-cased is (Unicode clean-up
and spaces around CJK characters, no lowercasing, no accent stripping; BERT's split on
whitespace and punctuation), as a ``BertTokenizerFast`` with :data:`SPECIAL_TOKENS`.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    import sentencepiece as spm
    from tokenizers import normalizers, pre_tokenizers
    from transformers import (
        BertTokenizerFast,
    )

from learnable_sparsity.errors import LearnableSparsityError

# BERT's special tokens, in the order that gives them ids 0..4 (``BertTokenizerFast``'s own
# default vocabulary uses the same order).
SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

WORD_START = "▁"  # sentencepiece's mark of a word-initial piece
CONTINUATION = "##"  # WordPiece's mark of a piece inside a word


def train_wordpiece(
    texts: Iterable[str], vocab_size: int, *, lowercase: bool = False
) -> BertTokenizerFast:
    """A WordPiece vocabulary of at most ``vocab_size`` entries learned from ``texts``.

    Normalisation as mBERT-cased: ``BertNormalizer`` (control characters removed, whitespace
    unified, spaces around CJK characters) without accent stripping and, unless ``lowercase``,
    without lowercasing; pre-tokenisation with ``BertPreTokenizer`` (split on whitespace and
    punctuation); continuation pieces prefixed with ``##``.

    The pieces are learned by byte-pair merges (sentencepiece BPE, one thread, on the
    normalised, pre-tokenised words): a word-initial piece ``▁ab`` becomes ``ab``, any other
    piece ``cd`` becomes ``##cd``, and every character of the texts is a piece in both forms, so
    no word is [UNK]. The ``tokenizers`` WordPiece trainer is not used because it is not
    deterministic: it breaks ties between equally frequent merges in hash-map order, which
    changes from process to process (three processes gave two different vocabularies for the
    tests' texts), and the pipeline's outputs must be a function of its inputs. The vocabulary
    is the special tokens :data:`SPECIAL_TOKENS` (ids 0..4), every character in both forms, then the
    merged pieces in the order they were learned, up to ``vocab_size``; ids follow that order.
    A corpus too small for ``vocab_size`` gives a smaller vocabulary; use ``len(tokenizer)``.

    The result is a ``BertTokenizerFast`` built with the same normalisation flags (so that
    ``save_pretrained`` / ``from_pretrained`` keep them) that adds ``[CLS] … [SEP]`` around a
    sentence and ``[CLS] A [SEP] B [SEP]`` around a pair; it segments each word by WordPiece's
    greedy longest match over these pieces.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise LearnableSparsityError(
            f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}"
        )
    normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=lowercase
    )
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words = [
        " ".join(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(t)))
        for t in texts
    ]
    words = [line for line in words if line]
    if not words:
        raise LearnableSparsityError("train_wordpiece needs at least one non-empty text")
    characters = sorted({c for line in words for c in line if c != " "})
    pieces = [*SPECIAL_TOKENS, *characters, *(CONTINUATION + c for c in characters)]
    for piece in _merged_pieces(words, vocab_size):
        if len(pieces) >= vocab_size:
            break
        wordpiece = piece[1:] if piece.startswith(WORD_START) else CONTINUATION + piece
        if len(piece.lstrip(WORD_START)) > 1 and wordpiece not in pieces:
            pieces.append(wordpiece)
    vocab = {piece: index for index, piece in enumerate(pieces)}
    return BertTokenizerFast(vocab=vocab, do_lower_case=lowercase, strip_accents=False)


def _merged_pieces(lines: list[str], vocab_size: int) -> list[str]:
    """sentencepiece BPE pieces of ``lines`` (space-separated words), in the order learned."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        character_coverage=1.0,
        normalization_rule_name="identity",
        split_by_unicode_script=False,
        split_by_number=False,
        bos_id=-1,
        eos_id=-1,
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not (processor.is_unknown(i) or processor.is_control(i))
    ]
