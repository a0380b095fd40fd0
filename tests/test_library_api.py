"""The library's face: ``learnable_sparsity.__all__`` (the one list of the public API, documented
in docs/library.md), a light top-level import, the nn.Modules and the errors that name an extra."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import learnable_sparsity as ls
from learnable_sparsity.core.attention import ALPHA_MAX, ALPHA_MIN
from learnable_sparsity.core.normalizers import entmax, entmax15, sparsemax, topk_softmax
from learnable_sparsity.extras import EXTRAS, needs_extra

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_API = {
    "__version__",
    "softmax",
    "sparsemax",
    "entmax15",
    "entmax",
    "topk_softmax",
    "Sparsemax",
    "Entmax15",
    "Entmax",
    "EntmaxAlpha",
    "TopkSoftmax",
    "MultiHeadAttention",
    "entmax_attention",
    "Normalizer",
    "NORMALIZERS",
    "LearnableSparsityError",
}


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_the_public_api_is_all_and_every_name_imports() -> None:
    assert set(ls.__all__) == PUBLIC_API
    assert len(ls.__all__) == len(PUBLIC_API)
    for name in ls.__all__:
        assert getattr(ls, name) is not None, name
    assert ls.sparsemax is sparsemax and ls.MultiHeadAttention.__name__ == "MultiHeadAttention"
    with pytest.raises(AttributeError, match="no attribute 'sparsemax_bisect'"):
        _ = ls.sparsemax_bisect


def test_docs_list_the_public_api() -> None:
    text = (ROOT / "docs" / "library.md").read_text()
    section = text.split("## The public API", 1)[1].split("\n## ", 1)[0]
    heads = [line.split("`:", 1)[0] + "`" for line in section.splitlines() if line[:2] == "- "]
    listed = {name for head in heads for name in re.findall(r"`([A-Za-z_0-9]+)`", head)}
    assert listed == set(ls.__all__)


def test_the_version_is_the_distributions() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert ls.__version__ == pyproject["project"]["version"]


def test_the_top_level_import_is_light() -> None:
    heavy = ("torch", "transformers", "sentencepiece", "mlflow", "ray", "numpy")
    result = _run(
        "import sys, learnable_sparsity as ls; ls.__version__; "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# A meta-path finder that makes ``name`` (and its submodules) unimportable, as in a light install.
_BLOCK = """
import sys
class Blocker:
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] == {name!r}:
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
sys.meta_path.insert(0, Blocker())
for loaded in [m for m in sys.modules if m.partition(".")[0] == {name!r}]:
    del sys.modules[loaded]
try:
    import {module}
except ModuleNotFoundError as error:
    print(error.name, "|", error)
else:
    print("imported")
"""


@pytest.mark.parametrize(
    ("missing", "module", "extra"),
    [
        ("transformers", "learnable_sparsity.hf.attention", "hf"),
        ("sentencepiece", "learnable_sparsity.data.bpe", "pipeline"),
        ("sacrebleu", "learnable_sparsity.metrics.translation", "pipeline"),
        # through an import chain: the NMT training imports the BPE model
        ("sentencepiece", "learnable_sparsity.nmt.batching", "pipeline"),
    ],
)
def test_an_import_without_its_extra_names_the_extra(missing: str, module: str, extra: str) -> None:
    result = _run(_BLOCK.format(name=missing, module=module))
    assert result.returncode == 0, result.stderr
    name, _, message = result.stdout.strip().partition(" | ")
    assert name == missing
    assert f'pip install "learnable-sparsity[{extra}]"' in message
    assert f"needs {missing}" in message


def test_the_core_imports_without_any_extra() -> None:
    blocked = "".join(
        _BLOCK.format(name=name, module="os").replace("import os", "pass")
        for name in ("transformers", "numpy", "sentencepiece", "yaml")
    )
    result = _run(
        blocked + "import learnable_sparsity as ls; ls.MultiHeadAttention; ls.EntmaxAlpha; "
        "print('core ok')"
    )
    assert result.returncode == 0, result.stderr
    assert "core ok" in result.stdout


def test_needs_extra_passes_this_packages_own_missing_modules_through() -> None:
    with pytest.raises(ModuleNotFoundError) as caught, needs_extra("hf", "m"):
        import learnable_sparsity.no_such_module  # noqa: F401
    assert "pip install" not in str(caught.value)
    with pytest.raises(ValueError, match="extra must be one of"), needs_extra("gpu", "m"):
        pass


def test_the_extras_named_are_pyprojects() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(EXTRAS) == set(pyproject["project"]["optional-dependencies"]) - {"dev"}


def _third_party_imports_outside_needs_extra(path: Path) -> list[str]:
    """Module-level imports of packages other than the standard library, torch and this one that
    are not inside a ``with needs_extra(...)`` block."""
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
        for name in names:
            top = (name or "").partition(".")[0]
            if top and top not in sys.stdlib_module_names | {"torch", "learnable_sparsity"}:
                found.append(name)
    return found


def test_every_library_import_of_an_extra_goes_through_needs_extra() -> None:
    offenders = {}
    for path in sorted((ROOT / "learnable_sparsity").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("learnable_sparsity/core/triton"):
            continue  # the Triton kernels are imported only where Triton is (fused_triton)
        if found := _third_party_imports_outside_needs_extra(path):
            offenders[relative] = found
    assert not offenders


# --------------------------------------------------------------------------- the modules


def test_each_module_is_its_function() -> None:
    x = torch.randn(3, 4, 6)
    mask = torch.rand(3, 4, 6) > 0.3
    assert torch.equal(ls.Sparsemax(dim=1)(x), sparsemax(x, dim=1))
    assert torch.equal(ls.Entmax15()(x, mask), entmax15(x, mask=mask))
    assert torch.equal(ls.Entmax(1.3, dim=0)(x), entmax(x, 1.3, dim=0))
    assert torch.equal(ls.TopkSoftmax(2)(x, mask), topk_softmax(x, 2, mask=mask))
    with pytest.raises(ValueError, match="alpha must be at least 1"):
        ls.Entmax(0.5)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        ls.TopkSoftmax(0)


def test_entmax_alpha_learns_one_alpha_per_head_in_range() -> None:
    scores = torch.randn(2, 3, 5, 7)  # [batch, heads, queries, keys]
    module = ls.EntmaxAlpha((3, 1, 1), alpha_init=1.2)
    assert module.alpha.shape == (3, 1, 1) and torch.allclose(module.alpha, torch.tensor(1.2))
    p = module(scores)
    assert torch.allclose(p, entmax(scores, torch.full((3, 1, 1), 1.2)), atol=1e-6)
    (p * torch.randn_like(p)).sum().backward()
    assert module.alpha_logit.grad is not None and module.alpha_logit.grad.shape == (3, 1, 1)
    with torch.no_grad():
        module.alpha_logit.copy_(torch.tensor([-50.0, 0.0, 50.0]).view(3, 1, 1))
    assert module.alpha.min() >= ALPHA_MIN and module.alpha.max() <= ALPHA_MAX
    with pytest.raises(ValueError, match="alpha_init must lie in"):
        ls.EntmaxAlpha(alpha_init=2.5)
