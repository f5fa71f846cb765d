"""Install AxoNN (the version constraints.txt pins) with mpi4py and an MPI (MPICH's wheel), once per machine.

AxoNN 0.2.0 is written for GPUs: its communication handle sets a CUDA device and creates every process group with
`backend="nccl"`, its inter-layer engine autocasts for CUDA, synchronizes CUDA and receives into CUDA buffers, and its
intra-layer layers initialise their weights and exchange batch sizes and activations in CUDA memory.
Where torch sees a CUDA device the package is installed as it is published (`upstream`); where it sees none (CPU
ranks, these machines) the installed sources are patched (`cpu-patched`, `PATCHES`: each replacement must match as
many times as listed, or the install stops), so that its groups take the backend of the process group the suite
initializes (gloo) and its tensors stay on the CPU. What was installed, and how, is written beside the package
(`BUILD_FILE`, with the set of patches applied: a newer set installs again); each rank records it
(`effective.axonn.build`, `effective.axonn.version`).

    python -m suite.tools.install_axonn     # what `make axonn` runs; skips when the pinned build is in place
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from suite.strategies.axonn import BUILD_FILE, installed_build, package_dir
from suite.tools.build_horovod import CONSTRAINTS, pinned_version

PACKAGES = ("axonn", "mpi4py", "mpich")
# In the installed axonn package: {"version": ..., "build": upstream | cpu-patched, "patches": PATCH_SET or ""}


@dataclass(frozen=True)
class Patch:
    file: str  # in the axonn package
    old: str
    new: str
    count: int  # times `old` occurs in 0.2.0
    why: str


PATCHES = (
    Patch("communication.py", "        torch.cuda.set_device(self.local_rank)\n",
          "        if torch.cuda.is_available():\n            torch.cuda.set_device(self.local_rank)\n", 1,
          "a CPU rank has no CUDA device to set"),
    Patch("communication.py", 'backend="nccl"', "backend=None", 7,
          "its process groups take the backend of the group the suite initializes (gloo on CPU ranks)"),
    Patch("inter_layer.py", 'torch.autocast(device_type="cuda", dtype=self.computation_dtype)',
          'torch.autocast(device_type="cpu", dtype=self.computation_dtype, '
          'enabled=self.computation_dtype != torch.float32)', 1,
          "autocast on the CPU, off in full precision (CPU autocast warns on float32 at every forward)"),
    Patch("inter_layer.py", "        torch.cuda.synchronize()  # TODO - replace with stream synchronize.\n", "", 1,
          "nothing is queued on a CPU: no CUDA to synchronize before MPI reads the buffer"),
    Patch("inter_layer.py", 'device="cuda"', 'device="cpu"', 2, "receive buffers in host memory"),
    Patch("intra_layer/asym_communication.py", 'torch.tensor(local_batch_size, device="cuda")',
          "torch.tensor([local_batch_size])", 1,
          "the batch sizes a split layer's ranks gather, on the host, one element each (gloo's all-gather wants the "
          "input's shape to be one slot of the output's)"),
    Patch("intra_layer/asym_communication.py", 'device="cuda"', 'device="cpu"', 4,
          "the gathered batch sizes and the exchanged activations in host memory"),
    Patch("intra_layer/fully_connected.py", 'init_device="cuda"', 'init_device="cpu"', 1,
          "a split layer's whole weight is initialised (then cut) in host memory"),
)
# Which patches an installed copy carries: a machine installed before a patch was added installs again.
PATCH_SET = hashlib.sha256(repr(PATCHES).encode()).hexdigest()[:12]


def wanted_build() -> str:
    import torch

    return "upstream" if torch.cuda.is_available() else "cpu-patched"


def apply_patches(directory: Path) -> None:
    for patch in PATCHES:
        path = directory / patch.file
        text = path.read_text()
        found = text.count(patch.old)
        if found != patch.count:
            raise RuntimeError(f"{path}: {patch.old.strip()!r} occurs {found} times, not {patch.count} (not AxoNN "
                               f"{pinned_version('axonn')} as published?)")
        path.write_text(text.replace(patch.old, patch.new))


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def main() -> int:
    version, build = pinned_version("axonn"), wanted_build()
    wanted = {"version": version, "build": build, "patches": PATCH_SET if build == "cpu-patched" else ""}
    if installed_build() == wanted:
        print(f"axonn {version} ({build}): installed, nothing to do")
        return 0
    # A fresh copy of the published sources before patching, so that a patch never applies twice.
    pip("install", "--quiet", "--force-reinstall", "--no-deps", "-c", str(CONSTRAINTS), *PACKAGES)
    directory = package_dir()
    if directory is None:
        print(f"axonn {version}: pip installed it but `axonn` is not importable", file=sys.stderr)
        return 1
    if build == "cpu-patched":
        apply_patches(directory)
    (directory / BUILD_FILE).write_text(json.dumps(wanted))
    probe = subprocess.run([sys.executable, "-c", "from axonn import axonn; from axonn.inter_layer import "
                            "AxoNN_Inter_Layer_Engine; from axonn.intra_layer import Linear; from mpi4py import MPI; "
                            "print(MPI.Get_library_version())"],
                           capture_output=True, text=True)
    if probe.returncode:
        print(f"axonn {version}: installed, but its engine or MPI does not import: {probe.stderr.strip()[-500:]}",
              file=sys.stderr)
        return 1
    print(f"axonn {version} ({build}): ready; {probe.stdout.splitlines()[0].strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
