"""The wheels a GPU machine without network needs to run the suite on its own torch (`make wheelhouse`).

Run where pip reaches an index. It takes the pinned versions of constraints.txt and leaves out the GPU machine's
own stack (torch, torchvision, triton, the CUDA libraries), what only this machine's tests use (horovod, built
against the torch it runs on; ruff), and every package named in `--have` (the GPU machine's
`python3 -m pip freeze`: what it has is used as it is). Binary wheels are fetched for the target's Python and
platform; a package published as source only (deepspeed, antlr4) is built here into a pure-Python wheel.
On the GPU machine, `make setup-offline WHEELS=<dir>` installs them (docs/clusters.md, "A GPU machine without network").

    python -m suite.tools.wheelhouse --dest wheelhouse [--python-version 3.12] [--machine ppc64le] [--have have.txt]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from suite.paths import REPO_ROOT

# The GPU machine's own: its torch is the one the suite runs on there, with the CUDA libraries it came with.
# nvidia-ml-py (pynvml, NVML's bindings) is no CUDA library but a dependency of the suite's own: carried.
MACHINE_STACK = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-(?!ml-py$).*|cuda-.*)$")
NOT_CARRIED = {"horovod", "ruff"}


def platforms(machine: str) -> list[str]:
    """The wheel platform tags a Linux `machine` (x86_64, aarch64, ppc64le: Lassen's Power9) installs."""
    legacy = ["manylinux1_x86_64"] if machine == "x86_64" else []
    return [f"manylinux_2_17_{machine}", f"manylinux2014_{machine}", *legacy,
            *(f"manylinux_2_{n}_{machine}" for n in (24, 27, 28, 31, 34, 35))]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(constraints: Path) -> dict[str, str]:
    """Package name (canonical) -> its `name==version` line."""
    lines = (line.split("#")[0].strip() for line in constraints.read_text().splitlines())
    return {canonical(line.split("==")[0]): line for line in lines if "==" in line}


def names_in(freeze: Path) -> set[str]:
    """The packages a `pip freeze` (or a list of names, one per line) names."""
    lines = (line.strip() for line in freeze.read_text().splitlines())
    return {canonical(re.split(r"[=<>@ ;\[]", line, maxsplit=1)[0]) for line in lines if line and line[0] != "#"}


def wanted(constraints: Path, have: set[str]) -> list[str]:
    return sorted(line for name, line in pinned(constraints).items()
                  if not MACHINE_STACK.match(name) and name not in NOT_CARRIED and name not in have)


def fetch(requirement: str, dest: Path, python_version: str, machine: str) -> None:
    """The binary wheel for the target, else a wheel built here from the source distribution."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    binary = [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
              "--implementation", "cp", *(f"--platform={p}" for p in platforms(machine)), "-d", str(dest), requirement]
    if subprocess.run(binary, capture_output=True, text=True).returncode == 0:
        return
    built = subprocess.run([*pip, "wheel", "--no-deps", "-w", str(dest), requirement], capture_output=True,
                           text=True, env={**os.environ, "DS_BUILD_OPS": "0"})
    if built.returncode != 0:
        raise SystemExit(f"wheelhouse: no wheel for {requirement}: {built.stderr.strip().splitlines()[-1]}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.tools.wheelhouse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", type=Path, required=True, help="the wheel directory to fill")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (major.minor)")
    parser.add_argument("--machine", default="x86_64", help="the GPU machine's `uname -m` (ppc64le: Lassen)")
    parser.add_argument("--have", type=Path, help="the GPU machine's `pip freeze`: packages not to carry")
    args = parser.parse_args(argv)
    if args.have and not args.have.is_file():
        raise SystemExit(f"wheelhouse: --have {args.have}: no such file")
    requirements = wanted(REPO_ROOT / "constraints.txt", names_in(args.have) if args.have else set())
    args.dest.mkdir(parents=True, exist_ok=True)
    for i, requirement in enumerate(requirements, 1):
        print(f"[{i}/{len(requirements)}] {requirement}", flush=True)
        fetch(requirement, args.dest, args.python_version, args.machine)
    size = sum(f.stat().st_size for f in args.dest.glob("*.whl")) / 2**20
    print(f"{len(requirements)} packages, {size:.0f} MiB of wheels in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
