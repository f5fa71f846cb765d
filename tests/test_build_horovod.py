"""`make horovod`'s build (suite/tools/build_horovod.py): with a CUDA toolkit, Horovod's GPU operations are NCCL's,
built against the NCCL wheel torch loads; without one, a CPU-only Horovod. Which NCCL it was built with is part of
the cached wheel's key."""

from importlib import metadata
from pathlib import Path

import pytest

from suite.tools.build_horovod import (
    Nccl,
    build_env,
    cuda_toolkit,
    installed_horovod,
    linkable,
    nccl_wheel,
    up_to_date,
    wheel_cache_dir,
)

NCCL_VARIABLES = ("HOROVOD_GPU_OPERATIONS", "HOROVOD_NCCL_LINK", "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB")


def fake_toolkit(root: Path, release: str) -> Path:
    """A directory that passes for a CUDA toolkit: bin/nvcc printing `release`, include/cuda_runtime.h."""
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").touch()
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.88'\n")
    nvcc.chmod(0o755)
    return root


def nccl_headers(root: Path, major: int, minor: int, patch: int) -> Nccl:
    """An NCCL of the given version as nccl.h states it, with the versioned library the wheel ships."""
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "nccl.h").write_text(
        f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
        f'#define NCCL_SUFFIX ""\n#define NCCL_VERSION_CODE {major * 10000 + minor * 100 + patch}\n')
    (root / "lib" / f"libnccl.so.{major}").touch()
    return Nccl(root / "include", root / "lib")


def test_the_environments_nccl_is_the_wheel_torch_depends_on():
    nccl = nccl_wheel()
    assert nccl is not None and (nccl.include / "nccl.h").is_file()
    assert nccl.version == metadata.version("nvidia-nccl-cu13")


def test_with_a_toolkit_every_gpu_operation_is_nccls(tmp_path):
    toolkit = fake_toolkit(tmp_path / "cuda", "13.0")
    nccl = linkable(nccl_wheel(), tmp_path / "link")
    env = build_env(toolkit, nccl)
    assert env["CUDA_HOME"] == env["HOROVOD_CUDA_HOME"] == str(toolkit)
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert env["HOROVOD_NCCL_LINK"] == "SHARED"  # the wheel has no libnccl_static.a
    assert env["HOROVOD_NCCL_INCLUDE"] == str(nccl_wheel().include)
    # CMake's find_library(nccl) looks for libnccl.so, which the wheel (libnccl.so.2 only) lacks: the link is it.
    assert env["HOROVOD_NCCL_LIB"] == str(tmp_path / "link")
    assert (tmp_path / "link" / "libnccl.so").resolve() == next(nccl_wheel().lib.glob("libnccl.so.*")).resolve()
    assert not (nccl_wheel().lib / "libnccl.so").exists()  # the installed wheel is left as it is


def test_without_a_toolkit_horovod_is_built_for_the_cpu(monkeypatch):
    for name in ("CUDA_HOME", "HOROVOD_CUDA_HOME", *NCCL_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    env = build_env(None, None)
    assert env["HOROVOD_WITH_PYTORCH"] == "1" and env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert not {"CUDA_HOME", "HOROVOD_CUDA_HOME", *NCCL_VARIABLES} & env.keys()


def test_a_toolkit_is_found_by_cuda_home(tmp_path, monkeypatch):
    toolkit = fake_toolkit(tmp_path / "cuda", "12.8")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    assert cuda_toolkit() == toolkit.resolve()


def test_the_cached_wheel_is_keyed_by_the_toolkit_and_nccl_it_was_built_with(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    toolkit = fake_toolkit(tmp_path / "cuda", "13.0")
    built = wheel_cache_dir(toolkit, nccl_headers(tmp_path / "nccl-2.30.7", 2, 30, 7))
    assert built.parent == tmp_path / "cache" / "suite" / "wheels"
    assert built.name.startswith("horovod-") and built.name.endswith("-cuda13.0-nccl2.30.7")
    assert wheel_cache_dir(toolkit, nccl_headers(tmp_path / "nccl-2.31.1", 2, 31, 1)).name.endswith("-nccl2.31.1")
    assert wheel_cache_dir(None, None).name.endswith("-cpu")


@pytest.mark.parametrize("installed, toolkit, current", [
    (None, None, False),
    (None, Path("/usr/local/cuda"), False),
    ({"cuda_built": False, "nccl_built": 0}, None, True),
    ({"cuda_built": True, "nccl_built": 0}, Path("/usr/local/cuda"), False),  # W3: built before NCCL was asked for
    ({"cuda_built": True, "nccl_built": 23007}, Path("/usr/local/cuda"), True),
])
def test_a_horovod_without_nccl_is_rebuilt_where_there_is_a_toolkit(installed, toolkit, current):
    assert up_to_date(installed, toolkit) is current


@pytest.mark.slow
@pytest.mark.skipif(cuda_toolkit() is None, reason="no CUDA toolkit here: `make horovod` builds a CPU-only Horovod")
def test_the_installed_horovod_reduces_gpu_tensors_with_nccl():
    """On a machine with a CUDA toolkit (this one, CI's), `make horovod` (run by `make test`) built Horovod with
    NCCL: without it Horovod copies CUDA tensors to host memory and reduces them with gloo."""
    installed = installed_horovod()
    assert installed is not None, "horovod.torch does not import: `make horovod`"
    assert installed["cuda_built"]
    major, minor, patch = map(int, nccl_wheel().version.split("."))
    assert installed["nccl_built"] == major * 10000 + minor * 100 + patch  # NCCL_VERSION_CODE of the wheel's nccl.h
