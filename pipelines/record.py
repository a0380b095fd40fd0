"""Keep the current run as an evidence record: ``python -m pipelines.record <name>``.

A record is a run too long for ``make repro`` (the ``evidence`` profile's, say) kept in git under
``reports/<name>/``, so that a reader sees what it showed without rerunning it:

* ``results.json`` — the results the claims read (the claims stage's
  ``results/claims/results.json``);
* ``record.json`` — the profile, when it was kept, the commit of the code that kept it (and
  whether ``learnable_sparsity/`` or ``pipelines/`` had uncommitted changes), the environment's
  lock and digest (and whether the environment matched it: :mod:`pipelines.scaffold.lock`), and
  every claim threshold it was judged with;
* ``index.md``, ``tables.md``, ``tables/``, ``figures/`` — the report of the run, with every link
  relative and resolving inside the record (figures re-encoded as small PNGs, so that git holds
  them); its claims section points to ``claims.md``.

The verdicts themselves are not kept: stage ``rejudge@<name>`` (``dvc repro``) writes
``claims.md`` / ``claims.json`` from ``results.json`` with today's checks, so a record never shows
verdicts its code no longer gives. A record folder's own ``README.md`` (provenance in words,
investigations) is left as it is.
"""

from __future__ import annotations

import argparse
import datetime
import io
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

from PIL import Image

from learnable_sparsity.claims import load_claims
from learnable_sparsity.data.atomic import atomic_write_bytes, atomic_write_text
from learnable_sparsity.errors import LearnableSparsityError
from pipelines.scaffold import layout
from pipelines.scaffold.files import read_json, write_json
from pipelines.scaffold.imports import ROOT
from pipelines.scaffold.lock import locked_environment

log = logging.getLogger(__name__)

# Figures are kept at most this wide (pixels) in a 256-colour palette: a few tens of kB each,
# still legible (the stages draw them at 150 dpi for the MLflow UI).
FIGURE_WIDTH = 1000
FIGURE_COLOURS = 256
# What a record keeps of a run's report (relative to reports/), besides the figures it links.
REPORT_FILES = (Path("index.md"), Path("tables.md"))
_LINK = re.compile(r"\]\(([^)#\s]+)\)")
# The claims sections (the matrix of every run, this run's table): one pointer replaces them.
_CLAIMS_SECTION = re.compile(r"(?:^## The papers' claims.*?(?=^## ))+", re.DOTALL | re.MULTILINE)


def relative_links(markdown: str) -> list[str]:
    """The relative link targets of a Markdown text (no URLs, anchors or absolute paths)."""
    return [
        target
        for target in _LINK.findall(markdown)
        if "://" not in target and not target.startswith(("/", "mailto:"))
    ]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def small_png(path: Path) -> bytes:
    """The PNG at ``path`` at most :data:`FIGURE_WIDTH` pixels wide, in a palette."""
    with Image.open(path) as image:
        image = image.convert("RGB")
        if image.width > FIGURE_WIDTH:
            height = round(image.height * FIGURE_WIDTH / image.width)
            image = image.resize((FIGURE_WIDTH, height), Image.Resampling.LANCZOS)
        buffer = io.BytesIO()
        image.quantize(FIGURE_COLOURS).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def _report_text(source: Path, name: str) -> str:
    """A report file of the run, with the claims sections (verdicts that would go stale: the
    matrix and the table) replaced by a pointer to the record's re-judged ``claims.md``."""
    text = source.read_text(encoding="utf-8")
    pointer = (
        "## The papers' claims\n\n"
        f"Judged with today's checks by stage `rejudge@{name}` (`dvc repro`): see "
        f"[claims.md]({layout.RECORD_CLAIMS_REPORT}).\n\n"
    )
    return _CLAIMS_SECTION.sub(lambda _: pointer, text, count=1)


def keep(name: str) -> Path:
    """Copy the current run's results and report into ``reports/<name>/`` (see the module)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name) or name in ("tables", "figures"):
        raise LearnableSparsityError(f"record name {name!r}: use lower-case letters, digits, _ -")
    results = layout.results("claims") / "results.json"
    claims = layout.results("claims") / "claims.json"
    sources = [results, claims, *(layout.REPORTS / f for f in REPORT_FILES)]
    absent = [str(path) for path in sources if not path.exists()]
    if absent:
        raise LearnableSparsityError(
            f"nothing to keep: {', '.join(absent)} missing (run `make repro` on the profile first)"
        )
    texts = {f: _report_text(layout.REPORTS / f, name) for f in REPORT_FILES}
    linked = sorted({t for text in texts.values() for t in relative_links(text)})
    unresolved = [
        t for t in linked if t != layout.RECORD_CLAIMS_REPORT and not (layout.REPORTS / t).exists()
    ]
    if unresolved:
        raise LearnableSparsityError(f"the report links files that are not there: {unresolved}")
    folder = layout.record(name)
    for stale in ("index.md", "tables.md", "tables", "figures", layout.RECORD_RESULTS):
        target = folder / stale
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    for relative in linked:
        source, target = layout.REPORTS / relative, folder / relative
        if relative == layout.RECORD_CLAIMS_REPORT:
            continue
        data = small_png(source) if source.suffix == ".png" else source.read_bytes()
        atomic_write_bytes(target, data)
    for relative, text in texts.items():
        atomic_write_text(folder / relative, text)
    shutil.copyfile(results, folder / layout.RECORD_RESULTS)
    # The code only: params.yaml differs from the commit's by design (the profile applied).
    changed = _git("status", "--porcelain", "--", "learnable_sparsity", "pipelines")
    write_json(
        folder / layout.RECORD_META,
        {
            "profile": read_json(claims)["profile"],
            "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": _git("rev-parse", "HEAD"),
            "uncommitted_code_changes": bool(changed) if changed is not None else None,
            "environment": locked_environment().as_record(),
            "thresholds": {
                claim.id: {key: t.value for key, t in claim.thresholds.items()}
                for claim in load_claims()
                if claim.thresholds
            },
        },
    )
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the record's folder under reports/ (e.g. evidence)")
    name = parser.parse_args(argv).name
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        folder = keep(name)
    except LearnableSparsityError as error:
        log.error("record: %s", error)
        raise SystemExit(1) from None
    log.info(
        "kept %s; judge it with `dvc repro rejudge@%s` (a new record: add %r to the foreach of "
        "stage rejudge in dvc.yaml first), then commit the folder",
        folder,
        name,
        name,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
