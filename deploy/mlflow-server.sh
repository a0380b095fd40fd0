#!/usr/bin/env bash
# The tracking server of docs/tracking.md: `deploy/mlflow-server.sh /srv/mlflow [PORT]`.
#
# MLflow's basic authentication (users with passwords, permissions per experiment; nobody sees
# an experiment without a grant: default_permission = NO_PERMISSIONS), listening on 127.0.0.1
# only (other machines come through a TLS proxy, docs/tracking.md), every file it creates its
# user's only (umask 077: the stores, users.db with the password hashes, artifacts, the config).
# The first start creates the admin with a random password, handed to MLflow through
# MLFLOW_AUTH_ADMIN_PASSWORD (never written to basic_auth.ini) and kept in ROOT/admin.credentials
# (mode 600, MLflow's credentials format): copy it to the admin's ~/.mlflow/credentials and
# delete it. Later starts ignore it. The server runs in the foreground (a systemd unit, tmux).
set -euo pipefail
root=${1:?usage: deploy/mlflow-server.sh ROOT [PORT]}
port=${2:-5000}
umask 077
mkdir -p "$root"
chmod 700 "$root"
if [ ! -f "$root/basic_auth.ini" ]; then
  printf '[mlflow]\ndefault_permission = NO_PERMISSIONS\ndatabase_uri = sqlite:///%s/users.db\nadmin_username = admin\nauthorization_function = mlflow.server.auth:authenticate_request_basic_auth\n' \
    "$root" > "$root/basic_auth.ini"
  python -c 'import secrets; print(secrets.token_hex(32))' > "$root/secret_key"
fi
if [ ! -f "$root/users.db" ]; then  # first start: the admin is created with this password
  password=$(python -c 'import secrets; print(secrets.token_urlsafe(24))')
  printf '[mlflow]\nmlflow_tracking_username = admin\nmlflow_tracking_password = %s\n' \
    "$password" > "$root/admin.credentials"
  export MLFLOW_AUTH_ADMIN_PASSWORD=$password
fi
export MLFLOW_AUTH_CONFIG_PATH=$root/basic_auth.ini
MLFLOW_FLASK_SERVER_SECRET_KEY=$(cat "$root/secret_key")
export MLFLOW_FLASK_SERVER_SECRET_KEY
# Without MLflow's GenAI job runner (its consumers take ~2 GB and no stage uses them).
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
exec mlflow server --app-name basic-auth \
  --backend-store-uri "sqlite:///$root/mlflow.db" --artifacts-destination "$root/artifacts" \
  --host 127.0.0.1 --port "$port" --workers 2
