"""BERT-based automatic post-editing (APE): the BERT it starts from, pre-trained or loaded, and
the synthetic (src, mt, pe) triplets it trains on."""
