"""Paper-vs-reproduced comparison tables (Markdown, CSV, LaTeX), the report index, and figures.

The publications' numbers ship with the package in ``paper_results.yaml``, a verbatim copy of
the project's transcription of the four papers. One module per concept:

* :mod:`~learnable_sparsity.reporting.published` — the published numbers (reads the yaml) and the
  publications' data-set names;
* :mod:`~learnable_sparsity.reporting.table` — the table model (reproduced beside published, with
  the comparability rules) and the builders' input checks;
* :mod:`~learnable_sparsity.reporting.render` — Markdown, CSV and LaTeX renderers and the report
  index;
* :mod:`~learnable_sparsity.reporting.nmt_tables` — the BLEU, speed and attention-head tables;
* :mod:`~learnable_sparsity.reporting.lvm_tables` — the latent-variable tables;
* :mod:`~learnable_sparsity.reporting.figures` — the latent-variable figures (matplotlib).

No module imports torch.
"""
