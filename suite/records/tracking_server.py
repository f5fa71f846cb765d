"""The tracking server of `make mlflow-server`: MLflow's server behind its own basic-auth app, so that only the user
who started it reads or writes the runs.

Its first start makes that user an admin account with a random password, kept in `credentials_file()` (mode 0600,
MLflow's credentials format), with the accounts' database beside it under results/. The suite's clients (the
driver, a job's record step, `make collect`) read that file when their store is a tracking server: no job script
holds the password.
"""

from __future__ import annotations

import argparse
import configparser
import getpass
import os
import secrets
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from suite.errors import ConfigError
from suite.paths import results_dir

USERNAME, PASSWORD = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"  # what MLflow's client sends
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def server_dir() -> Path:
    return results_dir() / "tracking-server"


def credentials_file() -> Path:
    return server_dir() / "credentials"


def accounts_db() -> Path:
    """The basic-auth app's accounts (password hashes, permissions)."""
    return server_dir() / "accounts.db"


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


def read_credentials() -> Credentials | None:
    """The credentials of the suite's tracking server (None: it never started here)."""
    parser = configparser.ConfigParser()
    if not parser.read(credentials_file()):
        return None
    section = parser["mlflow"]
    return Credentials(section[USERNAME.lower()], section[PASSWORD.lower()])


def make_credentials() -> Credentials:
    """The server's first start: an account named after the user, with a random password, in a file that only the
    user can read (created so, never readable by others for a moment)."""
    directory = server_dir()
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    credentials = Credentials(getpass.getuser(), secrets.token_urlsafe(24))
    parser = configparser.ConfigParser()
    parser["mlflow"] = {USERNAME.lower(): credentials.username, PASSWORD.lower(): credentials.password}
    with os.fdopen(os.open(credentials_file(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        parser.write(f)
    return credentials


def export_credentials() -> None:
    """Let MLflow's client, which sends MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (for the runs and the
    artifacts alike), authenticate to the suite's tracking server: its credentials where results/ has them, else
    whatever those variables say (another server's)."""
    credentials = read_credentials()
    if credentials:
        os.environ[USERNAME], os.environ[PASSWORD] = credentials.username, credentials.password


def without_own_password(env: dict[str, str]) -> dict[str, str]:
    """`env` less the password `export_credentials` took from the credentials file: what a scheduler's submit
    command is given, since sbatch keeps the environment it exports to a job in its records (the job reads the
    file itself)."""
    credentials = read_credentials()
    if credentials and env.get(PASSWORD) == credentials.password:
        return {name: value for name, value in env.items() if name != PASSWORD}
    return env


def allowed_hosts(host: str) -> list[str]:
    """`--allowed-hosts` (the Host headers answered: a guard against DNS rebinding) for a server that listens on
    `host`: MLflow's default (loopback and private addresses) on loopback; beyond it also this machine's names, by
    which the jobs on the compute nodes reach it."""
    if host in LOOPBACK:
        return []
    from mlflow.server.security_utils import get_default_allowed_hosts

    names = sorted({socket.gethostname(), socket.getfqdn()})
    return ["--allowed-hosts", ",".join([*get_default_allowed_hosts(), *names, *(f"{name}:*" for name in names)])]


def auth_config(credentials: Credentials) -> Path:
    """The basic-auth app's configuration: its accounts under results/, the user's account its admin, and no
    permission for any other account (the password comes in the environment, on the first start only). A password
    checked is trusted for a minute: a recording sends hundreds of requests, and each check hashes it anew."""
    parser = configparser.ConfigParser()
    parser["mlflow"] = {"default_permission": "NO_PERMISSIONS", "database_uri": f"sqlite:///{accounts_db()}",
                        "admin_username": credentials.username,
                        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
                        "auth_cache_ttl_seconds": "60"}
    path = server_dir() / "basic_auth.ini"
    with path.open("w") as f:
        parser.write(f)
    return path


def server_credentials() -> Credentials:
    """The credentials the server starts with: made on its first start, read on the later ones."""
    credentials = read_credentials()
    if credentials:
        return credentials
    if accounts_db().exists():
        raise ConfigError(f"the tracking server's accounts ({accounts_db()}) exist but their credentials file "
                          f"{credentials_file()} is gone: remove {accounts_db()} and start it again (new credentials)")
    return make_credentials()


def main(argv: list[str]) -> int:
    """`make mlflow-server`: MLflow's tracking server on the suite's store, with authentication."""
    parser = argparse.ArgumentParser(prog="python -m suite.records.tracking_server", description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", default="5000")
    parser.add_argument("--workers", default="4")
    parser.add_argument("--backend-store-uri", required=True, help="the suite's store (suite.records.store)")
    args = parser.parse_args(argv)

    try:
        credentials = server_credentials()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ, MLFLOW_AUTH_CONFIG_PATH=str(auth_config(credentials)),
               MLFLOW_AUTH_ADMIN_PASSWORD=credentials.password,  # used when the account is created, then ignored
               MLFLOW_FLASK_SERVER_SECRET_KEY=os.environ.get("MLFLOW_FLASK_SERVER_SECRET_KEY") or secrets.token_hex(32),
               # MLflow 3's job runner (7 huey consumers, for its GenAI jobs) is not used by the suite: on a login
               # node they are processes and CPU for nothing, and they slow the server's start several times over
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    command = [mlflow, "server", "--app-name", "basic-auth", "--host", args.host, "--port", args.port,
               "--workers", args.workers, "--backend-store-uri", args.backend_store_uri, "--serve-artifacts",
               "--artifacts-destination", str(results_dir() / "artifacts"), *allowed_hosts(args.host)]
    print(f"tracking server on {args.host}:{args.port}, for {credentials.username} only: the suite's clients read "
          f"the password from {credentials_file()} (a browser asks for it)", flush=True)
    os.execve(mlflow, command, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
