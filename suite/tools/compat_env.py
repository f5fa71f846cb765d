"""The requirements of `make test-compat`'s environment: the suite's dependencies (pyproject.toml, test extras
included) at constraints.txt's versions, except torch and what is built against it or pinned with it (torchvision,
numpy, CUDA's wheels), which `pins` give, the oldest torch the suite declares (Strategy.needs_torch).

    python -m suite.tools.compat_env <venv> <pin>...   # writes <venv>/requirements.txt and <venv>/constraints.txt

Standard library only: the Makefile runs it with the machine's python3 before the environment exists.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Packages whose version follows torch's: its companion torchvision, numpy (torch before 2.3 is built against
# numpy 1) and pandas (pandas 3 needs numpy 2), and the CUDA libraries and triton that a torch wheel names as its
# own dependencies (not NVML's nvidia-ml-py, which the suite itself uses).
FOLLOW_TORCH = re.compile(r"(torch|torchvision|numpy|pandas|triton|nvidia-(?!ml-py$)[\w-]+|cuda-[\w-]+)$",
                          re.IGNORECASE)


def name_of(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0]


def requirements(pyproject: dict, pins: list[str]) -> list[str]:
    project = pyproject["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    return [*pins, *(r for r in wanted if not FOLLOW_TORCH.match(name_of(r)))]


def constraints(lock: str, pins: list[str]) -> list[str]:
    kept = [line for line in lock.splitlines() if line.strip() and not FOLLOW_TORCH.match(name_of(line))]
    return [*kept, *pins]


def main(argv: list[str]) -> None:
    venv, pins = Path(argv[0]), argv[1:]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (venv / "requirements.txt").write_text("\n".join(requirements(pyproject, pins)) + "\n")
    (venv / "constraints.txt").write_text("\n".join(constraints((REPO / "constraints.txt").read_text(), pins)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
