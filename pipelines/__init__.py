"""The orchestration around the science package: DVC stages, commands, sweeps, on one scaffold.

* :mod:`pipelines.stages` — one module per stage of ``dvc.yaml``, by line of work (``nmt``,
  ``lvm``, ``ape``, ``report``); no stage imports another;
* :mod:`pipelines.cells` — the grid cells several stages (and the record command) open alike;
* :mod:`pipelines.verdicts` — the stages' results read for the claims, the tables and the matrix;
* :mod:`pipelines.lvm_experiments` — the latent-variable experiments' registry;
* :mod:`pipelines.commands` — what users run beside ``dvc repro``: preflight, profile, record,
  the MLflow UI, the plots page, the comparison with the committed outputs, the GPU AST grid;
* :mod:`pipelines.sweeps` — Ray Tune sweeps over the stages' grids, local or submitted;
* :mod:`pipelines.scaffold` — params, layout, cells, Ray, MLflow: what all of the above stand on.

No math here: tensors are the business of :mod:`learnable_sparsity`.
"""
