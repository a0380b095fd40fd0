"""An MLflow user for one person or one cluster, with one permission on one experiment.

Run by the tracking server's admin (docs/tracking.md), with the admin's credentials in
``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` or ``~/.mlflow/credentials``::

    python deploy/mlflow_user.py https://mlflow.example.org sweeps-node learnable-sparsity \\
        --permission EDIT --credentials sweeps-node.credentials

creates the user (a random password) unless it exists, the experiment unless it exists, and
grants the user the permission on it (``grant_user_permission`` of MLflow 3.17's basic-auth
client: READ to look, EDIT to log runs; a user without a grant sees nothing under
``default_permission = NO_PERMISSIONS``). A new user's credentials go to the ``--credentials``
file (mode 600, MLflow's format: it becomes the user's ``~/.mlflow/credentials``), never to the
screen. Prints the experiment's id.
"""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.server import get_app_client

PERMISSIONS = ("READ", "USE", "EDIT", "MANAGE")
PASSWORD_BYTES = 24  # token_urlsafe: 32 characters


def credentials_text(user: str, password: str) -> str:
    """``~/.mlflow/credentials`` of ``user``."""
    return f"[mlflow]\nmlflow_tracking_username = {user}\nmlflow_tracking_password = {password}\n"


def add_user(uri: str, user: str, experiment: str, permission: str, credentials: Path) -> str:
    """The user (created with a random password written to ``credentials`` if new), the
    experiment (created if new) and the grant; the experiment's id."""
    if permission not in PERMISSIONS:
        raise SystemExit(f"--permission must be one of {PERMISSIONS}, got {permission!r}")
    auth = get_app_client("basic-auth", tracking_uri=uri)
    try:
        auth.get_user(user)
    except MlflowException as error:
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        descriptor = os.open(credentials, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(credentials_text(user, password))
        auth.create_user(user, password)
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    auth.grant_user_permission(user, "experiment", experiment_id, permission)
    return experiment_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("uri", help="the tracking server, e.g. https://mlflow.example.org")
    parser.add_argument("user")
    parser.add_argument("experiment", help="params mlflow.experiment of the runs")
    parser.add_argument("--permission", default="EDIT", help=f"one of {PERMISSIONS}")
    parser.add_argument(
        "--credentials", type=Path, help="where a new user's credentials go (mode 600)"
    )
    args = parser.parse_args()
    credentials = args.credentials or Path(f"{args.user}.credentials")
    experiment_id = add_user(args.uri, args.user, args.experiment, args.permission, credentials)
    print(f"{args.user}: {args.permission} on experiment {args.experiment!r} (id {experiment_id})")


if __name__ == "__main__":
    main()
