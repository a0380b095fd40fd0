"""Joint BPE with sentencepiece: one subword vocabulary shared by source and target.

:func:`train_joint_bpe` learns a ``model_type="bpe"`` sentencepiece model from the source
sentences followed by the target sentences of the training pairs, in one process and
deterministically (one thread, every sentence, no shuffling: the same pairs give a byte-identical
model), and writes ``<prefix>.model`` and ``<prefix>.vocab`` (one ``piece<TAB>score`` line per
id) atomically. Settings that matter downstream:

* special ids :data:`PAD_ID` = 0, :data:`UNK_ID` = 1, :data:`BOS_ID` = 2, :data:`EOS_ID` = 3;
* identity normalization and ``split_by_whitespace``: a piece never spans two words and decoding
  the pieces of a whitespace-tokenized sentence (single spaces, no leading or trailing space)
  gives the sentence back exactly, as long as its characters were seen in training (every
  character of the training text is kept: ``character_coverage=1.0`` by default);
* ``vocab_size`` is an upper bound (``hard_vocab_limit=False``): a corpus too small to support it
  gets the largest vocabulary it allows, with a warning in the log.

Word boundaries: sentencepiece starts the first piece of every word with ``▁`` (U+2581), so
:func:`word_ids` maps each piece to the index of its word.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    import sentencepiece as spm

from learnable_sparsity.files import atomic_write_bytes, atomic_write_text
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import Settings, setting

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
WORD_START = "\u2581"  # "▁", sentencepiece's mark of a word's first piece

_log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class BpeSettings(Settings):
    """Params ``bpe``: the number of pieces of each corpus's joint BPE (paper: 32000), the four
    special pieces included."""

    vocab_size: int = setting(at_least=EOS_ID + 1)


def _sentences(pairs: Sequence[tuple[str, str]]) -> Iterator[str]:
    yield from (source for source, _ in pairs)
    yield from (target for _, target in pairs)


def train_joint_bpe(
    pairs: Sequence[tuple[str, str]],
    prefix: str | os.PathLike[str],
    vocab_size: int,
    *,
    character_coverage: float = 1.0,
) -> Path:
    """Train joint BPE on ``pairs``; write ``<prefix>.model`` and ``<prefix>.vocab``.

    ``vocab_size`` counts every piece, the four special ones included (the paper profile uses
    32000). Returns the path of the ``.model`` file.
    """
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size <= EOS_ID:
        raise LearnableSparsityError(
            f"BPE vocab_size must be an integer > {EOS_ID}, got {vocab_size!r}"
        )
    if not pairs:
        raise LearnableSparsityError("cannot train BPE on an empty list of sentence pairs")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sentences(pairs),
            model_writer=model,
            model_type="bpe",
            vocab_size=vocab_size,
            hard_vocab_limit=False,
            character_coverage=character_coverage,
            normalization_rule_name="identity",
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece="<pad>",
            unk_piece="<unk>",
            bos_piece="<s>",
            eos_piece="</s>",
            num_threads=1,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            minloglevel=2,
        )
    except RuntimeError as err:
        raise LearnableSparsityError(
            f"sentencepiece could not train BPE with vocab_size={vocab_size}, "
            f"character_coverage={character_coverage} on "
            f"{len(pairs)} pairs: {err}"
        ) from None
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = "".join(
        f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n"
        for i in range(processor.get_piece_size())
    )
    prefix = Path(prefix)
    atomic_write_text(prefix.with_name(prefix.name + ".vocab"), vocab)
    model_path = atomic_write_bytes(prefix.with_name(prefix.name + ".model"), model.getvalue())
    actual = processor.get_piece_size()
    if actual < vocab_size:
        _log.warning(
            "BPE vocabulary of %s has %d pieces, fewer than vocab_size=%d: the corpus supports no "
            "more merges",
            model_path,
            actual,
            vocab_size,
        )
    return model_path


def word_ids(pieces: Sequence[str]) -> list[int]:
    """For each subword piece, the index of the word it belongs to.

    A piece starting with ``▁`` opens a new word; any other piece continues the current one (a
    first piece without ``▁`` belongs to word 0).
    """
    ids: list[int] = []
    word = -1
    for piece in pieces:
        if piece.startswith(WORD_START) or word < 0:
            word += 1
        ids.append(word)
    return ids


class BpeModel:
    """A trained joint BPE model: sentences to pieces or ids and back."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise LearnableSparsityError(f"BPE model {self.path} does not exist")
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.load(str(self.path))
        except (RuntimeError, OSError) as err:
            raise LearnableSparsityError(
                f"{self.path} is not a sentencepiece model: {err}"
            ) from None
        specials = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise LearnableSparsityError(
                f"BPE model {self.path} has special ids pad/unk/bos/eos = {specials}, expected "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}: train it with train_joint_bpe"
            )

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special ones included."""
        return self._sp.get_piece_size()

    def encode(self, sentence: str) -> list[str]:
        """The subword pieces of ``sentence``."""
        return self._sp.encode(sentence, out_type=str)

    def encode_ids(
        self, sentence: str, *, add_bos: bool = False, add_eos: bool = False
    ) -> list[int]:
        """The piece ids of ``sentence``, optionally framed by :data:`BOS_ID` / :data:`EOS_ID`."""
        return self.encode_ids_batch([sentence], add_bos=add_bos, add_eos=add_eos)[0]

    def encode_ids_batch(
        self, sentences: Sequence[str], *, add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]:
        """:meth:`encode_ids` of many sentences at once (faster than one by one)."""
        return self._sp.encode(list(sentences), add_bos=add_bos, add_eos=add_eos)

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized text of piece ids; pad, bos and eos ids are dropped."""
        return self._sp.decode([int(i) for i in ids])

    def decode_pieces(self, pieces: Sequence[str]) -> str:
        """Detokenized text of subword pieces."""
        return self._sp.decode_pieces(list(pieces))

    def id_to_piece(self, ids: Sequence[int]) -> list[str]:
        """The pieces of ``ids`` (e.g. to call :func:`word_ids` on a decoded hypothesis)."""
        return [self._sp.id_to_piece(int(i)) for i in ids]
