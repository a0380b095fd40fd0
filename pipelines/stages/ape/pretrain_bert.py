"""DVC stage ``pretrain_bert``: the BERT of the APE models → ``models/bert/model``.

Smoke (``bert.name_or_path: null``): a cased WordPiece vocabulary and a small
``BertForMaskedLM`` pre-trained by masked-LM on both monolingual sides of the corpus's
training split (the offline stand-in for multilingual BERT). Paper: ``bert-base-multilingual-
cased`` loaded by name with ``from_pretrained`` (from the local Hugging Face cache when
offline; a clear error names the model, the cache and ``HF_HUB_OFFLINE`` when it is not there).
Either way the model and its tokenizer are saved with ``save_pretrained``: every APE cell loads
that directory with the same ``from_pretrained`` call. One Ray task (an MLflow child run with
the masked-LM loss curve); it resumes from its checkpoint and is reused while its settings,
corpus and code are unchanged. Outputs: the model, ``results/pretrain_bert/bert.json`` (where it
came from, its size) and ``metrics.json`` (DVC metrics: parameters and vocabulary size).
"""

from __future__ import annotations

from learnable_sparsity.ape.bert import BertSettings, load_bert, load_bert_tokenizer
from learnable_sparsity.ape.pretrain import pretrain_mlm
from learnable_sparsity.ape.wordpiece import train_wordpiece
from learnable_sparsity.data.local import read_corpus
from learnable_sparsity.settings import build, params_of
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, Grid, GridCell
from pipelines.scaffold.stage import Stage, run_stage

STAGE = "pretrain_bert"
CELL = "model"  # models/bert/model: the directory train_ape and evaluate_ape load


def bert_cell(run: CellRun) -> dict:
    """Ray task: pre-train (smoke) or fetch (paper) the BERT and save it in the cell."""
    settings = build(BertSettings, run.payload["bert"], "bert")
    if settings.name_or_path is not None:
        model = load_bert(
            settings.name_or_path, cache_dir=settings.cache_dir, add_pooling_layer=False
        )
        tokenizer = load_bert_tokenizer(settings.name_or_path, cache_dir=settings.cache_dir)
        summary = {"source": settings.name_or_path}
    else:
        pairs = read_corpus(layout.corpus_dir(settings.corpus), ("train",))["train"]
        texts = [side for pair in pairs for side in pair]
        tokenizer = train_wordpiece(texts, settings.pretrain.vocab_size)
        mlm = pretrain_mlm(
            texts,
            tokenizer,
            settings.pretrain,
            on_log=lambda step, loss: run.log_metrics({"mlm_loss": loss}, step),
            checkpoint_dir=run.directory,
            before_checkpoint=run.flush,
        )
        model = mlm.bert  # the encoder the APE models load (the masked-LM head is not used)
        summary = {"source": f"masked-LM on {settings.corpus}/train", "texts": len(texts)}
    model.save_pretrained(run.directory)
    tokenizer.save_pretrained(run.directory)
    run.log_model(model)
    parameters = sum(p.numel() for p in model.parameters())
    return {**summary, "vocab_size": len(tokenizer), "parameters": parameters}


def main(stage: Stage) -> None:
    bert = stage.settings("bert", BertSettings)
    inputs: tuple = ()
    if bert.name_or_path is None:
        stage.require_entries("bert.corpus", [bert.corpus], "corpora")
        inputs = layout.corpus_files(bert.corpus, ("train",))
    cell = GridCell(CELL, {"bert": params_of(bert)}, inputs, inputs)
    result = stage.run_grid(Grid(bert_cell, [cell], layout.BERT))[CELL]
    stage.write_json(layout.results(STAGE) / "bert.json", result, artifact="")
    stage.write_metrics({name: result[name] for name in ("parameters", "vocab_size")})


if __name__ == "__main__":
    run_stage(STAGE, main)
