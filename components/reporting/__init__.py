"""Paper-vs-reproduced comparison tables (Markdown, CSV, LaTeX), the report index, and figures.

The publications' numbers ship with the package in ``paper_results.yaml``, a verbatim copy of
the project's transcription of the four papers. One module per concept:

* :mod:`~components.reporting.published` — the published numbers (reads the yaml) and the
  publications' data-set names;
* :mod:`~components.reporting.table` — the table model (reproduced beside published, with the
  comparability rules) and the builders' input checks;
* :mod:`~components.reporting.render` — Markdown, CSV and LaTeX renderers and the report index;
* :mod:`~components.reporting.nmt_tables` — the BLEU, speed and attention-head tables;
* :mod:`~components.reporting.lvm_tables` — the latent-variable tables;
* :mod:`~components.reporting.figures` — the latent-variable figures (matplotlib).

No module imports torch.
"""
