"""The stages' results as the claims, the tables and the record command read them, and the
verdict matrix they print. Not stages."""
