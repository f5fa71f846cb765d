"""Whether a store can be used as it is, checked when it opens: a sqlite file intact (and its backup, the way back
when it is not), a tracking server that answers and takes this process's credentials; and the empty sqlite store a new
one starts from."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import sqlite3
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from suite.errors import ConfigError
from suite.records.tracking_server import credentials_file


class StoreError(ConfigError):
    """A store that cannot be used as it is (damaged, unreachable, impossible to create): one line saying why and
    what to do. Raised when it is opened, before anything is launched or written."""


SERVER_TIMEOUT_S = 5  # MLflow's own client retries an unreachable server for minutes, silently


def sqlite_file(uri: str) -> Path | None:
    """The file of a sqlite store; None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def backup_file(db: Path) -> Path:
    """The copy of a sqlite store that each sweep takes before writing to it (Store.back_up)."""
    return db.with_name(f"{db.name}.bak")


def read_only(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=60)


def check_intact(db: Path) -> None:
    """Raise StoreError if the sqlite file is damaged (a truncated or overwritten file), with the way back."""
    try:
        with contextlib.closing(read_only(db)) as connection:
            problems = [row[0] for row in connection.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as e:
        if e.sqlite_errorcode & 0xFF not in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            raise  # busy, unreadable, ...: not damage
        problems = [str(e)]
    if problems == ["ok"]:
        return
    backup = backup_file(db)
    if backup.exists():
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(backup.stat().st_mtime))
        way_back = (f"Restore the copy taken when a sweep last started ({taken}): "
                    f"mv {db} {db}.damaged && cp {backup} {db}")
    else:
        recovered = db.with_name(f"{db.stem}.recovered{db.suffix}")
        way_back = f"Salvage what is left: sqlite3 {db} .recover | sqlite3 {recovered} && mv {recovered} {db}"
    raise StoreError(f"the store {db} is damaged ({problems[0]}); nothing was written to it. {way_back}")


def check_reachable(uri: str) -> None:
    """Raise StoreError unless the tracking server at `uri` answers within SERVER_TIMEOUT_S (any HTTP answer)."""
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=SERVER_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        pass  # it answered
    except OSError as e:  # refused, unknown host, timed out
        reason = getattr(e, "reason", e)
        if not isinstance(reason, ssl.SSLError):  # a certificate not trusted here is an answer too
            raise StoreError(f"the tracking server {uri} does not answer ({reason}): start it (`make mlflow-server`) "
                             "or set tracking.uri / MLFLOW_TRACKING_URI to one that runs") from None


def check_authorized(uri: str) -> None:
    """Raise StoreError if the tracking server at `uri` refuses the credentials this process sends (its first
    answer may take a while: a server just started, a password hash checked)."""
    request = urllib.request.Request(f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1")
    username, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if username and password:
        request.add_unredirected_header("Authorization", "Basic " + base64.b64encode(
            f"{username}:{password}".encode()).decode())
    try:
        urllib.request.urlopen(request, timeout=60).close()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            sent = f"the credentials of user {username}" if username else "no credentials"
            raise StoreError(f"the tracking server {uri} refuses {sent}: the suite's own (`make mlflow-server`) "
                             f"takes those in {credentials_file()}; for another, set MLFLOW_TRACKING_USERNAME and "
                             "MLFLOW_TRACKING_PASSWORD") from None
    except OSError:
        pass  # it answered /health a moment ago: MLflow's client says what is wrong when it is used



def empty_store_file() -> Path:
    """Where the environment keeps an empty store of its MLflow (`make setup` writes it: `write_empty_store`)."""
    from mlflow.version import VERSION

    return Path(sys.prefix) / "share" / "suite" / f"mlflow-{VERSION}-empty.db"


def write_empty_store() -> Path:
    """MLflow's tables as its migrations leave them, kept in the environment: a new sqlite store starts as a copy
    (`start_from_empty`) instead of running the migrations (3 s of CPU). Without the Default experiment, which MLflow
    adds to a store that lacks it as the store opens, with an artifact location under the opening process's working
    directory."""
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # its lines on making tables
    target = empty_store_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as made:
        db = Path(made) / "mlflow.db"
        MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments(max_results=1)
        with contextlib.closing(sqlite3.connect(db)) as connection, connection:
            connection.execute("DELETE FROM experiments WHERE experiment_id = 0")
        os.replace(db, target)
    return target


def start_from_empty(db: Path) -> None:
    """Make the sqlite store `db`, which does not exist, a copy of the environment's empty store, where there is one
    (else MLflow's client creates it)."""
    empty = empty_store_file()
    if empty.exists():
        partial = db.with_name(f"{db.name}.{os.getpid()}")
        shutil.copyfile(empty, partial)
        os.replace(partial, db)
