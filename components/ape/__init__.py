"""BERT-based automatic post-editing (APE): the BERT it starts from, pre-trained or loaded."""
