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
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

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
PRIVATE_FILE_MODE = 0o600  # a store this project creates: its owner's only
PRIVATE_FOLDER_MODE = 0o700
# The tables whose rows name artifact locations (mlflow.store.tracking.dbmodels.models).
_ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
)


def tracking_uri(start: Path) -> str:
    """``$MLFLOW_TRACKING_URI`` if set (checked by :func:`checked_uri`), else the SQLite file
    ``mlflow.db`` at the project root around ``start`` (absolute; see :func:`project_root`)."""
    given = os.environ.get("MLFLOW_TRACKING_URI")
    return checked_uri(given) if given else f"sqlite:///{project_root(start) / 'mlflow.db'}"


# Tracking URIs naming a file of this machine: no authority, no credentials.
_LOCAL_SCHEMES = ("", "sqlite", "file")


def checked_uri(uri: str) -> str:
    """``uri`` (``MLFLOW_TRACKING_URI``) if it names a server (or database) by its address
    alone. A URI with user information (``http://user:password@host``, ``@`` anywhere after
    the scheme: a password may hold ``/`` or ``@``, which moves where a parser sees the
    authority end), or an authority that does not parse (a port that is not a number) is
    refused; the error shows the scheme only, never any part of the authority or what follows
    (the password could be anywhere in it)."""
    parts = urlsplit(uri)
    if parts.scheme in _LOCAL_SCHEMES:
        return uri  # a file of this machine (checked by prepare)
    shown = f"MLFLOW_TRACKING_URI ({parts.scheme}://… withheld)"
    if "@" in uri.partition("//")[2]:
        raise LearnableSparsityError(
            f"{shown} holds user information (an '@'), which would be logged and shown to every "
            "Ray job: give the server's address alone and the credentials in "
            "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or ~/.mlflow/credentials "
            "(docs/tracking.md)"
        )
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise LearnableSparsityError(
            f"{shown} has an address whose port is not a number: give "
            "scheme://host[:port] (e.g. https://mlflow.example.org or http://127.0.0.1:5000)"
        ) from None
    if not parts.hostname:
        raise LearnableSparsityError(
            f"{shown} names no host: give scheme://host[:port] (e.g. http://127.0.0.1:5000)"
        )
    return uri


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


HEALTH_TIMEOUT_S = 10.0  # a server's /health answers at once; a slow proxy gets this long
# The grants that let a user log runs into an experiment (mlflow.server.auth.permissions).
WRITING_PERMISSIONS = ("EDIT", "MANAGE")


def grant_command(uri: str, user: str, experiment_id: str) -> str:
    """What an admin runs to let ``user`` log into the experiment (docs/tracking.md)."""
    return (
        f'an admin runs: python -c "from mlflow.server import get_app_client; '
        f"get_app_client('basic-auth', tracking_uri='{uri}').grant_user_permission("
        f"'{user}', 'experiment', '{experiment_id}', 'EDIT')\""
    )


def check_access(uri: str, experiment: str) -> None:
    """Before any work: the server at ``uri`` (nothing to check for a SQLite store) takes the
    credentials given and lets their user log runs into ``experiment``: an admin, or a user
    with EDIT or MANAGE on it (a user who may create it, if it does not exist yet: its creator
    gets MANAGE). Reads only. A refusal raises naming what to set or the grant to ask for."""
    if not uri.startswith(("http://", "https://")):
        return
    try:  # MLflow's client retries an unreachable server for minutes
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=HEALTH_TIMEOUT_S).close()
    except (urllib.error.URLError, OSError) as error:
        raise LearnableSparsityError(
            f"the MLflow tracking server {uri} does not answer ({getattr(error, 'reason', error)})"
            ": start it, or set MLFLOW_TRACKING_URI to one that runs (docs/tracking.md)"
        ) from None
    try:
        found = retry(MlflowClient(uri).get_experiment_by_name, experiment)
    except MlflowException as error:
        if error.error_code == "PERMISSION_DENIED":
            raise _no_grant(uri, experiment, "no permission to read it", None) from None
        if error.error_code in REFUSED_CODES:
            raise refused(error, uri) from None
        raise
    from mlflow.utils.credentials import read_mlflow_creds

    user = read_mlflow_creds().username
    if found is None or user is None:
        return  # created by its first stage; or a server without authentication
    from mlflow.server import get_app_client

    auth = get_app_client("basic-auth", tracking_uri=uri)
    try:
        if auth.get_user(user).is_admin:
            return
        permission = auth.get_user_permission(user, "experiment", found.experiment_id).permission
    except MlflowException as error:
        if error.error_code == "ENDPOINT_NOT_FOUND":
            return  # a server without authentication: anyone may log
        raise
    if permission not in WRITING_PERMISSIONS:
        raise _no_grant(uri, experiment, f"only {permission}", found.experiment_id, user)


def _no_grant(
    uri: str, experiment: str, has: str, experiment_id: str | None, user: str | None = None
) -> LearnableSparsityError:
    from mlflow.utils.credentials import read_mlflow_creds

    user = user or read_mlflow_creds().username or "<user>"
    fix = grant_command(uri, user, experiment_id or "<experiment id>")
    return LearnableSparsityError(
        f"the MLflow tracking server {uri} gives user {user!r} {has} on experiment "
        f"{experiment!r}; logging runs needs EDIT: {fix} (docs/tracking.md)"
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
    check_access(uri, experiment)
    database = _sqlite_path(uri)
    location = None
    if database is not None:
        _private_store(database)
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


def _private_store(database: Path) -> None:
    """The SQLite file created readable by its owner only (0600; SQLite gives its journal the
    same mode) and its artifacts folder 0700: runs, params and models are nobody else's to
    read. Existing ones are left as they are."""
    database.parent.mkdir(parents=True, exist_ok=True)
    if not database.exists():
        os.close(os.open(database, os.O_CREAT | os.O_WRONLY, PRIVATE_FILE_MODE))
    artifacts = database.parent / ARTIFACTS_FOLDER
    if not artifacts.exists():
        artifacts.mkdir(mode=PRIVATE_FOLDER_MODE)


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
