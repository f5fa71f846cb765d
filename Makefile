# Two commands on a fresh machine: `make sweep` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SWEEP ?= smoke
CLUSTER ?= local
HOST ?= 127.0.0.1
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
# What a cluster user sets on the command line: the account (bank, project) to charge, the queue
# (partition), the time limit of each job in minutes.
JOB_ARGS := $(if $(ACCOUNT),cluster.job.account=$(ACCOUNT)) $(if $(QUEUE),cluster.job.queue=$(QUEUE)) \
	$(if $(TIME_LIMIT),cluster.job.time_limit_min=$(TIME_LIMIT))
STORE_URI = "$$($(PY) -c 'from suite.tracking import tracking_uri; print(tracking_uri())')"

.PHONY: setup horovod test sweep status collect ui mlflow-server slurm-local report bench-overhead bench-pipeline

setup: $(STAMP)

# The environment is pinned by constraints.txt (the lock); changing it or pyproject.toml reinstalls.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	$(MAKE) --no-print-directory horovod
	rm -f $(VENV)/.installed-* && touch $@

# Horovod built against the venv's torch (suite/build_horovod.py): about 10 minutes on 2 cores the first time
# on a machine, then seconds (the wheel is kept in ~/.cache/suite/wheels); nothing to do when it imports.
horovod:
	$(PY) -m suite.build_horovod

test: setup
	$(PY) -m pytest

sweep: setup
	$(PY) -m suite --sweep $(SWEEP) cluster=$(CLUSTER) $(if $(FORCE),--force) $(if $(RETRY_FAILED),--retry-failed) \
		$(if $(REPEATS),--repeats $(REPEATS)) \
		$(if $(DRY_RUN),--dry-run) $(JOB_ARGS) $(ARGS)

status: setup
	$(PY) -m suite --status --sweep $(SWEEP) cluster=$(CLUSTER) $(JOB_ARGS) $(ARGS)

# Every batch job that ended without recording its points (all sweeps, or SWEEP=<name> only).
collect: setup
	$(PY) -m suite --collect $(if $(filter command line,$(origin SWEEP)),--sweep $(SWEEP))

ui: setup
	$(VENV)/bin/mlflow ui --port $(or $(PORT),5000) --backend-store-uri $(STORE_URI)

# A tracking server on the suite's store, for many jobs writing at once. Cluster jobs reach it when it
# listens beyond loopback (HOST=0.0.0.0) and the cluster config or MLFLOW_TRACKING_URI names it.
mlflow-server: setup
	$(VENV)/bin/mlflow server --host $(HOST) --port $(or $(PORT),5000) --workers $(or $(WORKERS),4) \
		--backend-store-uri $(STORE_URI) --serve-artifacts \
		--artifacts-destination "$$($(PY) -c 'from suite.paths import results_dir; print(results_dir() / "artifacts")')" \
		$(if $(filter 127.0.0.1 localhost,$(HOST)),,--allowed-hosts '*')

# A one-node Slurm on this machine (installs slurm-wlm and munge with apt when missing; root or sudo).
slurm-local: setup
	$(PY) -m launchers.slurm_local

report: setup
	$(PY) -m analysis.report $(SWEEP)

bench-overhead: setup
	OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --standalone --nproc-per-node=2 -m suite.benchmarks.overhead

bench-pipeline: setup
	$(PY) -m suite.benchmarks.pipeline
