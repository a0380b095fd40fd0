"""Run by ``library_footprint.py`` with the python of an environment it made: prints, as JSON, the
environment's distributions, those beyond torch and what torch requires, and the bytes of a
distribution's own files and of torch's closure. Standard library only (the environment has
torch and one library)."""

from __future__ import annotations

import json
import re
import sys
from importlib import metadata

# The first name of a requirement string: "typing-extensions>=4.10.0; ..." -> typing-extensions.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# The installers, present in any environment.
INSTALLERS = {"pip", "setuptools"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _own_bytes(distribution: metadata.Distribution) -> int:
    paths = [file.locate() for file in distribution.files or []]
    return sum(path.stat().st_size for path in paths if path.is_file())


def main(library: str) -> None:
    distributions = {_canonical(d.metadata["Name"]): d for d in metadata.distributions()}
    torch: set[str] = set()
    pending = ["torch"]
    while pending:
        name = pending.pop()
        if name in torch or name not in distributions:
            continue
        torch.add(name)
        for requirement in distributions[name].requires or []:
            if "extra ==" not in requirement:
                pending.append(_canonical(_NAME.match(requirement).group(0)))
    print(
        json.dumps(
            {
                "distributions": sorted(distributions),
                "beyond_torch": sorted(set(distributions) - torch - INSTALLERS),
                "own_bytes": _own_bytes(distributions[_canonical(library)]),
                "torch_closure_bytes": sum(_own_bytes(distributions[n]) for n in torch),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
