r"""The BERT of the APE model: its settings, and loading it by path or hub name.

The paper starts from ``bert-base-multilingual-cased``. Offline, the smoke profile builds a
small stand-in the way mBERT was built, at toy scale (:mod:`learnable_sparsity.ape.wordpiece`, the
vocabulary; :mod:`learnable_sparsity.ape.pretrain`, masked-LM pre-training), saved with
``save_pretrained``. :func:`load_bert` then loads either that directory or a hub name from the
local Hugging Face cache through the same ``from_pretrained`` call, and turns "not in the cache
and the hub cannot be reached" into a :class:`LearnableSparsityError` that says which model,
which cache and how to fix it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    from huggingface_hub import constants as hub_constants
    from huggingface_hub.errors import LocalEntryNotFoundError
    from transformers import (
        AutoTokenizer,
        BertModel,
        BertTokenizerFast,
        PreTrainedModel,
    )

from learnable_sparsity.ape.pretrain import PretrainSettings
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import Settings


@dataclass(frozen=True, kw_only=True)
class BertSettings(Settings):
    """Params ``bert``: the BERT every APE model starts from (stage ``pretrain_bert``).

    ``name_or_path`` null pre-trains a small BERT by masked-LM on both sides of the ``train``
    split of ``corpus`` (smoke, offline); a hub name (paper: ``bert-base-multilingual-cased``)
    or a ``save_pretrained`` directory is loaded with ``from_pretrained`` (the hub name from
    ``cache_dir`` or the Hugging Face cache) and saved as the stage's output.
    """

    name_or_path: str | None = None
    cache_dir: str | None = None
    corpus: str
    pretrain: PretrainSettings


def _offline_error(name_or_path: str, cache_dir: str | None) -> LearnableSparsityError:
    cache = cache_dir if cache_dir is not None else hub_constants.HF_HUB_CACHE
    offline = os.environ.get("HF_HUB_OFFLINE", "<unset>")
    return LearnableSparsityError(
        f"{name_or_path!r} is not a local directory and is not in the Hugging Face cache "
        f"{cache!r}, and the hub could not be reached (HF_HUB_OFFLINE={offline}; offline mode "
        f"{'on' if hub_constants.HF_HUB_OFFLINE else 'off'}). Download it once on a machine with "
        f"network access into that cache (e.g. `hf download {name_or_path} --cache-dir "
        f"{cache}`, with HF_HUB_OFFLINE unset), or pass the path of a directory saved with "
        "save_pretrained instead of the name."
    )


def _from_pretrained(
    loader: Callable[..., Any], name_or_path: str, cache_dir: str | None, **kwargs: Any
) -> Any:
    """``loader(name_or_path, cache_dir=…, **kwargs)``, the offline failure made explicit.

    transformers' ``cached_file`` (5.23) raises ``OSError`` from huggingface_hub's
    ``LocalEntryNotFoundError`` exactly when a file is neither in a local directory nor in the
    cache and the hub was not asked (offline mode, ``local_files_only``) or could not be reached
    (a connection error or time-out). Every other failure (a missing directory given as a path,
    an unknown repository on a reachable hub, a broken file) propagates unchanged.
    """
    if _looks_like_path(name_or_path) and not os.path.isdir(name_or_path):
        raise LearnableSparsityError(f"BERT directory {name_or_path!r} does not exist")
    try:
        return loader(name_or_path, cache_dir=cache_dir, **kwargs)
    except OSError as error:
        if isinstance(error.__cause__, LocalEntryNotFoundError):
            raise _offline_error(name_or_path, cache_dir) from error
        raise


def _looks_like_path(name_or_path: str) -> bool:
    """True for an absolute path or one starting at ``.``/``~``: never a hub name."""
    return os.path.isabs(name_or_path) or name_or_path.startswith((".", "~"))


def load_bert(
    name_or_path: str,
    *,
    cache_dir: str | None = None,
    model_class: type[PreTrainedModel] = BertModel,
    **kwargs: Any,
) -> PreTrainedModel:
    """``model_class.from_pretrained(name_or_path, cache_dir=cache_dir, **kwargs)``.

    ``name_or_path`` is a directory written by ``save_pretrained`` (the smoke BERT) or a hub
    name (``bert-base-multilingual-cased``) looked up in ``cache_dir`` (default: the Hugging
    Face cache, ``huggingface_hub.constants.HF_HUB_CACHE``) and downloaded there when the hub
    is reachable and ``HF_HUB_OFFLINE`` is not set. Raises LearnableSparsityError naming the
    model, the cache directory and ``HF_HUB_OFFLINE`` when the name is in neither and the hub
    cannot be reached, and when an absolute or ``./``-relative path is not a directory.
    """
    return _from_pretrained(model_class.from_pretrained, name_or_path, cache_dir, **kwargs)


def load_bert_tokenizer(
    name_or_path: str, *, cache_dir: str | None = None, **kwargs: Any
) -> BertTokenizerFast:
    """The WordPiece tokenizer saved with a BERT, with :func:`load_bert`'s lookup and errors.

    Loaded through ``AutoTokenizer``: ``BertTokenizerFast.from_pretrained`` itself (5.23) does
    not fail for a name it cannot find but returns a tokenizer of the five special tokens.
    Raises LearnableSparsityError when the tokenizer found is not a BERT WordPiece tokenizer.
    """
    tokenizer = _from_pretrained(AutoTokenizer.from_pretrained, name_or_path, cache_dir, **kwargs)
    if not isinstance(tokenizer, BertTokenizerFast):
        raise LearnableSparsityError(
            f"{name_or_path!r} holds a {type(tokenizer).__name__}, not a BERT WordPiece tokenizer"
        )
    return tokenizer
