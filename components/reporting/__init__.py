"""Paper-vs-reproduced comparison tables (Markdown, CSV, LaTeX) and the report index.

The publications' numbers ship with the package in ``paper_results.yaml``, a verbatim copy of
the project's transcription of the four papers; :mod:`components.reporting.tables` reads it.
"""
