"""BERT-based automatic post-editing (APE): the BERT it starts from
(:mod:`learnable_sparsity.ape.bert`: its settings and loading;
:mod:`learnable_sparsity.ape.wordpiece` and :mod:`learnable_sparsity.ape.pretrain`: the vocabulary
and masked-LM pre-training of the smoke BERT), the synthetic (src, mt, pe) triplets it trains on
(:mod:`learnable_sparsity.ape.triplets`) and the APE models built on it
(:mod:`learnable_sparsity.ape.model`)."""
