"""BERT-based automatic post-editing (APE): the BERT it starts from (:mod:`components.ape.bert`:
its settings and loading; :mod:`components.ape.wordpiece` and :mod:`components.ape.pretrain`: the
vocabulary and masked-LM pre-training of the smoke BERT), the synthetic (src, mt, pe) triplets it
trains on (:mod:`components.ape.triplets`) and the APE models built on it
(:mod:`components.ape.model`)."""
