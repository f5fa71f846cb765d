"""`make mlflow-server` answers only the user who started it: MLflow's basic-auth app, an account made on the first
start with a random password in a file only that user can read, which the suite's clients read; a request without
it is refused."""

import base64
import getpass
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import DIGITS, copy_rank_outputs, free_port, tracking_server
from suite.errors import ConfigError
from suite.paths import REPO_ROOT
from suite.records import tracking_server as server
from suite.records.store import Store
from suite.records.store_health import StoreError
from suite.sweep.plan import new_point_dir, plan

SEARCH = "/api/2.0/mlflow/experiments/search?max_results=1"


@pytest.fixture
def credentials_env(monkeypatch):
    """MLflow's credential variables as the test leaves them: unset (a Store of a tracking server sets them)."""
    for name in (server.USERNAME, server.PASSWORD):
        monkeypatch.setenv(name, "")  # remembered as unset, and restored so
        monkeypatch.delenv(name)


def status_of(url: str, user: str | None = None, password: str | None = None) -> int:
    request = urllib.request.Request(url)
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def test_credentials_are_made_once_readable_by_their_user_only(results):
    made = server.server_credentials()
    assert made.username == getpass.getuser() and len(made.password) >= 12
    assert stat.S_IMODE(server.credentials_file().stat().st_mode) == 0o600
    assert stat.S_IMODE(server.server_dir().stat().st_mode) == 0o700
    assert server.server_credentials() == made == server.read_credentials()  # later starts read them
    config = server.auth_config(made).read_text()
    assert made.password not in config and f"sqlite:///{server.accounts_db()}" in config
    assert "default_permission = NO_PERMISSIONS" in config


def test_a_submit_command_is_not_given_the_password_the_suite_read(results, credentials_env):
    made = server.server_credentials()
    server.export_credentials()  # as a Store of the suite's tracking server does
    from launchers.batch import run_command

    seen = run_command(["env"])  # what sbatch would export to the job and keep in its records
    assert f"{server.USERNAME}={made.username}" in seen and made.password not in seen
    os.environ[server.PASSWORD] = "another-servers-password"  # the user's own: passed on
    assert "another-servers-password" in run_command(["env"])


def test_accounts_whose_credentials_are_lost_are_one_line(results):
    server.server_dir().mkdir(parents=True)
    server.accounts_db().write_bytes(b"")
    with pytest.raises(ConfigError, match=r"credentials file .* is gone: remove .*accounts\.db"):
        server.server_credentials()


def test_the_server_answers_its_own_host_names_beyond_loopback_not_every_host():
    assert server.allowed_hosts("127.0.0.1") == []
    option, hosts = server.allowed_hosts("0.0.0.0")
    names = hosts.split(",")
    assert option == "--allowed-hosts" and "*" not in names
    assert {"localhost", f"{os.uname().nodename}:*"} <= set(names)


@pytest.mark.slow
def test_make_mlflow_server_refuses_requests_without_its_credentials(results, worker_outputs, credentials_env):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tracking_server(port):
        made = server.read_credentials()
        assert made and made.username == getpass.getuser() and server.accounts_db().exists()
        assert status_of(url + SEARCH) == 401
        assert status_of(url + SEARCH, made.username, made.password + "x") == 401
        assert status_of(url + SEARCH, made.username, made.password) == 200
        assert status_of(url + "/health") == 200  # how the suite and its tests see that it runs

        # A job's record step reporting to it: its environment names the server, and no password.
        (point,) = plan([[*DIGITS, "epochs=1", "steps_per_epoch=2"]])
        out = new_point_dir(point)
        copy_rank_outputs(worker_outputs, out.path)
        step = subprocess.run([sys.executable, "-m", "suite.records.record", str(out.path), "--exit-code", "0",
                               "--started", str(time.time())], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "MLFLOW_TRACKING_URI": url})
        assert step.returncode == 0, step.stdout + step.stderr[-3000:]
        store = Store(url)
        (run,) = store.runs("adhoc")
        assert run.data.tags["suite.status"] == "finished" and out.recorded()["run_id"] == run.info.run_id
        assert {a.path for a in store.client.list_artifacts(run.info.run_id, "logs")} == {"logs/rank0.log"}

        server.credentials_file().unlink()  # another results directory's client: the variables as they are
        os.environ[server.PASSWORD] = "not-the-password"
        with pytest.raises(StoreError, match=f"the tracking server {url} refuses the credentials of user "):
            Store(url)
