"""The MLflow store every run goes to: where it is, its experiment, and retries of every call.

The default store is the SQLite file ``mlflow.db`` at the project's root: the git repository's
top level, or ``$DVC_ROOT``, the real repository of a ``dvc exp run --queue/--temp`` experiment,
which runs in a copy under ``.dvc/tmp/exps/`` (a store there would be thrown away with the copy).
Its experiments keep their artifacts in ``<directory of the DB>/mlartifacts/<experiment>``; a
project copied or moved with its store has its artifact locations moved along on first use. A
server (``MLFLOW_TRACKING_URI=http://...``) decides for itself; one with authentication
(``mlflow server --app-name basic-auth``, docs/tracking.md) takes the credentials MLflow reads
from ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` or ``~/.mlflow/credentials``, never
from the URI: a URI is logged, printed and handed to Ray jobs, so one holding a password is
refused, and a server that refuses the credentials stops a stage before any work.
Many tasks writing to one SQLite file can meet "database is locked": every call to the store
goes through :func:`retry`, with exponential backoff.
"""

from __future__ import annotations

import logging
import os
import random
import re
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import Settings, SettingsError

log = logging.getLogger(__name__)
T = TypeVar("T")

_RETRY_ATTEMPTS = 10
_RETRY_FIRST_DELAY_S = 0.1
_RETRY_MAX_DELAY_S = 5.0

# Makes the MLflow UI open an experiment on its runs table (MLflow 3 defaults to the GenAI view).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
ARTIFACTS_FOLDER = "mlartifacts"
# The tables whose rows name artifact locations (mlflow.store.tracking.dbmodels.models).
_ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
)


def tracking_uri(start: Path) -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else the SQLite file ``mlflow.db`` at the project root
    around ``start`` (absolute; see :func:`project_root`). A URI with a password in it
    (``http://user:password@host``) is refused, the password left out of the error."""
    given = os.environ.get("MLFLOW_TRACKING_URI")
    if given and _USERINFO.search(given):
        raise LearnableSparsityError(
            f"MLFLOW_TRACKING_URI ({_USERINFO.sub('//***@', given)}) holds credentials, which "
            "would be logged and shown to every Ray job: give the server's address alone and "
            "the credentials in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or "
            "~/.mlflow/credentials (docs/tracking.md)"
        )
    return given or f"sqlite:///{project_root(start) / 'mlflow.db'}"


# The user information of a URL ("//user:password@" or "//token@"), where credentials would hide.
_USERINFO = re.compile(r"//[^/@]*@")
# What a tracking server answers to requests without (valid) credentials, or without the right.
REFUSED_CODES = ("UNAUTHENTICATED", "PERMISSION_DENIED")


def refused(error: MlflowException, uri: str) -> LearnableSparsityError:
    """The error a stage stops with when the tracking server at ``uri`` refused a request:
    what to set, by name."""
    given = "the credentials given" if _credentials_given() else "no credentials"
    return LearnableSparsityError(
        f"the MLflow tracking server {uri} refused the request ({error.error_code}) with "
        f"{given}: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or write them in "
        "~/.mlflow/credentials on every machine that logs (docs/tracking.md), for a user with "
        "the right to edit the experiment"
    )


def _credentials_given() -> bool:
    from mlflow.utils.credentials import read_mlflow_creds

    return read_mlflow_creds().username is not None


def project_root(start: Path) -> Path:
    """The repository whose store a run belongs in: ``$DVC_ROOT`` when DVC runs the stage (for a
    queued or ``--temp`` experiment that is the user's repository, not the copy the stage runs
    in), else the top level of the git repository around ``start``."""
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=start,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        top = ""
    if not top:
        raise LearnableSparsityError(
            f"{start.resolve()} is not inside the project's git repository, so there is no "
            "project store to log to (a Ray job runs in a copy of the working directory): set "
            "MLFLOW_TRACKING_URI to a tracking server (http://host:5000) or to "
            "sqlite:////absolute/path/mlflow.db"
        )
    return Path(top).resolve()


def prepare(uri: str, experiment: str) -> str:
    """Create the store (a new SQLite DB migrates its schema) and ``experiment``; its id. A
    server that refuses the credentials (or their absence) raises :func:`refused`'s error.

    Call it once in the driver before fanning out: tasks that open a fresh SQLite DB at the same
    time race in the migration. Idempotent. A new experiment of a SQLite store gets the absolute
    artifact location ``<DB directory>/mlartifacts/<experiment>``.
    """
    if not isinstance(experiment, str) or not experiment.strip():
        raise LearnableSparsityError(
            f"mlflow.experiment must be a non-empty name, got {experiment!r}"
        )
    database = _sqlite_path(uri)
    location = None
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
        folder = re.sub(r"[^A-Za-z0-9_-]", "_", experiment)
        location = (database.parent / ARTIFACTS_FOLDER / folder).as_uri()
    client = MlflowClient(uri)
    try:
        found = retry(client.get_experiment_by_name, experiment)
    except MlflowException as error:
        if error.error_code in REFUSED_CODES:
            raise refused(error, uri) from None
        raise
    if found is None:
        try:
            return retry(client.create_experiment, experiment, location, tags=EXPERIMENT_KIND)
        except MlflowException as error:
            if error.error_code in REFUSED_CODES:
                raise refused(error, uri) from None
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            # Created meanwhile by another driver.
            found = retry(client.get_experiment_by_name, experiment)
    if database is not None and found.artifact_location != location:
        _relocate(database, found.artifact_location, location)
    for key, value in EXPERIMENT_KIND.items():
        if found.tags.get(key) != value:
            retry(client.set_experiment_tag, found.experiment_id, key, value)
    if found.lifecycle_stage != "active":
        raise LearnableSparsityError(
            f"MLflow experiment {experiment!r} (id {found.experiment_id}) in {uri} is deleted; "
            f"restore it (mlflow experiments restore --experiment-id {found.experiment_id}) "
            "or choose another mlflow.experiment"
        )
    return found.experiment_id


def _relocate(database: Path, found: str, wanted: str) -> None:
    """Point the artifact locations of a store that was copied or moved with its project (they
    name ``<old root>/mlartifacts/...``) at the store's own ``mlartifacts`` folder, so that the
    copy does not write into the original. A location the user chose elsewhere is left alone."""
    old = found.rpartition(f"/{ARTIFACTS_FOLDER}/")[0]
    new = wanted.rpartition(f"/{ARTIFACTS_FOLDER}/")[0]
    if not old or not found.startswith("file://") or old == new:
        return
    old, new = f"{old}/{ARTIFACTS_FOLDER}/", f"{new}/{ARTIFACTS_FOLDER}/"
    with sqlite3.connect(database, timeout=60) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        for table, column in _ARTIFACT_COLUMNS:
            if table in tables:
                connection.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                    f"WHERE substr({column}, 1, ?) = ?",
                    (new, len(old) + 1, len(old), old),
                )
    log.warning("the MLflow store %s was moved: its artifacts now go to %s", database, new)


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:////abs/path`` URI; None for a server or other DB."""
    scheme, colon, _ = uri.partition(":")
    scheme = scheme if colon else ""
    if scheme in ("", "file"):
        raise LearnableSparsityError(
            f"tracking URI {uri!r} is a file store, which MLflow 3.17 refuses; use "
            "sqlite:////absolute/path/mlflow.db or a server (MLFLOW_TRACKING_URI=http://host:5000)"
        )
    if scheme != "sqlite":
        return None
    path = Path(uri.removeprefix("sqlite:///"))
    if not uri.startswith("sqlite:///") or not path.is_absolute():
        raise LearnableSparsityError(
            f"tracking URI {uri!r} must name the SQLite file by an absolute path "
            "(sqlite:////absolute/path/mlflow.db): tasks and DVC experiments run elsewhere"
        )
    return path


def _transient(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a busy database or an unavailable server."""
    seen: BaseException | None = error
    while seen is not None:
        if (
            getattr(seen, "error_code", None) == "TEMPORARILY_UNAVAILABLE"
            or type(seen).__name__ == "OperationalError"
            or "database is locked" in str(seen)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def retry(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, retried with jittered exponential backoff while transient."""
    delay, attempt = _RETRY_FIRST_DELAY_S, 1
    while True:
        try:
            return call(*args, **kwargs)
        except Exception as error:
            if attempt == _RETRY_ATTEMPTS or not _transient(error):
                raise
            log.warning("MLflow busy (%s); attempt %d failed, retrying", error, attempt)
            time.sleep(delay * random.uniform(1.0, 2.0))
            delay, attempt = min(2 * delay, _RETRY_MAX_DELAY_S), attempt + 1


@dataclass(frozen=True, kw_only=True)
class MlflowSettings(Settings):
    """Params ``mlflow``: the experiment every stage logs its runs to."""

    experiment: str

    def validate(self) -> None:
        if not self.experiment.strip():
            raise SettingsError("experiment", "must be a non-empty name")
