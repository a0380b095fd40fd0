"""How far this checkout's outputs are from the committed ones, and whether any verdict moved.

`make repro` ends with it: every file under ``results/`` and ``reports/`` (and ``dvc.lock``) that
differs from its committed version (``git HEAD``) is listed with what differs — for JSON and CSV
the numbers, aligned by their place (key path, row and column), with the largest absolute and
relative difference; for other text the changed lines (and their numbers, where a line kept its
place); for binary files (figures) only that they differ. Then every claim's verdict, run by run
(``results/claims/claims.json`` and each record's ``claims.json``), before and after, with each
comparison's own verdict (the entries of a claim's ``numbers`` that carry a ``status``): a moved
verdict is said plainly, with its evidence before and after.

The report is printed and written to ``results/comparison.md`` and ``results/comparison.json``
(git-ignored: comparing must not itself change the tree).

    python -m pipelines.commands.compare_outputs [--against HEAD]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines.scaffold.files import atomic_write_text
from pipelines.scaffold.imports import ROOT

COMPARED = ("results", "reports", "dvc.lock")
BINARY = {".png", ".jpg", ".pdf", ".gz", ".pt"}  # compared as bytes, whatever they decode to
REPORT = Path("results") / "comparison"
CLAIMS_FILES = re.compile(r"^(results/claims/claims\.json|reports/[^/]+/claims\.json)$")
# Numbers in text: what a table cell or a sentence prints (1,234.5 counts as 1234.5); the digits
# of a name (md5, fp64, seed0) are not.
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")
# Digests and commit ids (dvc.lock's md5s, a record's commit) are names, not numbers: their digit
# runs would read as numbers ("9e999" as infinity) and fill the report with moves that mean nothing.
HEX_NAME = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,}\b")


def _git(*args: str, root: Path) -> bytes:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, check=True).stdout


def changed_files(root: Path, against: str) -> list[str]:
    """Paths under :data:`COMPARED` whose bytes differ from ``against`` (tracked files only)."""
    out = _git("diff", "--name-only", "--no-renames", against, "--", *COMPARED, root=root)
    return sorted(line for line in out.decode().splitlines() if line)


def committed(root: Path, against: str, path: str) -> bytes | None:
    """The file at ``path`` in ``against``, None where it did not exist."""
    try:
        return _git("show", f"{against}:{path}", root=root)
    except subprocess.CalledProcessError:
        return None


def numbers_of(value: Any, where: str = "") -> Iterator[tuple[str, float]]:
    """Every number in a JSON value with its key path (``a.b[2].c``); booleans are not numbers."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numbers_of(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from numbers_of(item, f"{where}[{index}]")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield where, float(value)


def _csv_numbers(text: str) -> Iterator[tuple[str, float]]:
    for row, cells in enumerate(csv.reader(io.StringIO(text))):
        for column, cell in enumerate(cells):
            try:
                yield f"row {row} column {column}", float(cell)
            except ValueError:
                continue


def _text_numbers(text: str) -> Iterator[tuple[str, float]]:
    for row, line in enumerate(text.splitlines(), start=1):
        for column, found in enumerate(NUMBER.findall(HEX_NAME.sub(" ", line))):
            yield f"line {row} number {column}", float(found.replace(",", ""))


def difference(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The numbers that moved between two {place: number} maps: how many, the largest absolute
    and relative difference (relative to the committed number) and where; places only on one
    side are counted apart."""
    shared = sorted(set(before) & set(after))
    moved = [key for key in shared if not _same(before[key], after[key])]
    result: dict[str, Any] = {
        "numbers": len(shared),
        "moved": len(moved),
        "only_before": len(set(before) - set(after)),
        "only_after": len(set(after) - set(before)),
    }
    if moved:
        absolute = {key: abs(after[key] - before[key]) for key in moved}
        relative = {key: absolute[key] / abs(before[key]) for key in moved if before[key] != 0}
        worst = max(absolute, key=absolute.__getitem__)
        result |= {
            "max_abs": absolute[worst],
            "max_abs_at": worst,
            "before": before[worst],
            "after": after[worst],
        }
        if relative:
            worst_relative = max(relative, key=relative.__getitem__)
            result |= {"max_rel": relative[worst_relative], "max_rel_at": worst_relative}
    return result


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def compare_file(path: str, before: bytes | None, after: bytes | None) -> dict[str, Any]:
    """What differs in one file: ``identical``, ``added``/``removed``, or by kind (``json``,
    ``csv``, ``text``: :func:`difference` of their numbers, and for text the changed lines;
    ``binary``: the sizes)."""
    if before == after:
        return {"path": path, "kind": "identical"}
    if before is None or after is None:
        return {"path": path, "kind": "added" if before is None else "removed"}
    try:
        if Path(path).suffix in BINARY:
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "a binary format")
        old, new = before.decode("utf-8"), after.decode("utf-8")
    except UnicodeDecodeError:
        return {"path": path, "kind": "binary", "bytes": [len(before), len(after)]}
    if path.endswith(".json"):
        try:
            numbers = [dict(numbers_of(json.loads(text))) for text in (old, new)]
        except json.JSONDecodeError:
            numbers = None
        if numbers is not None:
            return {"path": path, "kind": "json", **difference(*numbers)}
    if path.endswith(".csv"):
        numbers = [dict(_csv_numbers(text)) for text in (old, new)]
        return {"path": path, "kind": "csv", **difference(*numbers)}
    old_lines, new_lines = old.splitlines(), new.splitlines()
    changed = sum(a != b for a, b in zip(old_lines, new_lines, strict=False))
    changed += abs(len(old_lines) - len(new_lines))
    numbers = difference(dict(_text_numbers(old)), dict(_text_numbers(new)))
    return {"path": path, "kind": "text", "changed_lines": changed, **numbers}


def verdicts(claims: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Claim id → its status, evidence and the status of each of its comparisons."""
    table = {}
    for claim in claims.get("claims", []):
        numbers = claim.get("numbers")
        if isinstance(numbers, str):  # some runs keep the numbers as their repr
            numbers = None
        parts = {
            key: value["status"]
            for key, value in (numbers or {}).items()
            if isinstance(value, dict) and isinstance(value.get("status"), str)
        }
        table[claim["id"]] = {
            "status": claim["status"],
            "evidence": claim.get("evidence", ""),
            "parts": parts,
        }
    return table


def moved_verdicts(run: str, before: bytes | None, after: bytes | None) -> list[dict[str, Any]]:
    """Every claim of one run whose verdict or a comparison's verdict differs."""
    old = verdicts(json.loads(before)) if before else {}
    new = verdicts(json.loads(after)) if after else {}
    moves = []
    for claim in sorted(set(old) | set(new)):
        a, b = old.get(claim), new.get(claim)
        if a is None or b is None:
            moves.append({"run": run, "claim": claim, "before": a and a["status"],
                          "after": b and b["status"], "parts": {}})  # fmt: skip
            continue
        parts = {
            key: [a["parts"].get(key), b["parts"].get(key)]
            for key in sorted(set(a["parts"]) | set(b["parts"]))
            if a["parts"].get(key) != b["parts"].get(key)
        }
        if a["status"] != b["status"] or parts:
            moves.append(
                {
                    "run": run,
                    "claim": claim,
                    "before": a["status"],
                    "after": b["status"],
                    "parts": parts,
                    "evidence_before": a["evidence"],
                    "evidence_after": b["evidence"],
                }
            )
    return moves


def compare(root: Path, against: str) -> dict[str, Any]:
    """The whole comparison of ``root``'s outputs with ``against``'s."""
    files, moves = [], []
    for path in changed_files(root, against):
        before = committed(root, against, path)
        after = (root / path).read_bytes() if (root / path).exists() else None
        files.append(compare_file(path, before, after))
        if CLAIMS_FILES.match(path):
            run = "smoke" if path.startswith("results/") else path.split("/")[1]
            moves += moved_verdicts(run, before, after)
    return {"against": against, "files": files, "moved_verdicts": moves}


def render(comparison: dict[str, Any]) -> str:
    """The comparison as Markdown: a summary line, the files, the moved verdicts."""
    files, moves = comparison["files"], comparison["moved_verdicts"]
    lines = [
        f"# This checkout's outputs against {comparison['against']}",
        "",
        f"{len(files)} output file(s) differ; {len(moves)} verdict(s) moved"
        + ("." if files else ": the outputs are the committed ones, byte for byte."),
        "",
    ]
    if files:
        lines += ["| file | what differs |", "|---|---|"]
        lines += [f"| {f['path']} | {_describe(f)} |" for f in files]
        lines.append("")
    for move in moves:
        parts = "; ".join(f"{key}: {a} → {b}" for key, (a, b) in move["parts"].items())
        lines += [
            f"- **{move['run']} `{move['claim']}`: {move['before']} → {move['after']}**"
            + (f" (comparisons moved: {parts})" if parts else ""),
        ]
        if "evidence_before" in move:
            lines += [
                f"  - before: {move['evidence_before']}",
                f"  - after: {move['evidence_after']}",
            ]
    return "\n".join(lines) + "\n"


def _describe(entry: dict[str, Any]) -> str:
    kind = entry["kind"]
    if kind in ("added", "removed", "identical"):
        return kind
    if kind == "binary":
        return f"binary, {entry['bytes'][0]} → {entry['bytes'][1]} bytes"
    text = f"{entry['moved']} of {entry['numbers']} numbers moved"
    if entry.get("changed_lines") is not None:
        text = f"{entry['changed_lines']} line(s) changed; {text}"
    if entry["moved"]:
        text += f", largest by {entry['max_abs']:.3g} ({entry['before']:.6g} → {entry['after']:.6g}"
        text += f" at {entry['max_abs_at']})"
        if "max_rel" in entry:
            text += f", relative {entry['max_rel']:.2g} at {entry['max_rel_at']}"
    if entry["only_before"] or entry["only_after"]:
        text += f"; {entry['only_before']} number(s) gone, {entry['only_after']} new"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="the commit compared with")
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    comparison = compare(args.root, args.against)
    text = render(comparison)
    atomic_write_text(args.root / REPORT.with_suffix(".md"), text)
    atomic_write_text(
        args.root / REPORT.with_suffix(".json"), json.dumps(comparison, indent=1) + "\n"
    )
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
