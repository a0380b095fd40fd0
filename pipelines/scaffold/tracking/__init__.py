"""MLflow: the store, the runs, their provenance (the locked environment included)."""
