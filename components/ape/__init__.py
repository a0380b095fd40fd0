"""BERT-based automatic post-editing (APE): the BERT it starts from, pre-trained or loaded
(:mod:`components.ape.bert`), the synthetic (src, mt, pe) triplets it trains on
(:mod:`components.ape.triplets`) and the APE models built on it (:mod:`components.ape.model`)."""
