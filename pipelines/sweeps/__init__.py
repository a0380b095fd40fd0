"""Sweeps over the stages' grids as Ray Tune trials: ``python -m pipelines.sweeps.run SPEC``
(local, or ``--submit`` to a cluster)."""
