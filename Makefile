# Two commands on a fresh machine: `make sweep` and `make test`. Both create .venv on first use.
# VENV=<path> runs them in another environment (the tests run make in their own).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SUITE := $(VENV)/bin/suite
SWEEP ?= smoke
CLUSTER ?= local
HOST ?= 127.0.0.1
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
# What a cluster user sets on the command line: the account (bank, project) to charge, the queue
# (partition), the time limit of each job in minutes.
JOB_ARGS := $(if $(ACCOUNT),cluster.job.account=$(ACCOUNT)) $(if $(QUEUE),cluster.job.queue=$(QUEUE)) \
	$(if $(TIME_LIMIT),cluster.job.time_limit_min=$(TIME_LIMIT))
STORE_URI = "$$($(PY) -c 'from suite.records.store import tracking_uri; print(tracking_uri())')"

.PHONY: help setup setup-offline wheelhouse horovod axonn browser test test-fast test-numerics test-compat test-gpu test-gpu-multi lint sweep status collect calibrate ui \
	mlflow-server slurm-local report bench-overhead bench-pipeline bench-launch predict recommend plan-pipedream bench-model bench-kernels \
	profile-kernels validate-published

# The targets and what each does (the `## ` note on its line); `suite --help` lists the configs and sweeps.
help:
	@awk -F ':.*## ' '/^[a-z-]+:.*## / {printf "  make %-20s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: $(STAMP)  ## the environment in .venv, or VENV (made on first use by every target)

# The environment is pinned by constraints.txt (the lock); the stamp is named by a checksum of it and
# pyproject.toml, so changing either reinstalls, and an environment elsewhere (VENV=<path>) that has its
# stamp is used as it is. It keeps an empty MLflow store that new stores start as copies of (MLflow's schema
# migrations take 3 s of CPU at every new store otherwise).
EMPTY_STORE = $(PY) -c 'from suite.records.store_health import write_empty_store; write_empty_store()'
$(STAMP):
	@$(PYTHON) -m suite.tools.setup_platform
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	$(EMPTY_STORE)
	rm -f $(VENV)/.installed-* && touch $@

# A GPU machine without network runs the suite on its own python3 and torch: where pip reaches an index,
# `make wheelhouse` fills WHEELS with the other dependencies for that machine's Python (PY_VERSION; MACHINE=<its
# `uname -m`>, default x86_64; HAVE=<its `pip freeze`> leaves out what it has); there, `make setup-offline` makes
# $(VENV) over its python3 (a .pth file adds the machine's site-packages) and installs those wheels and the suite,
# without an index.
WHEELS ?= wheelhouse
wheelhouse: setup  ## wheels of the dependencies for an offline GPU machine (WHEELS, PY_VERSION, MACHINE, HAVE)
	$(PY) -m suite.tools.wheelhouse --dest $(WHEELS) $(if $(PY_VERSION),--python-version $(PY_VERSION)) \
		$(if $(MACHINE),--machine $(MACHINE)) $(if $(HAVE),--have $(HAVE))

setup-offline:  ## .venv on an offline machine from WHEELS
	test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -c 'import site; print(*site.getsitepackages(), sep="\n")' \
		> "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/machine.pth"
	$(PY) -m pip install --quiet --disable-pip-version-check --no-index --no-deps $(WHEELS)/*.whl
	$(PY) -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-build-isolation -e .
	$(EMPTY_STORE)
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# Horovod built against the venv's torch (suite/tools/build_horovod.py): 10 to 25 minutes on 2 cores the first time
# on a machine, then seconds (the wheel is kept in ~/.cache/suite/wheels); nothing to do when it imports.
# The tests need it; a sweep with a strategy=horovod point refuses to launch without it (and says to run this).
horovod: setup  ## build Horovod against the environment's torch (once per machine)
	$(PY) -m suite.tools.build_horovod

# AxoNN 0.2.0 with mpi4py and MPICH's wheel (suite/tools/install_axonn.py): seconds; on a machine without a CUDA
# device its installed sources are patched to run on CPU ranks (the rank records `upstream` or `cpu-patched`).
# The tests need it; a sweep with a strategy=axonn point refuses to launch without it (and says to run this).
axonn: setup  ## install AxoNN, mpi4py and MPICH (patched for CPU ranks where there is no GPU)
	$(PY) -m suite.tools.install_axonn

# On TEST_WORKERS pytest-xdist workers (3 on 2 cores: much of a test is waiting on the processes it starts); the
# tests of a module that share a fixture run on one worker (their `xdist_group`), so it is built once.
test: setup horovod axonn browser  ## every test (about 20 minutes on 2 cores)
	$(PY) -m pytest -n $(or $(TEST_WORKERS),3) --dist loadgroup --durations=20

# A headless Chromium for the MLflow UI's browser test, where the machine's packages give one (Debian's chromium and
# chromium-driver, as root); elsewhere that test is skipped, saying why.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; }; } \
	  || echo "no chromium and chromedriver here: the MLflow UI's browser test will be skipped"; }

# The inner loop: the tests that start no processes (no driver, ranks, server, Slurm or make): under 2 minutes.
test-fast: setup  ## the tests that start no processes (about 2 minutes)
	$(PY) -m pytest -m "not slow"

# The tests that compare trained losses and weights within a tolerance, under every vector width this CPU has
# (ATEN_CPU_CAPABILITY: the last bits of a reduction depend on it) and 1 and 2 threads: a bound that holds on one
# processor family only fails here, not on the next CI machine.
NUMERIC_TESTS := tests/test_megatron_tuning.py tests/test_megatron_batch.py tests/test_pipedream.py \
	tests/test_models.py tests/test_activation_checkpointing.py tests/test_zero_precision.py tests/test_fsdp_tuning.py \
	tests/test_tp_fp16.py tests/test_llama.py
test-numerics: setup  ## the numeric tests under each CPU vector width and thread count
	@for width in default avx2 $$(grep -q -w avx512f /proc/cpuinfo && echo avx512); do for threads in 1 2; do \
		echo "ATEN_CPU_CAPABILITY=$$width OMP_NUM_THREADS=$$threads"; \
		ATEN_CPU_CAPABILITY=$$width OMP_NUM_THREADS=$$threads $(PY) -m pytest -q -p no:cacheprovider \
			$(NUMERIC_TESTS) || exit 1; \
	done; done

# The suite on the oldest torch it declares (Strategy.needs_torch; COMPAT_PINS is that torch with the torchvision
# and numpy it was built with): an environment of its own, $(COMPAT_VENV) (4 to 9 minutes to make on 2 cores: pip's
# torch wheel and its CUDA libraries), then tests/test_compat.py and the equivalence tests of the strategies that
# declare that torch (Horovod left out: its build takes 10 minutes); under 2 minutes once the environment exists.
# Not part of `make test` (docs/clusters.md, "The site's environment").
COMPAT_VENV ?= .venv-compat
COMPAT_PINS := torch==2.1.2 torchvision==0.16.2 numpy==1.26.4
COMPAT_TESTS := test_ddp_equivalence or test_gpipe_equivalence or test_ddp_powersgd_trains
test-compat:  ## the suite on the oldest torch it declares, in .venv-compat
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(PYTHON) -m suite.tools.compat_env $(COMPAT_VENV) $(COMPAT_PINS)
	DS_BUILD_OPS=0 $(COMPAT_VENV)/bin/pip install --quiet --disable-pip-version-check \
		-c $(COMPAT_VENV)/constraints.txt -r $(COMPAT_VENV)/requirements.txt
	$(COMPAT_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
	$(COMPAT_VENV)/bin/python -m pytest -p no:cacheprovider tests/test_compat.py
	$(COMPAT_VENV)/bin/python -m pytest -p no:cacheprovider tests/test_equivalence.py -k '$(COMPAT_TESTS)'

# The CUDA paths, on this machine's GPUs: tests marked `gpu` (one GPU) and `gpu_multi` (2 or more, each skipped with
# its reason on fewer; Horovod's skipped where `make horovod` has not run); `make test` collects neither.
test-gpu: setup  ## the CUDA checks on this machine's GPUs
	$(PY) -m pytest -m "gpu or gpu_multi"

# Only the checks that need 2 or more GPUs (NCCL across ranks, torchgpipe across GPUs, Horovod's NCCL all-reduce),
# with Horovod built first.
test-gpu-multi: setup horovod  ## the checks that need 2 or more GPUs
	$(PY) -m pytest -m gpu_multi

# ruff's lint rules (E, W: layout and line length included); not `ruff format`, which would re-wrap the tree's
# hand-aligned argument lists and tables. Then the import contracts of pyproject.toml (import-linter): each kept or
# broken, and every import that breaks one.
lint: setup  ## ruff's lint rules and the layers' import contracts
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

sweep: setup  ## run SWEEP's points on CLUSTER (FORCE, RETRY_FAILED, DRY_RUN, REPEATS, ACCOUNT, QUEUE, TIME_LIMIT, ARGS)
	$(SUITE) sweep $(SWEEP) $(if $(FORCE),--force) $(if $(RETRY_FAILED),--retry-failed) $(if $(DRY_RUN),--dry-run) \
		$(if $(REPEATS),--repeats $(REPEATS)) cluster=$(CLUSTER) $(JOB_ARGS) $(ARGS)

status: setup  ## each point of SWEEP and its state
	$(SUITE) status $(SWEEP) cluster=$(CLUSTER) $(JOB_ARGS) $(ARGS)

# Every batch job that ended without recording its points (all sweeps, or SWEEP=<name> only).
collect: setup  ## record batch jobs that ended without recording their points
	$(SUITE) collect $(if $(filter command line,$(origin SWEEP)),--sweep $(SWEEP))

# The machine's matmul peak, collectives and send/recv, as a job of its own ranks (suite/tools/calibrate.py):
# results/calibration/$(CLUSTER).yaml and an MLflow run in the experiment `calibration`. NODES= on a batch cluster,
# DRY_RUN=1 writes its job script only; APPLY=1 measures nothing and copies the record's bandwidths and latencies
# into conf/cluster/$(CLUSTER).yaml.
calibrate: setup  ## measure CLUSTER's matmul peak, collectives and send/recv (NODES, DRY_RUN, APPLY)
	$(SUITE) calibrate $(if $(APPLY),--apply) $(if $(DRY_RUN),--dry-run) cluster=$(CLUSTER) \
		$(if $(NODES),nodes=$(NODES)) $(JOB_ARGS) $(ARGS)

# MLflow's UI on the store, its URL printed (and opened where a browser can be): the runs table of SWEEP, else of the
# latest sweep.
ui: setup  ## MLflow's UI on the store, opened on SWEEP's runs (PORT)
	$(SUITE) ui --port $(or $(PORT),5000) $(SWEEP)

# A tracking server on the suite's store, for many jobs writing at once: `mlflow server --app-name basic-auth`,
# which answers only the user who started it (suite/records/tracking_server.py: the password made on its first
# start is in results/tracking-server/credentials, mode 0600, which the suite's clients read). Cluster jobs reach
# it when it listens beyond loopback (HOST=0.0.0.0) and the cluster config or MLFLOW_TRACKING_URI names it.
mlflow-server: setup  ## a tracking server on the store for many jobs (HOST, PORT, WORKERS)
	$(PY) -m suite.records.tracking_server --host $(HOST) --port $(or $(PORT),5000) --workers $(or $(WORKERS),4) \
		--backend-store-uri $(STORE_URI)

# A one-node Slurm on this machine (installs slurm-wlm and munge with apt when missing; root or sudo).
slurm-local: setup  ## a one-node Slurm on this machine
	$(PY) -m suite.tools.slurm_local

report: setup  ## SWEEP's report: tables, figures, claims
	$(SUITE) report $(SWEEP)

# The performance model (suite/predict), nothing launched: ARGS are a sweep's overrides, comma lists expanded, e.g.
# ARGS="dataset=imagenet network=resnet50 cluster=lassen workers=4,8,16 strategy=ddp,gpipe" (`--variant study_j`
# for Study J's equations). `recommend` ranks every strategy and its main knobs for ARGS="dataset=... network=...
# cluster=... workers=...".
predict: setup  ## the performance model's price of ARGS's points (FORMAT=json)
	@$(SUITE) predict $(if $(filter json,$(FORMAT)),--json) $(ARGS)

recommend: setup  ## every strategy ranked for ARGS's workload and cluster
	$(SUITE) recommend $(ARGS)

# PipeDream's planner (suite/predict/pipedream_plan.py) on ARGS="dataset=... network=... cluster=... workers=N
# [batch_size=B]": the configuration it chooses (replicas per stage, `2-1-1`, and layers per stage), its predicted time
# per mini-batch and per sample, and the best configuration of every other stage count; nothing launched.
plan-pipedream: setup  ## PipeDream's planner: stages, their layers and replicas for ARGS's point
	$(SUITE) plan-pipedream $(ARGS)

# ARGS: the benchmark's options and overrides, e.g. ARGS='--rounds 1 steps_per_epoch=2' (its smoke test).
bench-overhead: setup  ## the suite's overhead over a bare training loop (WORKERS, ARGS)
	OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --standalone --nproc-per-node=$(or $(WORKERS),2) \
		-m suite.tools.benchmarks.overhead $(if $(WORKERS),workers=$(WORKERS)) $(ARGS)

bench-pipeline: setup  ## each pipeline schedule against GPipe's (ARGS)
	$(PY) -m suite.tools.benchmarks.pipeline $(ARGS)

# The fixed cost of a point run here (driver start to recorded run), split into its parts; e.g. ARGS='--points 1'.
bench-launch: setup  ## the fixed cost of a point run here (ARGS)
	$(PY) -m suite.tools.benchmarks.launch $(ARGS)

# On a GPU machine: microbenchmarks and training-step profiles of what the datasheet model prices, into OUT (about 4
# minutes on an H200); keep the folder as docs/measurements/<gpu>-<date>/ and score it with `make bench-kernels
# ARGS=<folder>`. ARGS=--smoke: a few small shapes, on a CPU too (its test).
profile-kernels: setup  ## microbenchmarks and step profiles of this machine's GPU into OUT, for bench-kernels (ARGS)
	$(PY) -m suite.tools.benchmarks.kernel_profile $(or $(OUT),$(error OUT= names the folder to write)) $(ARGS)

# The datasheet model's kernels and steps against what a GPU lease measured (docs/measurements/<gpu>-<date>/:
# micro.json's GEMMs, memory-bound kernels and attention; profile_*.json's steps): ARGS="[DIR] [cluster=NAME]".
bench-kernels: setup  ## the datasheet model's kernels against a GPU's microbenchmarks and step profiles (ARGS)
	$(PY) -m suite.tools.benchmarks.kernels $(ARGS)

# The performance model against the measured grid of conf/sweep/model_bench.yaml: errors per strategy, memory,
# fits, recommender top-1 / regret / Kendall tau; needs this machine's calibration record (`make calibrate`).
# ARGS='--strategies single,ddp steps_per_epoch=2 ...' shrinks it (its smoke test).
bench-model: setup  ## the performance model against a measured grid (ARGS)
	$(PY) -m suite.tools.benchmarks.model $(ARGS)

# The performance model against published GPU measurements, nothing calibrated: ARGS="[FILE ...] [--json]" (default
# the open set, analysis/published/gpu_measurements.yaml and gpu_measurements_added.yaml); per record published, predicted, error; per metric, strategy family,
# GPU type and source; the GPU pricing issue's targets beside what is reached.
validate-published: setup  ## the performance model against published GPU measurements (ARGS)
	$(SUITE) validate-published $(ARGS)
