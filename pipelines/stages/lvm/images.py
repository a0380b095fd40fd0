"""DVC stage ``images``: the data of the latent-variable experiments → ``data/images/<name>.pt``.

Every entry of params ``images`` names a dataset and its ``source`` (scikit-learn's digits,
MNIST / Fashion-MNIST downloads, game features derived from the digits, or the user's EGG
files, which must lie in ``data/external``; see ``learnable_sparsity.data.datasets``).
``data/images/meta.json`` describes them all.
"""

from __future__ import annotations

import logging

from learnable_sparsity.data.datasets import EggGame, build_dataset, dataset_settings, save_dataset
from learnable_sparsity.settings import params_of
from pipelines.scaffold import layout
from pipelines.scaffold.files import write_json
from pipelines.scaffold.stage import Stage, run_stage

log = logging.getLogger(__name__)


def main(stage: Stage) -> None:
    datasets = stage.params.entries("images", dataset_settings)
    for name, settings in datasets.items():
        if isinstance(settings, EggGame):
            stage.require_external(f"images.{name}.features", settings.features)
            stage.require_external(f"images.{name}.labels", settings.labels)
    meta = {}
    for name, settings in datasets.items():
        stored = build_dataset(settings)
        sizes = save_dataset(stored, layout.image_data(name))
        meta[name] = {"kind": stored["kind"], "sizes": sizes, "source": params_of(settings)}
        log.info("%s (%s): %s", name, stored["kind"], sizes)
    write_json(layout.IMAGES / "meta.json", meta)


if __name__ == "__main__":
    run_stage("images", main)
