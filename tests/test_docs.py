"""The README and docs/: every relative link (and image) resolves, anchors (headings' and HTML
``<a id>``) included; the Python
examples of docs/ run as written; the README stays short (the details live in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", flags=re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", flags=re.DOTALL)
# [text](target) and ![alt](target), the text possibly over several lines; an optional title.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", flags=re.MULTILINE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, …
HTML_ANCHOR = re.compile(r'<a id="([^"]+)"')  # e.g. a claim's row in claims.md


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans, which hold no links or headings."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: links reduced to their text, lower case, punctuation other
    than '-' and '_' dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2, … for repeated headings, and every HTML
    anchor ``<a id="...">``."""
    seen: dict[str, int] = {}
    text = FENCE.sub("", page.read_text())
    found = set(HTML_ANCHOR.findall(text))
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file, or heading, does not exist."""
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text(
        '# A heading, with `code`\n\n## Twice\n\n## Twice\n\n| <a id="row"></a>x |\n'
    )
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-with-code) [ok](there.md#twice-1)\n"
        "[ok](there.md#row)\n"
        "![missing image](figure.png) [missing](gone.md) [bad anchor](there.md#nowhere)\n"
        "[ok, external](https://example.org/x.md) [ok, in the page](#heading)\n\n"
        "# Heading\n\n`[not a link](gone.md)`\n\n```md\n[not a link](gone.md)\n```\n"
    )
    assert [problem.split(":")[0] for problem in broken_links(page)] == [
        "figure.png",
        "gone.md",
        "there.md#nowhere",
    ]


def test_the_docs_python_examples_run() -> None:
    ran = 0
    for page in PAGES[1:]:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL):
            exec(compile(block, str(page), "exec"), {})
            ran += 1
    assert ran, "docs/ has no ```python example"


def test_the_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move details to docs/"
