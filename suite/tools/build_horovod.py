"""Build Horovod (the version constraints.txt pins) against this environment's torch, once per machine; install it.

Horovod's last release does not build against torch 2.14 as shipped: torch's headers need C++20, and
gloo must be built at the same standard (else `kDefaultTimeout` is defined twice at link time). So the
source distribution is patched to C++20 and built without build isolation (against the installed
torch). Where there is a CUDA toolkit, Horovod's GPU operations are NCCL's, built against the NCCL wheel torch
runs on (without NCCL, Horovod all-reduces CUDA tensors by copying them to host memory and reducing them with
gloo). The wheel links against torch's C++ ABI, so it is cached under a key naming horovod, Python, torch and
the CUDA toolkit and NCCL (or cpu) it was built with: a later build on the same machine only installs.

    python -m suite.tools.build_horovod     # what `make horovod` runs; skips when horovod.torch imports, built
                                            # with NCCL where there is a CUDA toolkit

`make test` runs it first; a sweep with a Horovod point that finds it missing launches nothing and says to run
`make horovod` (`suite.sweep.driver.check_installed`), so no sweep waits minutes for a build it did not ask for.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from suite.paths import REPO_ROOT

CONSTRAINTS = REPO_ROOT / "constraints.txt"
CXX_STANDARD = "20"
# CMakeLists.txt files of the sdist that set CMAKE_CXX_STANDARD (the top level one also builds gloo).
CMAKE_FILES_SETTING_CXX_STANDARD = ("CMakeLists.txt", "horovod/torch/CMakeLists.txt")


def pinned_version(package: str) -> str:
    """The version the lock (constraints.txt) pins `package` to."""
    for line in CONSTRAINTS.read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower() == package:
            return version.strip()
    raise RuntimeError(f"{CONSTRAINTS} pins no version of {package}")


HOROVOD_VERSION = pinned_version("horovod")


def installed_horovod() -> dict | None:
    """What the installed Horovod was built with ({"cuda_built": bool, "nccl_built": NCCL's version code or 0}),
    asked of a fresh interpreter; None unless it is the pinned version and `horovod.torch` imports."""
    probe = ("import json, horovod, horovod.torch as hvd; "
             f"assert horovod.__version__ == {HOROVOD_VERSION!r}; "
             "print(json.dumps({'cuda_built': hvd.cuda_built(), 'nccl_built': hvd.nccl_built()}))")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return json.loads(found.stdout.splitlines()[-1]) if found.returncode == 0 else None


def up_to_date(installed: dict | None, toolkit: Path | None) -> bool:
    """Whether the installed Horovod (`installed_horovod()`) is the one to build here: with NCCL where there is a
    CUDA toolkit."""
    return installed is not None and (toolkit is None or bool(installed["nccl_built"]))


def cuda_toolkit() -> Path | None:
    """The CUDA toolkit to build against ($CUDA_HOME, /usr/local/cuda, or around the nvcc on PATH); None if none.

    A toolkit is a directory with bin/nvcc and include/cuda_runtime.h: an nvcc on PATH may be a wrapper
    script outside the toolkit (/usr/local/bin/nvcc), whose parent CMake cannot find the runtime in.
    """
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("HOROVOD_CUDA_HOME"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parents[1]))
    for home in filter(None, candidates):
        if (Path(home) / "bin" / "nvcc").is_file() and (Path(home) / "include" / "cuda_runtime.h").is_file():
            return Path(home).resolve()
    return None


def cuda_version(toolkit: Path) -> str:
    """'13.0' from nvcc's `release 13.0, V13.0.88` line."""
    out = subprocess.run([toolkit / "bin" / "nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    return out.split("release ")[1].split(",")[0]


@dataclass(frozen=True)
class Nccl:
    """An NCCL to build against: nccl.h in `include`, the shared library in `lib`."""
    include: Path
    lib: Path

    @property
    def version(self) -> str:
        """'2.30.7', from nccl.h's NCCL_MAJOR, NCCL_MINOR and NCCL_PATCH."""
        header = (self.include / "nccl.h").read_text()
        return ".".join(re.search(rf"^#define NCCL_{part}\s+(\d+)", header, re.MULTILINE)[1]
                        for part in ("MAJOR", "MINOR", "PATCH"))


def nccl_wheel() -> Nccl | None:
    """The NCCL that pip's CUDA torch depends on and loads (the nvidia-nccl-cu* wheel: nvidia/nccl/{include,lib}
    on this Python's path); None where there is none."""
    for entry in sys.path:
        home = Path(entry or ".") / "nvidia" / "nccl"
        if (home / "include" / "nccl.h").is_file() and any((home / "lib").glob("libnccl.so.*")):
            return Nccl(home / "include", home / "lib")
    return None


def linkable(nccl: Nccl, into: Path) -> Nccl:
    """`nccl` with a `libnccl.so` to link against in `into`. The wheel ships only the versioned library
    (libnccl.so.2), which CMake's find_library does not look for; the wheel is left as installed. Horovod
    records the versioned name (the library's soname), so at run time it takes the NCCL torch has loaded."""
    (versioned,) = nccl.lib.glob("libnccl.so.*")
    into.mkdir(parents=True, exist_ok=True)
    (into / "libnccl.so").symlink_to(versioned.resolve())
    return Nccl(nccl.include, into)


def torch_version() -> str:
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def wheel_cache_dir(toolkit: Path | None, nccl: Nccl | None) -> Path:
    flavour = "cpu" if toolkit is None else f"cuda{cuda_version(toolkit)}" + (f"-nccl{nccl.version}" if nccl else "")
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    key = f"horovod-{HOROVOD_VERSION}-{python}-torch{torch_version()}-{flavour}"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "suite" / "wheels" / key


def build_env(toolkit: Path | None, nccl: Nccl | None) -> dict[str, str]:
    """Horovod's build variables: PyTorch and gloo, the CUDA toolkit if any, and NCCL for every GPU operation if
    given, linked as a shared library (the one torch loads; the wheel has no static one)."""
    env = dict(os.environ,
               HOROVOD_WITH_PYTORCH="1", HOROVOD_WITH_GLOO="1", HOROVOD_WITHOUT_MPI="1",
               HOROVOD_WITHOUT_TENSORFLOW="1", HOROVOD_WITHOUT_MXNET="1", HOROVOD_CPU_OPERATIONS="gloo")
    # One compile per core: horovod's setup.py runs 8 at once unless MAKEFLAGS is set.
    env.setdefault("MAKEFLAGS", f"-j{os.cpu_count() or 1}")
    if toolkit:
        env["CUDA_HOME"] = env["HOROVOD_CUDA_HOME"] = str(toolkit)
    if nccl:
        env.update(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_NCCL_LINK="SHARED",
                   HOROVOD_NCCL_INCLUDE=str(nccl.include), HOROVOD_NCCL_LIB=str(nccl.lib))
    return env


def patch_cxx_standard(source: Path) -> None:
    for name in CMAKE_FILES_SETTING_CXX_STANDARD:
        path = source / name
        text = path.read_text()
        patched = text.replace("set(CMAKE_CXX_STANDARD 14)", f"set(CMAKE_CXX_STANDARD {CXX_STANDARD})")
        if patched == text:
            raise RuntimeError(f"{path}: no `set(CMAKE_CXX_STANDARD 14)` to patch")
        path.write_text(patched)


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True, env=env)


def build_wheel(toolkit: Path | None, nccl: Nccl | None, into: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="horovod-build-") as tmp:
        work = Path(tmp)
        if nccl:
            nccl = linkable(nccl, work / "nccl-lib")
        pip("download", "--quiet", "--no-deps", "--no-binary", ":all:", f"horovod=={HOROVOD_VERSION}", "-d", str(work))
        with tarfile.open(work / f"horovod-{HOROVOD_VERSION}.tar.gz") as sdist:
            sdist.extractall(work, filter="data")
        source = work / f"horovod-{HOROVOD_VERSION}"
        patch_cxx_standard(source)
        pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(source),
            env=build_env(toolkit, nccl))
        (built,) = (work / "dist").glob("horovod-*.whl")
        into.mkdir(parents=True, exist_ok=True)
        # Copy then rename, so that a concurrent setup never sees half a wheel.
        partial = into / f".{built.name}.partial"
        shutil.copy2(built, partial)
        return partial.rename(into / built.name)


def main() -> int:
    toolkit = cuda_toolkit()
    nccl = nccl_wheel() if toolkit else None
    if toolkit and not nccl:
        print(f"horovod {HOROVOD_VERSION}: a CUDA toolkit at {toolkit} but no NCCL on this Python's path (the "
              "nvidia-nccl-cu* wheel that pip's CUDA torch installs): Horovod would all-reduce GPU tensors through "
              "host memory", file=sys.stderr)
        return 1
    installed = installed_horovod()
    if up_to_date(installed, toolkit):
        print(f"horovod {HOROVOD_VERSION}: horovod.torch imports, nothing to do")
        return 0
    if installed:
        print(f"horovod {HOROVOD_VERSION}: installed without NCCL, though there is a CUDA toolkit: replacing it")
    cache = wheel_cache_dir(toolkit, nccl)
    wheels = sorted(cache.glob("horovod-*.whl"))
    start = time.monotonic()
    if wheels:
        wheel = wheels[0]
        print(f"horovod {HOROVOD_VERSION}: installing the cached {wheel}")
    else:
        gpu = f"CUDA toolkit {toolkit}, NCCL {nccl.version}" if nccl else "CPU only (no CUDA toolkit)"
        print(f"horovod {HOROVOD_VERSION}: building against torch {torch_version()}, {gpu} "
              "(10 to 25 minutes on 2 cores, NCCL included)")
        wheel = build_wheel(toolkit, nccl, cache)
    # Replaces a horovod built against another torch; then its runtime dependencies, as the lock pins them.
    pip("install", "--quiet", "--force-reinstall", "--no-deps", str(wheel))
    pip("install", "--quiet", "-c", str(CONSTRAINTS), str(wheel))
    installed = installed_horovod()
    if not installed:
        print(f"horovod {HOROVOD_VERSION}: installed {wheel} but `import horovod.torch` fails", file=sys.stderr)
        return 1
    if toolkit and not installed["nccl_built"]:
        print(f"horovod {HOROVOD_VERSION}: installed {wheel}, built with the CUDA toolkit {toolkit}, but "
              "horovod.torch.nccl_built() is 0", file=sys.stderr)
        return 1
    print(f"horovod {HOROVOD_VERSION}: ready ({time.monotonic() - start:.0f} s): "
          f"cuda_built={installed['cuda_built']}, nccl_built={installed['nccl_built']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
