"""The fork server (launchers.fork_server) runs a module as `python -m` would, in a child forked from the interpreter
that imported torch once: its output, its exit code, the threads its environment asks for, and the peak memory it
reports from its own start."""

import json
import sys

import pytest

from launchers.fork_server import ForkServer
from suite.profiling.measure import _restart_peak as restart_peak
from suite.profiling.measure import _status_bytes as status_bytes
from suite.profiling.profiles import STEPS

pytestmark = pytest.mark.slow  # a server process that imports torch


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server whose path has a module `threads` that prints torch's thread count."""
    modules = tmp_path_factory.mktemp("modules")
    (modules / "threads.py").write_text("import torch\nprint(torch.get_num_threads())\n")
    started = ForkServer({"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join([str(modules), *sys.path])})
    yield started
    started.close()


def run(server, argv: list[str], **env: str) -> tuple[int, str]:
    child = server.start(argv, {"PYTHONPATH": ":".join(sys.path), **env})
    output = child.stdout.read()
    child.stdout.close()
    return child.wait(), output


def test_a_module_runs_with_its_arguments_and_its_exit_code(server, tmp_path):
    data = tmp_path / "data.json"
    data.write_text('{"a": 1}')
    code, output = run(server, ["json.tool", "--compact", str(data)])
    assert (code, output) == (0, '{"a":1}\n')
    code, output = run(server, ["json.tool", str(tmp_path / "missing.json")])
    assert code == 2 and "No such file or directory" in output  # argparse's error: SystemExit(2), on stderr


def test_a_child_takes_the_threads_its_environment_asks_for(server):
    assert run(server, ["threads"], OMP_NUM_THREADS="1") == (0, "1\n")
    assert run(server, ["threads"], OMP_NUM_THREADS="2") == (0, "2\n")


def test_a_profile_child_prints_its_network_profile(server, tmp_path):
    from omegaconf import OmegaConf

    from suite.sweep.plan import plan
    (point,) = plan([["dataset=tokens", "network=gpt2_nano", "dataset.vocab_size=16", "dataset.seq_len=4",
                      "batch_size=2", "optimizer.name=adam"]])
    config = tmp_path / "point.yaml"
    config.write_text(OmegaConf.to_yaml(point.cfg, resolve=True))
    code, output = run(server, ["suite.profiling.measure", "network", "2", "cpu", str(config)],
                       SUITE_PROFILE_WINDOW_S="0", OMP_NUM_THREADS="1")
    assert code == 0, output
    network = json.loads(output.splitlines()[-1])["network"]
    assert network["steps"] == STEPS and len(network["layers"]) == 3 and network["train_bytes"] > 0


def test_the_peak_a_profile_reads_restarts_from_the_resident_set():
    """A forked child inherits its parent's peak (VmHWM): a profile restarts it before it trains, so what it reads
    is its network's, not the server's imports'."""
    block = b"\x01" * (256 * 2**20)  # written: resident
    del block
    assert status_bytes("VmHWM") - status_bytes("VmRSS") > 200 * 2**20
    restart_peak()
    assert status_bytes("VmHWM") - status_bytes("VmRSS") < 16 * 2**20
