# Two commands on a fresh machine: `make sweep` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SWEEP ?= smoke
CLUSTER ?= local
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: setup test sweep ui report bench-overhead bench-pipeline clean-results

setup: $(STAMP)

# The environment is pinned by constraints.txt (the lock); changing it or pyproject.toml reinstalls.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

test: setup
	$(PY) -m pytest

sweep: setup
	$(PY) -m suite --sweep $(SWEEP) cluster=$(CLUSTER) $(if $(FORCE),--force) $(ARGS)

ui: setup
	$(VENV)/bin/mlflow ui --port $(or $(PORT),5000) \
		--backend-store-uri "$$($(PY) -c 'from suite.tracking import tracking_uri; print(tracking_uri())')"

report: setup
	$(PY) -m analysis.report $(SWEEP)

bench-overhead: setup
	OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --standalone --nproc-per-node=2 -m suite.benchmarks.overhead

bench-pipeline: setup
	$(PY) -m suite.benchmarks.pipeline
