import os
import subprocess
import sys
from pathlib import Path

import pytest

from suite.paths import REPO_ROOT
from suite.tracking import Store

# A small, fast point that learns: ResNet-18 on scikit-learn's real 8x8 digits.
DIGITS = ["dataset=digits", "network=resnet18", "dataset.samples=256", "dataset.val_samples=64", "batch_size=16",
          "epochs=2", "warmup_steps=1"]


@pytest.fixture
def results(tmp_path, monkeypatch) -> Path:
    """A private results directory and MLflow store for one test."""
    path = tmp_path / "results"
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return path


@pytest.fixture
def store(results) -> Store:
    return Store()


def run_suite(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The driver exactly as a user starts it: `python -m suite ...`, from the repository root."""
    return subprocess.run([sys.executable, "-m", "suite", *args], cwd=REPO_ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)
