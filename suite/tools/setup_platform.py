"""Whether `make setup` can install the pinned torch on this machine: PyTorch publishes wheels for x86_64 and
aarch64 Linux and arm64 macOS only (pytorch.org's "Start Locally" matrix; CUDA 13 itself ships for x86_64 and
arm64-sbsa only, NVIDIA's CUDA 13.0 release notes). Elsewhere (ppc64le: Lassen) pip would search, then fail, or
build torch from source; the site's torch is the way there, under `make setup-offline`.

    python3 -m suite.tools.setup_platform   # exit 2 with one line where there is no wheel

Standard library only: the Makefile runs it with the machine's python3 before the environment exists.
"""

from __future__ import annotations

import platform
import sys

WHEEL_MACHINES = ("x86_64", "AMD64", "aarch64", "arm64")


def no_wheel(machine: str) -> str | None:
    """Why `make setup` cannot make an environment on a `machine` (platform.machine()), in one line; None if it can."""
    if machine in WHEEL_MACHINES:
        return None
    return (f"PyTorch publishes no wheel of the pinned torch for {machine}, so `make setup` cannot install it: use "
            "the site's torch with `make setup-offline` (docs/clusters.md, the site's environment; on Lassen, "
            "Open-CE's conda build)")


def main() -> int:
    reason = no_wheel(platform.machine())
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
