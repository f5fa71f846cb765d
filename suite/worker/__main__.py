"""`python -m suite.worker <point dir>`: one rank of a point (see suite.worker.rank)."""

import sys

from suite.worker.rank import run_rank

run_rank(sys.argv[1])
