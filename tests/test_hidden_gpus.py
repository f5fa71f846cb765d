"""`make test` on a GPU machine: its tests, and the ranks they start, run on CPU (tests/conftest.py hides the GPUs;
`make test-gpu`, which asks for `-m gpu`, sees them)."""

import subprocess
import sys


def test_the_processes_a_test_starts_see_no_gpu():
    seen = subprocess.run([sys.executable, "-c", "import os, torch\n"
                           "print(repr(os.environ['CUDA_VISIBLE_DEVICES']), torch.cuda.device_count())"],
                          capture_output=True, text=True, check=True)
    assert seen.stdout.split() == ["''", "0"]
