"""Reading ``params.yaml``: dotted keys, sections as settings dataclasses, errors naming the key.

Every section a stage reads becomes the frozen settings dataclass of the component that uses it
(``learnable_sparsity.settings``), built and validated once in the driver before any work starts:
``params.settings("nmt", NmtSettings)``. Errors name the file and the full key, e.g.
``params.yaml: nmt.train.peak_lr must be > 0, got -0.001``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import Settings, SettingsError, build

PARAMS_FILE = Path("params.yaml")
# The profiles' overlays, found beside the code (a Ray job's copy of the checkout holds them too).
PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"
SMOKE = "smoke"  # the profile params.yaml holds as committed
S = TypeVar("S", bound=Settings)
T = TypeVar("T")


class Params:
    """A params mapping that remembers where it came from, for error messages."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data, self.source = data, source

    def _where(self, key: str) -> str:
        return f"{self.source}: {key}"

    def get(self, key: str, kind: type | tuple[type, ...] = object) -> Any:
        """The value at dotted ``key`` (e.g. ``nmt.train.max_steps``), checked to be a ``kind``."""
        node: Any = self.data
        walked = []
        for part in key.split("."):
            walked.append(part)
            if not isinstance(node, Mapping) or part not in node:
                raise LearnableSparsityError(f"{self._where('.'.join(walked))} is missing")
            node = node[part]
        expected = kind if isinstance(kind, tuple) else (kind,)
        wrong_bool = isinstance(node, bool) and bool not in expected and int in expected
        if not isinstance(node, kind) or wrong_bool:
            names = " or ".join(k.__name__ for k in expected)
            raise LearnableSparsityError(f"{self._where(key)} must be {names}, got {node!r}")
        return node

    def settings(self, key: str, cls: type[S], **derived: Any) -> S:
        """The section at dotted ``key`` as the settings dataclass ``cls`` (plus ``derived``
        fields), validated; errors name the file and the full key."""
        try:
            return build(cls, self.get(key, Mapping), key, **derived)
        except SettingsError as error:
            raise LearnableSparsityError(f"{self.source}: {error}") from None

    def entries(self, key: str, build_entry: Callable[[Any, str], T]) -> dict[str, T]:
        """Every entry of the mapping at ``key`` (named datasets, corpora) built by
        ``build_entry(value, full key)``, which raises ``SettingsError``; errors name the file."""
        try:
            return {
                name: build_entry(value, f"{key}.{name}")
                for name, value in self.get(key, Mapping).items()
            }
        except SettingsError as error:
            raise LearnableSparsityError(f"{self.source}: {error}") from None


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last one
    silently: a second ``seeds:`` would quietly replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"key {key!r} appears twice",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_params(path: Path = PARAMS_FILE) -> Params:
    """Parse ``path`` (YAML); a missing or malformed file raises an error naming it."""
    if not path.exists():
        raise LearnableSparsityError(f"params file {path} does not exist")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeys)  # safe: a SafeLoader
    except yaml.YAMLError as error:
        raise LearnableSparsityError(f"params file {path} is not valid YAML: {error}") from None
    if not isinstance(data, Mapping):
        raise LearnableSparsityError(f"params file {path} must hold a mapping at the top level")
    return Params(data, str(path))


def known_profiles(profiles: Path = PROFILES_DIR) -> list[str]:
    """``smoke`` (``params.yaml`` as committed) and the overlays ``profiles/<name>.yaml``."""
    return sorted({SMOKE, *(path.stem for path in profiles.glob("*.yaml"))})


def check_profile(params: Params, profiles: Path = PROFILES_DIR) -> str:
    """The params' ``profile``, which labels every run: a known profile's name
    (:func:`known_profiles`); another (a typo, ``papre``) is refused, listing them."""
    name = params.get("profile", str)
    known = known_profiles(profiles)
    if name not in known:
        raise LearnableSparsityError(
            f"{params.source}: profile {name!r} is not a known profile; known: {known} "
            f"(smoke and the files of {profiles})"
        )
    return name


def with_profile(smoke: Params, name: str, profiles: Path) -> Params:
    """The smoke params ``smoke`` with ``profiles/<name>.yaml`` applied (``smoke`` itself for
    ``name`` smoke); refuses params that already hold another profile."""
    current = smoke.get("profile", str)
    if name == current:
        return smoke
    overlay_file = profiles / f"{name}.yaml"
    if not overlay_file.exists():
        known = sorted(p.stem for p in profiles.glob("*.yaml"))
        raise LearnableSparsityError(f"no profile {name!r} ({overlay_file}); known: {known}")
    if current != "smoke":
        raise LearnableSparsityError(
            f"{smoke.source} holds the {current!r} profile; `git checkout {smoke.source}` first"
        )
    overlay = load_params(overlay_file).data
    return Params(deep_merge(smoke.data, {**overlay, "profile": name}), f"{smoke.source}+{name}")


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overlay``'s values; nested mappings are merged key by key."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
