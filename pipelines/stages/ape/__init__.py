"""The stages of the automatic post-editing line: synthetic triplets, BERT, the APE models
and their TER/BLEU."""
