"""The tree's layers hold: import-linter's contracts of pyproject.toml (each layer imports only the layers below
it, counting imports inside functions; the ranks' code never imports the driver's), as `make lint` checks them."""

import subprocess
import sys
from pathlib import Path

from suite.paths import REPO_ROOT


def test_every_import_contract_is_kept():
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(linter), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    kept = [line for line in result.stdout.splitlines() if line.endswith(" KEPT")]
    assert len(kept) == 2 and "Contracts: 2 kept, 0 broken." in result.stdout, result.stdout
