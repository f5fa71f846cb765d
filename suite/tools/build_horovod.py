"""Build Horovod (the version constraints.txt pins) against this environment's torch, once per machine; install it.

Horovod's last release does not build against torch 2.14 as shipped: torch's headers need C++20, and
gloo must be built at the same standard (else `kDefaultTimeout` is defined twice at link time). So the
source distribution is patched to C++20 and built without build isolation (against the installed
torch). The wheel links against torch's C++ ABI, so it is cached under a key naming horovod, Python,
torch and the CUDA toolkit (or cpu) it was built with: a later build on the same machine only installs.

    python -m suite.tools.build_horovod     # what `make horovod` runs; skips when horovod.torch imports

`make test` runs it first; a sweep with a Horovod point that finds it missing launches nothing and says to run
`make horovod` (`suite.sweep.driver.check_installed`), so no sweep waits minutes for a build it did not ask for.
"""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
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


def horovod_torch_imports() -> bool:
    probe = f"import horovod, horovod.torch; assert horovod.__version__ == {HOROVOD_VERSION!r}"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


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


def torch_version() -> str:
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def wheel_cache_dir(toolkit: Path | None) -> Path:
    flavour = f"cuda{cuda_version(toolkit)}" if toolkit else "cpu"
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    key = f"horovod-{HOROVOD_VERSION}-{python}-torch{torch_version()}-{flavour}"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "suite" / "wheels" / key


def build_env(toolkit: Path | None) -> dict[str, str]:
    env = dict(os.environ,
               HOROVOD_WITH_PYTORCH="1", HOROVOD_WITH_GLOO="1", HOROVOD_WITHOUT_MPI="1",
               HOROVOD_WITHOUT_TENSORFLOW="1", HOROVOD_WITHOUT_MXNET="1", HOROVOD_CPU_OPERATIONS="gloo")
    # One compile per core: horovod's setup.py runs 8 at once unless MAKEFLAGS is set.
    env.setdefault("MAKEFLAGS", f"-j{os.cpu_count() or 1}")
    if toolkit:
        env["CUDA_HOME"] = env["HOROVOD_CUDA_HOME"] = str(toolkit)
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


def build_wheel(toolkit: Path | None, into: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="horovod-build-") as tmp:
        work = Path(tmp)
        pip("download", "--quiet", "--no-deps", "--no-binary", ":all:", f"horovod=={HOROVOD_VERSION}", "-d", str(work))
        with tarfile.open(work / f"horovod-{HOROVOD_VERSION}.tar.gz") as sdist:
            sdist.extractall(work, filter="data")
        source = work / f"horovod-{HOROVOD_VERSION}"
        patch_cxx_standard(source)
        pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(source), env=build_env(toolkit))
        (built,) = (work / "dist").glob("horovod-*.whl")
        into.mkdir(parents=True, exist_ok=True)
        # Copy then rename, so that a concurrent setup never sees half a wheel.
        partial = into / f".{built.name}.partial"
        shutil.copy2(built, partial)
        return partial.rename(into / built.name)


def main() -> int:
    if horovod_torch_imports():
        print(f"horovod {HOROVOD_VERSION}: horovod.torch imports, nothing to do")
        return 0
    toolkit = cuda_toolkit()
    cache = wheel_cache_dir(toolkit)
    wheels = sorted(cache.glob("horovod-*.whl"))
    start = time.monotonic()
    if wheels:
        wheel = wheels[0]
        print(f"horovod {HOROVOD_VERSION}: installing the cached {wheel}")
    else:
        print(f"horovod {HOROVOD_VERSION}: building against torch {torch_version()}, "
              f"{f'CUDA toolkit {toolkit}' if toolkit else 'CPU only (no CUDA toolkit)'} (about 10 minutes on 2 cores)")
        wheel = build_wheel(toolkit, cache)
    # Replaces a horovod built against another torch; then its runtime dependencies, as the lock pins them.
    pip("install", "--quiet", "--force-reinstall", "--no-deps", str(wheel))
    pip("install", "--quiet", "-c", str(CONSTRAINTS), str(wheel))
    if not horovod_torch_imports():
        print(f"horovod {HOROVOD_VERSION}: installed {wheel} but `import horovod.torch` fails", file=sys.stderr)
        return 1
    print(f"horovod {HOROVOD_VERSION}: ready ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
