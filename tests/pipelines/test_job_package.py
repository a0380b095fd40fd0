"""What ``--submit`` hands Ray as the job's working directory
(:func:`pipelines.sweeps.run.job_package`): an allow-list of the git-tracked files and the trials'
inputs, packed here the way Ray packs a
working directory (its own ``create_package``), without a cluster. Planted secrets (a git-ignored
``.env`` with a password, ``secrets/credentials``) never travel; a secret that git tracks or
that lies in an input folder is refused, naming it."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest
from ray._private.runtime_env.packaging import create_package

from learnable_sparsity.errors import LearnableSparsityError
from pipelines.sweeps.run import job_package

PASSWORD = "hunter2-planted"


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout with tracked code, DVC-made data (git-ignored) and planted secrets."""
    root = tmp_path / "checkout"
    files = {
        "pipelines/stage.py": "print('a stage')\n",
        ".gitignore": "/data/\n.env\nsecrets/\n/models/\n",
        ".rayignore": "/pipelines/\n",  # would drop the code if Ray read it
        "data.dvc.yaml": "outs: []\n",
        "sweeps/new.yaml": "stages: []\n",  # not committed yet, not ignored: it goes
        # git-ignored, not tracked:
        ".env": f"MLFLOW_TRACKING_PASSWORD={PASSWORD}\n",
        "secrets/credentials": f"[mlflow]\nmlflow_tracking_password = {PASSWORD}\n",
        "data/images/meta.json": '{"kind": "images"}\n',
        "data/images/.gitignore": "/train.pt\n",
        "data/images/train.pt": "tensors\n",
        "data/cache/mnist.gz": "a download no trial reads\n",
        "models/old/last.pt": "a checkpoint\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    _git(root, "init", "-q")
    _git(root, "add", "pipelines/stage.py", ".gitignore", ".rayignore", "data.dvc.yaml")
    return root


def _packed(package: Path, tmp_path: Path) -> dict[str, bytes]:
    """The zip Ray makes of the working directory ``package`` (names → bytes)."""
    target = tmp_path / "package.zip"
    create_package(str(package), target, include_gitignore=True, excludes=[])
    with zipfile.ZipFile(target) as zipped:
        return {i.filename: zipped.read(i) for i in zipped.infolist() if not i.is_dir()}


def test_the_package_holds_tracked_files_and_inputs_only(checkout: Path, tmp_path: Path) -> None:
    package = tmp_path / "package"
    package.mkdir()
    staged = job_package(checkout, [Path("data/images"), Path("data/absent")], package)
    assert staged == [
        "data.dvc.yaml",
        "data/images/meta.json",
        "data/images/train.pt",
        "pipelines/stage.py",
        "sweeps/new.yaml",
    ]
    packed = _packed(package, tmp_path)
    assert sorted(packed) == staged
    assert packed["data/images/train.pt"] == b"tensors\n"
    assert not any(PASSWORD.encode() in data for data in packed.values())


@pytest.mark.parametrize(
    ("planted", "input_folder"),
    [(".env", None), ("config/prod.env", None), ("secrets/token", "secrets")],
)
def test_a_secret_tracked_or_in_an_input_is_refused(
    checkout: Path, tmp_path: Path, planted: str, input_folder: str | None
) -> None:
    (checkout / planted).parent.mkdir(parents=True, exist_ok=True)
    (checkout / planted).write_text(f"PASSWORD={PASSWORD}\n")
    if input_folder is None:
        _git(checkout, "add", "-f", planted)
    inputs = [Path(input_folder)] if input_folder else []
    package = tmp_path / "package"
    package.mkdir()
    with pytest.raises(LearnableSparsityError, match=r"would hold \[.*look like secrets") as error:
        job_package(checkout, inputs, package)
    assert planted in str(error.value) and PASSWORD not in str(error.value)
    assert not any(package.iterdir())  # refused before anything is staged


def test_an_input_outside_the_checkout_or_no_checkout_is_refused(
    checkout: Path, tmp_path: Path
) -> None:
    with pytest.raises(LearnableSparsityError, match="outside"):
        job_package(checkout, [tmp_path], tmp_path / "package")
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(LearnableSparsityError, match="is not a git checkout"):
        job_package(plain, [], tmp_path / "package")
