"""The project's sparse attention inside Hugging Face ``transformers`` models (for APE)."""
