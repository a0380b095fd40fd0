"""The stages that report: the normalizer benchmark, the claims, the kept records re-judged,
the tables and the verdict matrix."""
