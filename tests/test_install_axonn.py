"""`make axonn`: AxoNN as pinned, patched for CPU ranks on a machine without a CUDA device, and said so."""

import shutil

import pytest
import torch

from suite.errors import ConfigError
from suite.strategies.axonn import check_build, installed_build, package_dir
from suite.tools.install_axonn import PATCH_SET, PATCHES, apply_patches, wanted_build

PATCHED_HERE = pytest.mark.skipif(wanted_build() != "cpu-patched",
                                  reason="a CUDA device: AxoNN is installed as published")


@PATCHED_HERE
def test_axonn_is_installed_patched_for_cpu_ranks():
    assert installed_build() == {"version": "0.2.0", "build": "cpu-patched", "patches": PATCH_SET}
    directory = package_dir()
    for patch in PATCHES:
        text = (directory / patch.file).read_text()
        assert patch.new in text if patch.new else patch.old not in text, patch.why
    assert 'backend="nccl"' not in (directory / "communication.py").read_text()


@PATCHED_HERE
def test_a_patch_that_does_not_match_stops_the_install(tmp_path):
    """Patching sources that are not the published 0.2.0 (here: patched already, on a machine without a CUDA
    device) stops, naming the file."""
    copy = tmp_path / "axonn"
    shutil.copytree(package_dir(), copy)
    with pytest.raises(RuntimeError, match=r"communication.py: .backend=\"nccl\". occurs 0 times, not 7 \(not AxoNN"):
        apply_patches(copy)


@PATCHED_HERE
def test_a_gpu_rank_refuses_axonn_patched_for_cpu_ranks():
    """A venv `make axonn` patched on a login node without a GPU, shared with the GPU nodes: the rank says so."""
    with pytest.raises(ConfigError, match=r"patched for CPU ranks .* run `make axonn` on a GPU node"):
        check_build(torch.device("cuda", 0))
    check_build(torch.device("cpu"))
