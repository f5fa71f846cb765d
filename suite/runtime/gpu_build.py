"""Whether this torch build has code for the rank's GPU. A build without it fails at the first kernel, deep inside
a step; the rank checks when it takes its GPU and fails with one line naming a build that has it."""

from __future__ import annotations

import re

# The newest CUDA whose PyTorch builds still carry code for GPUs below a compute capability. CUDA 12 dropped Kepler
# (below 5.0); CUDA 13 dropped Maxwell, Pascal and Volta, sm_50 to sm_72 (NVIDIA's CUDA 13.0 release notes), and
# PyTorch's CUDA 12.8 and 12.9 builds already leave them out (pytorch#157517): cu126 is the last with sm_70 (V100).
LAST_BUILD_BELOW = (((5, 0), "CUDA 11.8 (pip's cu118 wheels)"), ((7, 5), "CUDA 12.6 (pip's cu126 wheels)"))
ARCH = re.compile(r"(sm|compute)_(\d+)(\d)([a-z]?)$")  # sm_70, sm_100a, compute_120: major digits, minor digit


def runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether code built for `arch` runs on a GPU of `capability`: a cubin on its major's later minors (sm_80 on
    8.6), arch-specific code (sm_90a) on that one GPU only, PTX (compute_XY) compiled at load on any later GPU."""
    found = ARCH.match(arch)
    if not found:
        return False
    kind, built = found[1], (int(found[2]), int(found[3]))
    if found[4] == "a":
        return built == capability
    if kind == "compute":
        return built <= capability
    return built[0] == capability[0] and built[1] <= capability[1]


def missing_gpu_code(capability: tuple[int, int], arch_list: list[str], cuda: str | None) -> str | None:
    """Why a torch built for `arch_list` (torch.cuda.get_arch_list()) with CUDA `cuda` cannot run on a GPU of
    compute capability `capability`, in one line naming a build that can; None if it can."""
    if any(runs_on(arch, capability) for arch in arch_list):
        return None
    major, minor = capability
    build = next((name for below, name in LAST_BUILD_BELOW if capability < below),
                 f"a newer CUDA whose build lists sm_{major}{minor}")
    return (f"this torch (CUDA {cuda}) has no code for this GPU's compute capability {major}.{minor} (it is built for "
            f"{' '.join(arch_list) or 'no GPU'}): use a torch built for {build}, or the site's build")
