"""`python -m suite.worker <point dir>`: one rank of a point (see suite.worker.rank)."""

import logging
import os
import sys

from suite.worker.rank import main

code = main(sys.argv[1])
# Everything is written; skip the interpreter's teardown (about a second of library finalizers per rank).
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
