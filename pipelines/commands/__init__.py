"""Commands users run beside ``dvc repro`` (``python -m pipelines.commands.<name>``)."""
