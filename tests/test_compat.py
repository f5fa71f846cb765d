"""The site's environment: each strategy's oldest torch refused before launch, `make setup` on a machine without
a torch wheel, a GPU that the torch build has no code for, and the wiring of `make test-compat`.

`make test-compat` runs this module too, on the oldest torch the suite declares: there the plan of every strategy
below imports and checks each strategy's module on that torch for real."""

import re

import pytest
import torch
from packaging.version import Version

from suite.errors import ConfigError
from suite.paths import REPO_ROOT
from suite.runtime.gpu_build import missing_gpu_code
from suite.strategies import older_torch
from suite.strategies.base import Strategy
from suite.sweep.plan import plan
from suite.tools.compat_env import constraints, requirements
from suite.tools.setup_platform import no_wheel
from suite.tools.wheelhouse import platforms

TINY = ["dataset=tokens", "dataset.seq_len=32", "dataset.vocab_size=512", "network=gpt2_tiny", "workers=2",
        "optimizer.name=adam", "optimizer.lr=0.001",
        "batch_size=8", "steps_per_epoch=1", "dataset.samples=64"]
# The torch each strategy declares (Strategy.needs_torch), with the suite's own as the default.
DECLARED = {"single": "2.1", "ddp": "2.1", "gpipe": "2.1", "horovod": "2.1", "pipedream": "2.2", "zero": "2.4",
            "megatron": "2.5", "gpipe_dist": "2.6", "1f1b": "2.6", "fsdp": "2.6"}


def point(strategy: str) -> list[str]:
    return [f"strategy={strategy}", *TINY, *(["workers=1"] if strategy == "single" else [])]


def makefile_variable(name: str) -> str:
    return re.search(rf"^{name} :?= (.*)$", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE)[1]


def test_each_strategy_declares_its_oldest_torch():
    points = plan([point(s) for s in DECLARED], torch_version="2.14.1")
    assert {p.strategy.name: p.strategy.needs_torch for p in points} == DECLARED


def test_points_of_a_strategy_needing_a_newer_torch_are_refused_and_the_rest_planned(capsys):
    points = plan([point("ddp"), point("fsdp"), [*point("fsdp"), "repeat=1"], point("megatron")],
                  torch_version="2.1.2")
    assert [p.strategy.name for p in points] == ["ddp"]
    refused = capsys.readouterr().err.splitlines()
    assert refused == ["refused: strategy fsdp needs torch >= 2.6, this environment has torch 2.1.2 (2 of 4 points, "
                       f"e.g. {' '.join(point('fsdp'))})",
                       f"refused: {' '.join(point('megatron'))}: strategy megatron needs torch >= 2.5, this "
                       "environment has torch 2.1.2"]


def test_a_sweep_of_refused_points_only_is_rejected_in_one_line():
    with pytest.raises(ConfigError, match=r"^strategy 1f1b needs torch >= 2\.6, this environment has torch 2\.4\.1"
                                          r" \(all 2 points\)$"):
        plan([point("1f1b"), [*point("1f1b"), "repeat=1"]], torch_version="2.4.1")


@pytest.mark.parametrize("present, refused", [("2.5.1", True), ("2.6.0", False), ("2.6.0a0+ecf3bae40a", False),
                                              ("2.6.0+cu126", False), ("2.14.1", False)])
def test_a_torch_is_compared_by_its_release(present, refused):
    fsdp, = plan([point("fsdp")], torch_version="2.14.1")
    assert (older_torch(fsdp.strategy, present) is not None) == refused


def test_every_strategy_plans_on_this_torch_or_is_refused(capsys):
    """On the oldest torch (make test-compat), the strategies that need a newer one are refused, the rest plan."""
    present = torch.__version__
    runnable = {s for s, needed in DECLARED.items() if Version(present).release >= Version(needed).release}
    points = plan([point(s) for s in DECLARED])
    refused = capsys.readouterr().err.splitlines()
    assert {p.strategy.name for p in points} == runnable
    assert len(refused) == len(DECLARED) - len(runnable)
    assert all(f"this environment has torch {present}" in line for line in refused)


def test_setup_stops_on_a_machine_without_a_torch_wheel():
    assert no_wheel("ppc64le") == (
        "PyTorch publishes no wheel of the pinned torch for ppc64le, so `make setup` cannot install it: use the "
        "site's torch with `make setup-offline` (docs/clusters.md, the site's environment; on Lassen, Open-CE's "
        "conda build)")
    assert no_wheel("x86_64") is None and no_wheel("aarch64") is None


def test_a_wheelhouse_for_power9_asks_for_ppc64le_wheels():
    assert platforms("ppc64le")[:2] == ["manylinux_2_17_ppc64le", "manylinux2014_ppc64le"]
    assert all(tag.endswith("_ppc64le") for tag in platforms("ppc64le"))
    assert "manylinux1_x86_64" in platforms("x86_64")


def test_setup_checks_the_machine_before_it_makes_the_environment():
    recipe = (REPO_ROOT / "Makefile").read_text().split("$(STAMP):\n", 1)[1].splitlines()
    assert recipe[0] == "\t@$(PYTHON) -m suite.tools.setup_platform"


CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]  # a CUDA 13.0 build's
CU126 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


@pytest.mark.parametrize("capability, arch_list, runs", [
    ((7, 0), CU126, True),  # V100, its own code
    ((8, 6), ["sm_80"], True),  # a cubin runs on its major's later minors
    ((8, 9), CU126, True),
    ((12, 0), ["sm_80", "compute_90"], True),  # PTX compiled at load for a newer GPU
    ((9, 0), ["sm_90a"], True),
    ((10, 0), ["sm_90a"], False),  # arch-specific code runs on its GPU only
    ((8, 0), ["sm_86"], False),
    ((7, 0), ["compute_75"], False),
])
def test_which_gpus_a_torch_build_runs_on(capability, arch_list, runs):
    assert (missing_gpu_code(capability, arch_list, "12.6") is None) == runs


def test_a_v100_under_a_cuda_13_build_names_a_build_that_runs_it():
    assert missing_gpu_code((7, 0), CU130, "13.0") == (
        "this torch (CUDA 13.0) has no code for this GPU's compute capability 7.0 (it is built for sm_75 sm_80 sm_86 "
        "sm_90 sm_100 sm_120 compute_120): use a torch built for CUDA 12.6 (pip's cu126 wheels), or the site's build")
    assert "CUDA 11.8" in missing_gpu_code((3, 7), CU126, "12.6")
    assert "a newer CUDA whose build lists sm_120" in missing_gpu_code((12, 0), ["sm_80", "sm_90"], "11.8")


def test_compat_environment_takes_torch_and_what_follows_it_from_its_pins():
    pins = makefile_variable("COMPAT_PINS").split()
    pyproject = {"project": {"dependencies": ["torch==2.14.1", "torchvision==0.29.1", "mlflow[auth]>=3",
                                              "nvidia-ml-py"], "optional-dependencies": {"test": ["pytest"]}}}
    assert requirements(pyproject, pins) == [*pins, "mlflow[auth]>=3", "nvidia-ml-py", "pytest"]
    lock = "\n".join(["mlflow==3.17.2", "numpy==2.4.6", "nvidia-cublas==13.1.1.3", "nvidia-ml-py==13.615.71",
                      "pandas==3.1.1", "torch==2.14.1"])
    assert constraints(lock, pins) == ["mlflow==3.17.2", "nvidia-ml-py==13.615.71", *pins]


def test_compat_target_tests_the_oldest_declared_torch_and_its_strategies():
    """COMPAT_PINS installs the suite's own oldest torch; COMPAT_TESTS are the equivalence tests of every strategy
    that declares it (Horovod left out: its build; `single` is every test's reference)."""
    torch_pin = next(p for p in makefile_variable("COMPAT_PINS").split() if p.startswith("torch=="))
    assert Version(torch_pin.split("==")[1]).release[:2] == Version(Strategy.needs_torch).release
    tests = makefile_variable("COMPAT_TESTS").split(" or ")
    source = (REPO_ROOT / "tests" / "test_equivalence.py").read_text()
    assert all(f"def {name}(" in source for name in tests)
    oldest = {s for s, needed in DECLARED.items() if needed == Strategy.needs_torch} - {"horovod", "single"}
    assert {name.split("_")[1] for name in tests} == oldest
