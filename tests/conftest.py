import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from suite.paths import REPO_ROOT
from suite.records.store import Store

# Three test workers share two cores, each starting ranks and profiling children whose OpenMP threads would spin on
# a core while they wait for work (libgomp's default), taking it from the other workers' processes: they sleep
# instead (the whole suite's CPU time 7% lower, measured on test_sweep and test_equivalence). Nothing here times
# a point against a bound, and the arithmetic is the same.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# A profile times its network over 5 s of steps (suite.profiling.profiles.WINDOW_S), in as many children as the point
# has ranks on a node: 5 CPU-seconds or more a profile, over 300 of `make test`'s when every test profiled with it.
# The tests check what a profile holds and how predictions use it, not how steady its times are.
os.environ.setdefault("SUITE_PROFILE_WINDOW_S", "0.5")

# A small, fast point that learns: ResNet-18 on scikit-learn's real 8x8 digits.
DIGITS = ["dataset=digits", "network=resnet18", "dataset.samples=256", "dataset.val_samples=64", "batch_size=16",
          "epochs=2", "warmup_steps=1"]


def free_port() -> int:
    """A port free now, for a server a test starts (MLflow's, a rank's store): another process may take it first."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def results(tmp_path, monkeypatch) -> Path:
    """A private results directory and MLflow store for one test."""
    path = tmp_path / "results"
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return path


@contextlib.contextmanager
def results_of_their_own(tmp_path_factory, name: str, **environment: str) -> Iterator[Path]:
    """A results directory and MLflow store for a module's shared fixture (`results` is one test's), with
    `environment` set too, for as long as the fixture lives."""
    path = tmp_path_factory.mktemp(name) / "results"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SUITE_RESULTS_DIR", str(path))
        env.delenv("MLFLOW_TRACKING_URI", raising=False)
        for key, value in environment.items():
            env.setenv(key, value)
        yield path


@pytest.fixture
def store(results) -> Store:
    return Store()


# What a rank leaves in its point directory that a recorder reads (with the point's own config and point.json).
RANK_OUTPUTS = ("epochs.jsonl", "summary.json", "manifest.json", "logs")


@pytest.fixture
def one_rank_group(request):
    """A process group of one gloo rank in this process (torchgpipe's pipe is one process; a strategy's setup
    needs a group), on the CPU, or on `cuda:0` where a test asks for it (indirect parameter "cuda")."""
    import torch
    import torch.distributed as dist

    from suite.runtime.dist import DistEnv

    device = torch.device("cuda", 0) if getattr(request, "param", "cpu") == "cuda" else torch.device("cpu")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield DistEnv(0, 1, 0, 1, device, "gloo")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def worker_outputs(tmp_path_factory) -> Path:
    """The point directory of one real rank's run, whose RANK_OUTPUTS stand for those of the points a test records
    (`copy_rank_outputs`)."""
    from suite.sweep.plan import new_point_dir, plan

    os.environ["SUITE_RESULTS_DIR"] = str(tmp_path_factory.mktemp("worker"))
    try:
        (point,) = plan([[*DIGITS, "epochs=1", "steps_per_epoch=2"]])
        out = new_point_dir(point)
    finally:
        del os.environ["SUITE_RESULTS_DIR"]
    # A port of its own: the default one may be taken by a point of a test running beside this one.
    subprocess.run([sys.executable, "-m", "suite.worker", str(out.path)], cwd=REPO_ROOT, check=True,
                   capture_output=True, env={**os.environ, "MASTER_PORT": str(free_port())})
    return out.path


def copy_rank_outputs(source: Path, point_dir: Path) -> None:
    for name in RANK_OUTPUTS:
        (shutil.copytree if (source / name).is_dir() else shutil.copy)(source / name, point_dir / name)


def run_suite(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The driver exactly as a user starts it: `python -m suite ...`, from the repository root."""
    return subprocess.run([sys.executable, "-m", "suite", *args], cwd=REPO_ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)


def make_command(*args: str) -> list[str]:
    """`make <args>` as a user types it, on the environment these tests run in (VENV: its stamp is there, so
    nothing is installed)."""
    return ["make", "--no-print-directory", *args, f"VENV={sys.prefix}"]


def run_make(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """As from a shell: under `make test` the environment says make is already running (MAKELEVEL), which would
    make the child report itself as a sub-make (`make[1]: ...`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    return subprocess.run(make_command(*args), cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@contextlib.contextmanager
def tracking_server(port: int):
    """`make mlflow-server` on the test's store, up and answering while the block runs."""
    server = subprocess.Popen(make_command("mlflow-server", f"PORT={port}", "WORKERS=2"),
                              cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # 3 test workers on 2 cores
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    os.killpg(server.pid, signal.SIGTERM)
                    output = server.communicate(timeout=30)[0][-3000:]
                    raise AssertionError(f"the tracking server did not start:\n{output}") from None
                time.sleep(1)
        yield
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


@pytest.fixture
def conf_copy(tmp_path, monkeypatch):
    """A copy of conf/ that the planner, the sweep files, the catalog and the reports read instead, for files a test
    breaks."""
    from suite import paths
    from suite.sweep import compose, hardware_catalog

    conf = tmp_path / "conf"
    shutil.copytree(compose.CONF_DIR, conf)
    for module in (paths, compose, hardware_catalog):
        monkeypatch.setattr(module, "CONF_DIR", conf)
    return conf


def edit_catalog_entry(path: Path, **values) -> None:
    """Set (None: remove) keys of a hardware catalog entry (conf/cluster/gpu/*, nic/*) of a `conf_copy`."""
    text = yaml.safe_load(path.read_text())
    for key, value in values.items():
        if value is None:
            text.pop(key)
        else:
            text[key] = value
    path.write_text("# @package cluster.hardware\n" + yaml.safe_dump(text))


# Tests that need GPUs: `gpu` one, `gpu_multi` two or more.
GPU_MARKERS = ("gpu", "gpu_multi")


def _gpu_tests_asked_for(config) -> bool:
    return any(marker in (config.getoption("markexpr") or "") for marker in GPU_MARKERS)


def _needs_gpus(item) -> bool:
    return any(item.get_closest_marker(marker) for marker in GPU_MARKERS)


def pytest_configure(config):
    """`make test` runs on CPU on a GPU machine too: the GPUs are hidden from the tests and from every process they
    start (driver, ranks, make, schedulers' fakes: all inherit this environment), as on a machine without any."""
    if not _gpu_tests_asked_for(config):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` or `gpu_multi` run only when asked for (`make test-gpu`: -m "gpu or gpu_multi";
    `make test-gpu-multi`: -m gpu_multi): `make test` runs where there is none. The rest run longest first."""
    if _gpu_tests_asked_for(config):
        _skip_where_too_few_gpus(items)
        return
    gpu = [item for item in items if _needs_gpus(item)]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not _needs_gpus(item)]
    _longest_first(items)


def _longest_first(items) -> None:
    """Modules whose tests share one xdist worker (an `xdist_group`: a module's costly shared fixtures) first, then
    those that start processes (`slow`), then the rest, each module's tests together and in their order. pytest-xdist
    hands out the groups first (most tests first), then single tests in this order: the slow ones (a 3D layout sweep,
    every network as a pipeline) start early and the many short tests fill the workers at the end, where the
    alphabet's last slow modules ran after them."""
    rank: dict[str, int] = {}
    for item in items:
        mine = 0 if item.get_closest_marker("xdist_group") else 1 if item.get_closest_marker("slow") else 2
        rank[item.module.__name__] = min(rank.get(item.module.__name__, 2), mine)
    items.sort(key=lambda item: rank[item.module.__name__])  # stable: each module's order kept


def _skip_where_too_few_gpus(items) -> None:
    """A `gpu` test needs one GPU, a `gpu_multi` test two: where torch sees fewer, each is skipped with the count."""
    import torch

    visible = torch.cuda.device_count()
    for item in items:
        needed = 2 if item.get_closest_marker("gpu_multi") else 1 if item.get_closest_marker("gpu") else 0
        if visible < needed:
            item.add_marker(pytest.mark.skip(reason=f"needs {needed} or more CUDA GPUs; torch sees {visible} here"))
