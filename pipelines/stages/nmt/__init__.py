"""The stages of the neural machine translation line: corpora, BPE, the Transformer grid
(AST, EST), its BLEU, its heads' analysis and its speed."""
