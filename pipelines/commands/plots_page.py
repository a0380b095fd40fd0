"""The page template of ``dvc plots show``, with Vega inlined: ``python -m
pipelines.commands.plots_page``.

DVC 3.67 (dvc-render 1.0.2) writes ``dvc_plots/index.html`` with script tags that load vega,
vega-lite and vega-embed from cdn.jsdelivr.net: offline, the page stays empty. ``.dvc/config``
names this project's template instead (``plots.html_template``, relative to ``.dvc/``), which holds
the same three builds inlined, those of the versions DVC loads (the files jsDelivr serves for them),
and DVC's placeholder for the charts, but not the one for DVC's script tags. This command rebuilds
it from the npm registry: each tarball is checked against the SHA-256 recorded here (taken when it
was pinned, from a download whose SHA-512 matched the registry's ``dist.integrity``) and each
inlined file against its own, which the tests also check the committed template against.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from learnable_sparsity.data.fetch import download
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.files import atomic_write_text
from pipelines.scaffold.runner import LOG_FORMAT

log = logging.getLogger(__name__)

REGISTRY = "https://registry.npmjs.org"
TEMPLATE = Path(".dvc/plots_page.html")
# dvc-render fills "{plot_divs}" with the charts, "{refresh_tag}" with `--refresh`'s meta tag and
# "{scripts}" with the CDN's script tags (the template leaves it out); an inlined build holding
# any of them, or the end of a script element, would be cut.
CHARTS_PLACEHOLDER = "{plot_divs}"
FORBIDDEN = ("{plot_divs}", "{refresh_tag}", "{scripts}", "</script")
INLINED = re.compile(r'<script data-package="([^"]+)">\n(.*?)\n</script>', re.DOTALL)


@dataclass(frozen=True)
class NpmBuild:
    """A file of an npm package's tarball that the page inlines, with the digests that pin it."""

    name: str
    version: str
    path: str  # in the tarball
    tarball_sha256: str
    sha256: str  # of the file

    @property
    def package(self) -> str:
        return f"{self.name}@{self.version}"

    def tarball(self, registry: str) -> str:
        return f"{registry}/{self.name}/-/{self.name}-{self.version}.tgz"


# The versions of dvc_render.vega.VegaRenderer.SCRIPTS, in its order (vega-embed needs the others).
BUILDS = (
    NpmBuild(
        "vega",
        "5.20.2",
        "package/build/vega.min.js",
        "d77deab01d6104b1239228720721f93003e60797d2faced7ffdd759fa70f989d",
        "4794d0169cb1f3ebad8117fe98ba5bd652dd725905ec0384e832391dbccb03be",
    ),
    NpmBuild(
        "vega-lite",
        "5.2.0",
        "package/build/vega-lite.min.js",
        "f64ca4745f043447ac86b67dc9e9592ec2b85ac8b8dafc35faf970f142463e4b",
        "d73157451b3978015ab31dacd55ff90d986ab8663fc0abed50f97b3cd90002cb",
    ),
    NpmBuild(
        "vega-embed",
        "6.18.2",
        "package/build/vega-embed.min.js",
        "93aeee312e92077b0252ef026c0fe0ec8fa430c19825aeada6cd3a6804e68e1b",
        "1ba9826431ddc9805e815ad92acc811c819f2bfd32bda2a128b8c4b5070fab5e",
    ),
)


def fetch_build(build: NpmBuild, folder: Path, registry: str = REGISTRY) -> str:
    """The text of ``build``: its package's tarball downloaded into ``folder`` and checked, the
    file read from it and checked, and refused if inlining would cut it."""
    tarball = download(
        build.tarball(registry), folder / f"{build.package}.tgz", build.tarball_sha256
    )
    with tarfile.open(tarball) as archive:
        member = archive.extractfile(build.path) if build.path in archive.getnames() else None
        if member is None:
            raise LearnableSparsityError(f"{tarball} ({build.package}) holds no file {build.path}")
        data = member.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != build.sha256:
        raise LearnableSparsityError(
            f"{build.package}: {build.path} has SHA-256 {digest}, not the pinned {build.sha256}"
        )
    text = data.decode("utf-8")
    cut = [marker for marker in FORBIDDEN if marker in text]
    if cut:
        raise LearnableSparsityError(f"{build.package}: {build.path} holds {cut}: cannot inline it")
    return text


def page(texts: Mapping[str, str]) -> str:
    """The template: DVC's default page, with the builds (package → text) inlined in its head in
    place of DVC's script tags."""
    scripts = "\n".join(
        f'    <script data-package="{package}">\n{text}\n</script>'
        for package, text in texts.items()
    )
    return f"""<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    {{refresh_tag}}
    <title>DVC Plot</title>
    <!-- made by `python -m pipelines.commands.plots_page`: builds DVC loads from a CDN -->
{scripts}
    <style>
        table {{
            border-spacing: 15px;
        }}
    </style>
</head>
<body>
    {CHARTS_PLACEHOLDER}
</body>
</html>
"""


def inlined(template: str) -> dict[str, str]:
    """The builds a template inlines: package (``vega@5.20.2``) → text."""
    return dict(INLINED.findall(template))


def build_template(path: Path = TEMPLATE, registry: str = REGISTRY) -> int:
    """Write the template to ``path`` (atomically) from the registry; its size in bytes."""
    with tempfile.TemporaryDirectory() as folder:
        texts = {build.package: fetch_build(build, Path(folder), registry) for build in BUILDS}
    text = page(texts)
    atomic_write_text(path, text)
    return len(text.encode("utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", default=REGISTRY, help="an npm registry (its mirror)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        size = build_template(TEMPLATE, args.registry)
    except LearnableSparsityError as error:
        log.error("%s", error)
        raise SystemExit(1) from None
    log.info("%s: %d bytes, %s inlined", TEMPLATE, size, ", ".join(b.package for b in BUILDS))


if __name__ == "__main__":
    main()
