"""The NMT grid (corpus × attention variant × seed) shared by the train / evaluate stages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from components.core.attention import NORMALIZERS
from components.data.bpe import BpeModel
from components.data.download import sha256_of
from components.errors import LearnableSparsityError
from components.nmt.model import Transformer, TransformerConfig
from components.nmt.trainer import Example
from pipelines.bpe import OUT as BPE
from pipelines.corpora import OUT as CORPORA
from pipelines.io import Pairs, fingerprint, read_json
from pipelines.params import Params

MODELS = Path("models/nmt")
# The code a trained model depends on: a change retrains every cell (see ``code_digest``).
MODEL_CODE = (
    "components/core/normalizers.py",
    "components/core/attention.py",
    "components/nmt/model.py",
    "components/nmt/training.py",
    "components/nmt/trainer.py",
)


@dataclass(frozen=True)
class Cell:
    """One grid cell: a model trained on ``corpus`` with attention ``variant`` and ``seed``."""

    corpus: str
    variant: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.corpus}/{self.variant}/seed{self.seed}"

    @property
    def checkpoint_dir(self) -> Path:
        return MODELS / self.key

    @property
    def bpe_model(self) -> Path:
        return BPE / self.corpus / "bpe.model"

    @property
    def corpus_dir(self) -> Path:
        return CORPORA / self.corpus


def grid(params: Params) -> list[Cell]:
    """Cells of ``nmt.corpora`` × ``nmt.variants`` × ``nmt.seeds``, validated."""
    corpora = params.get("nmt.corpora", list)
    variants = params.get("nmt.variants", list)
    seeds = params.get("nmt.seeds", list)
    known = params.get("corpora", dict)
    for corpus in corpora:
        if corpus not in known:
            raise LearnableSparsityError(
                f"{params.source}: nmt.corpora names {corpus!r}, which is not in corpora "
                f"({sorted(known)})"
            )
    for variant in variants:
        if variant not in NORMALIZERS:
            raise LearnableSparsityError(
                f"{params.source}: nmt.variants has {variant!r}; choose from {sorted(NORMALIZERS)}"
            )
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise LearnableSparsityError(f"{params.source}: nmt.seeds has {seed!r}, not an int")
    if not (corpora and variants and seeds):
        raise LearnableSparsityError(f"{params.source}: nmt.corpora/variants/seeds is empty")
    return [Cell(c, v, s) for c in corpora for v in variants for s in seeds]


def device(num_gpus: float) -> torch.device:
    """cuda when the task was given a GPU (an error if torch sees none), else cpu."""
    if num_gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise LearnableSparsityError(
            "ray.task_gpus > 0 but torch sees no CUDA device in the task; set ray.task_gpus: 0"
        )
    return torch.device("cuda")


def encode(bpe: BpeModel, pairs: Pairs) -> list[Example]:
    """BPE ids of each (source, target) pair, without bos/eos."""
    sources = bpe.encode_ids_batch([s for s, _ in pairs], add_bos=False, add_eos=False)
    targets = bpe.encode_ids_batch([t for _, t in pairs], add_bos=False, add_eos=False)
    return list(zip(sources, targets, strict=True))


def build_model(model_params: dict, variant: str, vocab_size: int) -> Transformer:
    """The Transformer of ``nmt.model`` with every attention block using ``variant``."""
    config = TransformerConfig(
        src_vocab=vocab_size, tgt_vocab=vocab_size, normalizer=variant, **model_params
    )
    return Transformer(config)


def data_digest(cell: Cell) -> dict[str, str]:
    """What a trained model depends on besides its settings: the corpus and BPE files."""
    meta = read_json(cell.corpus_dir / "meta.json")
    return {"corpus": fingerprint(meta["sha256"]), "bpe": sha256_of(cell.bpe_model)}
