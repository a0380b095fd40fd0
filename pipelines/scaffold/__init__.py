"""What every stage entrypoint of ``pipelines/`` stands on: one scaffold, no stage logic.

* :mod:`~pipelines.scaffold.stage` — ``run_stage`` and ``Stage``: params as settings, the grid
  run, the MLflow parent run, atomic outputs;
* :mod:`~pipelines.scaffold.cells` — grid cells: fingerprints, reuse, the task in its worker;
* :mod:`~pipelines.scaffold.files` — JSON, PNG, content digests;
* :mod:`~pipelines.scaffold.layout` — every path of every stage;
* :mod:`~pipelines.scaffold.params` — ``params.yaml``, errors naming the key;
* :mod:`~pipelines.scaffold.runner` — Ray: local or a cluster, retries, failure reports;
* :mod:`~pipelines.scaffold.tracking.runs` — MLflow: parent and child runs, batched metrics;
* :mod:`~pipelines.scaffold.tracking.store` — the MLflow store: its URI, experiment, retries;
* :mod:`~pipelines.scaffold.tracking.provenance` — a run's source, library versions, system metrics;
* :mod:`~pipelines.scaffold.imports` — the project files a stage runs (its DVC deps, the cells'
  code fingerprint).
"""
