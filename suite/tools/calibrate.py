"""`make calibrate`: measure a cluster's matmul peak, collectives and send/recv as a job of its own ranks.

    python -m suite.tools.calibrate [--dry-run] [--apply] [override ...]
    (overrides of conf/calibration.yaml: cluster=lassen cluster.job.account=<bank> nodes=2 calibration.max_bytes=...)

The job runs like a point: a directory under results/calibration/jobs/<cluster>/ holds its config, its
ranks are `suite.worker` started by the cluster's launcher (here the local one, gloo on CPU or nccl on
GPUs; on a batch cluster one job script, as `make sweep` writes them, submitted to the scheduler), and
whoever records it (this command here; there `make collect`, or the job's last step where it records itself)
leaves an MLflow run in the experiment `calibration` and the record results/calibration/<cluster>.yaml
(suite.records.calibration).

Here, after the job, each strategy of `calibration.probe_strategies` (all by default) runs three probe networks
on the job's workers through the sweep driver (`calibration.probe_passes` times, in passes over all of them),
and what its step takes beyond the performance model is fitted and kept in
results/calibration/<cluster>.overhead.yaml and <cluster>.w<workers>.overhead.yaml (suite.predict.library_overhead).
A batch cluster's job does not run them.

`--apply` measures nothing: it copies the record's send/recv bandwidths and latencies into the cluster
config's `hardware.*_bandwidth_gbs` / `*_latency_us`, under a comment that says where they come from. The
config stays the one place the performance model reads a cluster's numbers from, and a change to it is a
reviewed diff, not a file in the git-ignored results/ that makes two checkouts silently disagree.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from launchers.batch import SchedulerError
from suite.errors import ConfigError
from suite.paths import (
    CONF_DIR,
    REPO_ROOT,
    config_file,
    jobs_dir,
    load_record,
    read_record,
    reading,
    record_path,
    searchpath_overrides,
)
from suite.point_dir import PointDir, error_line
from suite.predict import library_overhead
from suite.shared_names import Collective, MathDtype, Status
from suite.tools import overhead_probes

CALIBRATED = "# calibrated:"  # the provenance comment `--apply` writes (and replaces)
# hardware field -> (p2p scope, key in the record, factor)
HARDWARE_FIELDS = {
    "intra_node_bandwidth_gbs": ("intra_node", "bandwidth_gbs", 1.0),
    "intra_node_latency_us": ("intra_node", "latency_s", 1e6),
    "inter_node_bandwidth_gbs": ("inter_node", "bandwidth_gbs", 1.0),
    "inter_node_latency_us": ("inter_node", "latency_s", 1e6),
}


def compose_config(overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from suite.config import register_schema

    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name="calibration", overrides=overrides + searchpath_overrides())
    except Exception as e:  # Hydra's and OmegaConf's errors already say which key or option is wrong
        raise ConfigError(" ".join(str(e).split())) from e
    if cfg.workers is None:
        cfg.workers = default_workers(cfg)
    return cfg


def default_workers(cfg: DictConfig) -> int:
    """Every GPU of the job's nodes; here this machine's GPUs, else two CPU ranks."""
    if cfg.cluster.scheduler != "local":
        return cfg.cluster.workers_per_node * cfg.nodes
    from suite.layout import will_use_cuda

    if will_use_cuda(cfg.cluster):
        import torch

        return torch.cuda.device_count()
    return 2


def check(cfg: DictConfig, dry_run: bool) -> None:
    """One line per problem, before anything runs."""
    from launchers import BATCH_SCHEDULERS
    from suite.worker.calibration_rank import message_sizes

    s, cluster = cfg.calibration, cfg.cluster
    if cfg.workers < 1 or cfg.nodes < 1 or cfg.workers % cfg.nodes:
        raise ConfigError(f"workers={cfg.workers} on nodes={cfg.nodes}: the same positive number of ranks per node")
    if cfg.workers // cfg.nodes > cluster.workers_per_node:
        raise ConfigError(f"workers={cfg.workers} on nodes={cfg.nodes} is more than cluster {cluster.name}'s "
                          f"{cluster.workers_per_node} per node")
    if cluster.scheduler == "local" and cfg.nodes != 1:
        raise ConfigError(f"cluster local is one node, not nodes={cfg.nodes}")
    try:
        message_sizes(s.min_bytes, s.max_bytes, s.size_factor)
    except ValueError as e:
        raise ConfigError(f"calibration: {e}") from e
    unknown = sorted(set(s.dtypes or ()) - set(MathDtype))
    if unknown:
        raise ConfigError(f"calibration.dtypes: {', '.join(unknown)} not among {', '.join(MathDtype)}")
    if min(s.seconds, s.matmul_seconds) <= 0 or not 1 <= s.min_iterations <= s.max_iterations:
        raise ConfigError("calibration: seconds and matmul_seconds must be positive, "
                          "1 <= min_iterations <= max_iterations")
    if s.probe_strategies:
        overhead_probes.check_keys(list(s.probe_strategies))
    if s.probe_passes < 1:
        raise ConfigError(f"calibration.probe_passes must be at least 1, got {s.probe_passes}")
    if cluster.job.account_required and not cluster.job.account:
        raise ConfigError(f"cluster {cluster.name} needs an account to charge: add ACCOUNT=<name> "
                          "(or cluster.job.account=<name>)")
    if cluster.scheduler not in BATCH_SCHEDULERS:
        return
    from suite.sweep.jobs import check_site

    unshared = check_site(cfg, cfg.workers, cfg.workers)  # a retired machine, no queue that takes the job: refused
    if unshared and dry_run:
        print(f"warning: {unshared} (a submission is refused)", file=sys.stderr)
    if dry_run:
        return
    command = BATCH_SCHEDULERS[cluster.scheduler].submit_command
    if not shutil.which(command):
        raise ConfigError(f"{command} not found: submit from a login node of the {cluster.scheduler} cluster "
                          "(DRY_RUN=1 / --dry-run writes the job script without submitting)")
    if unshared:
        raise ConfigError(unshared)


def label(cfg: DictConfig) -> str:
    return f"calibrate/{cfg.cluster.name}/w{cfg.workers}"


def job_dir(cfg: DictConfig, create: bool) -> PointDir:
    """A fresh directory for the job (created, with its config and point.json, when `create`)."""
    from suite.layout import for_ranks
    from suite.paths import git_sha
    from suite.records.run_schema import flatten
    from suite.sweep.plan import config_hash

    first = jobs_dir(cfg.cluster.name) / f"{time.strftime('%Y%m%d-%H%M%S')}-w{cfg.workers}"
    path = first
    for attempt in range(1, 1000):
        if not path.exists():
            break
        path = first.with_name(f"{first.name}.{attempt}")
    point_dir = PointDir(path)
    if not create:
        return point_dir
    path.mkdir(parents=True)
    OmegaConf.save(for_ranks(cfg), point_dir.config, resolve=True)
    settings = flatten(OmegaConf.to_container(cfg.calibration), "calibration.")
    point_dir.write_point({"label": label(cfg), "config_hash": config_hash(cfg), "experiment": cfg.tracking.experiment,
                     "git_sha": git_sha(REPO_ROOT), "parent_run_id": None,
                     "params": {"cluster": cfg.cluster.name, "world_size": cfg.workers, "nodes": cfg.nodes,
                                "ranks_per_node": cfg.workers // cfg.nodes, **settings}})
    return point_dir


def run_here(cfg: DictConfig, point_dir: PointDir):
    """Run the job's ranks here and record it; the `Recorded` outcome."""
    from launchers import launch
    from suite.layout import threads_per_worker
    from suite.records.record import NotStarted, record_ended
    from suite.records.store import Store, store_uri

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SUITE_POINT_LABEL": f"[{label(cfg)}]",
           "OMP_NUM_THREADS": str(threads_per_worker(cfg.cluster.threads_per_worker, cfg.workers))}
    start = time.time()
    try:
        ended = launch(cfg.cluster.scheduler, point_dir.path, cfg.workers, cfg.timeout_s, env)
    except Exception as e:  # the launcher itself broke: still one recorded run
        ended = NotStarted(f"launcher: {error_line(e)}")
    return record_ended(point_dir, Store(store_uri(cfg)), ended, start, time.time())


def submit(cfg: DictConfig, dry_run: bool) -> Path:
    """Write the job script (and submit it unless `dry_run`); its path."""
    from launchers import BATCH_SCHEDULERS, jobscript
    from launchers.batch import Step
    from suite.sweep.jobs import batch_job, rank_threads

    point_dir = job_dir(cfg, create=not dry_run)
    scheduler = BATCH_SCHEDULERS[cfg.cluster.scheduler]
    step = Step(point_dir.path, label(cfg), cfg.workers, cfg.nodes, rank_threads(cfg))
    job = batch_job(point_dir.path.name, cfg, (step,))
    script = jobscript.write(job, scheduler)
    if dry_run:
        print(f"[{label(cfg)}] job script: {script}", flush=True)
        return script
    job_id = scheduler.submit(script)
    point_dir.write_job({"scheduler": scheduler.name, "job_id": job_id, "script": str(script),
                         "submitted": time.time()})
    print(f"[{label(cfg)}] submitted: {scheduler.name} job {job_id} ({script}); its record will be "
          f"{record_path(cfg.cluster.name)} once the job ended and `make collect` ran", flush=True)
    return script


def summary_table(record: dict) -> str:
    """Bus bandwidth per size and collective, send/recv, matmul: markdown."""
    lines = []
    for scope, collectives in record["collectives"].items():
        lines += [f"{scope} ({collectives['ranks']} ranks), busbw GB/s:", "",
                  "| bytes | " + " | ".join(Collective) + " |", "|---:|" + "---:|" * len(Collective)]
        for i, point in enumerate(collectives[Collective.all_reduce]):
            lines.append(f"| {point['bytes']} | "
                         + " | ".join(f"{collectives[op][i]['busbw_gbs']:.4g}" for op in Collective) + " |")
        lines.append("")
    for scope, p2p in record["p2p"].items():
        first, second = p2p["ranks"]
        lines.append(f"{scope} send/recv {first}<->{second}: latency {p2p['latency_s'] * 1e6:.4g} us, "
                     f"bandwidth {p2p['bandwidth_gbs']:.4g} GB/s")
    matmul = record["matmul"]
    lines.append(f"matmul n={matmul['n']}" + (f" ({matmul['threads']} threads)" if matmul.get("threads") else "")
                 + ": " + ", ".join(f"{dtype} {tflops:.4g} TFLOP/s" for dtype, tflops in matmul["tflops"].items()))
    return "\n".join(lines)


def probe_keys(cfg: DictConfig) -> list[str]:
    """The overhead keys of `calibration.probe_strategies`; by default every strategy's whose library is installed
    here (one line for each that is not)."""
    chosen = cfg.calibration.probe_strategies
    if chosen is not None:
        return list(chosen)
    keys, missing = overhead_probes.installed_keys()
    for line in missing:
        print(f"[{label(cfg)}] no overhead probes of {line}", flush=True)
    return keys


def overhead_table(path: Path) -> str:
    """Each strategy's fitted overhead and the probes it was solved from: markdown."""
    record = read_record(path)
    lines = ["| strategy | fixed (ms) | per MB of parameters (ms) | per parameter tensor (ms) | "
             "probes: MB in tensors, predicted -> measured step (ms) |", "|---|---:|---:|---:|---|"]
    with reading(path):  # a field it lacks is damage, named with the file
        for key, fit in record["strategies"].items():
            probes = ", ".join(f"{p['param_bytes'] / 2**20:.2f} MB in {p['param_tensors']} "
                               f"{p['predicted_s'] * 1e3:.1f} -> {p['measured_s'] * 1e3:.1f}" for p in fit["probes"])
            lines.append(f"| {key} | {fit['fixed_s'] * 1e3:+.1f} | {fit['per_byte_s'] * 2**20 * 1e3:.2f} | "
                         f"{fit['per_tensor_s'] * 1e3:.3f} | {probes} |")
    return "\n".join(lines)


def hardware_values(record: dict) -> dict[str, float]:
    """The cluster config's `hardware` fields the record measures (send/recv ping-pong), rounded to 4 digits."""
    values = {}
    for field, (scope, key, factor) in HARDWARE_FIELDS.items():
        if scope in record["p2p"]:
            values[field] = float(f"{record['p2p'][scope][key] * factor:.4g}")
    return values


def apply_record(record: dict, config: Path, source: Path) -> dict[str, float]:
    """Write the record's values into the `hardware:` block of the cluster config `config` (keeping the rest of the
    file), under one provenance comment; the values written."""
    values = hardware_values(record)
    if not values:
        raise ConfigError(f"{source} has no send/recv measurement (a calibration of one rank per node)")
    p = record["provenance"]
    comment = (f"{CALIBRATED} {', '.join(values)} from {source}: send/recv ping-pong measured {p['date']} on "
               f"{p['hosts'][0]} ({p['device']}), {p['backend']}, torch {p['torch']}, git {p['git_sha'][:10]}")
    lines = [line for line in config.read_text().splitlines() if not line.strip().startswith(CALIBRATED)]
    block = next((i for i, line in enumerate(lines) if re.match(r"hardware:\s*(#.*)?$", line)), None)
    if block is None:
        lines.append("hardware:")
        block = len(lines) - 1
    start = block + 1
    end = next((i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith((" ", "#"))), len(lines))
    indent = next((re.match(r"\s+", line).group() for line in lines[start:end] if re.match(r"\s+\w", line)), "  ")
    first = end
    for field, value in values.items():
        at = next((i for i in range(start, end) if re.match(rf"\s+{field}:", lines[i])), None)
        if at is None:
            lines.insert(end, f"{indent}{field}: {value}")
            at, end = end, end + 1
        else:
            lines[at] = f"{indent}{field}: {value}"
        first = min(first, at)
    lines.insert(first, f"{indent}{comment}")
    config.write_text("\n".join(lines) + "\n")
    return values


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.tools.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="batch cluster: write the job script, submit nothing")
    parser.add_argument("--apply", action="store_true",
                        help="copy the cluster's record into conf/cluster/<cluster>.yaml; measure nothing")
    parser.add_argument("overrides", nargs="*", help="overrides of conf/calibration.yaml, e.g. cluster=lassen")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = compose_config(args.overrides)
        name = cfg.cluster.name
        if args.apply:
            record = load_record(name)
            if record is None:
                raise ConfigError(f"no calibration record {record_path(name)}: run `make calibrate CLUSTER={name}` "
                                  "first")
            config = config_file(f"cluster/{name}.yaml")  # a site directory's file is written where it is
            source = record_path(name)
            values = apply_record(record, config, source.relative_to(REPO_ROOT) if source.is_relative_to(REPO_ROOT)
                                  else source)
            print(f"wrote {', '.join(f'{k}={v}' for k, v in values.items())} into {config}")
            return 0
        check(cfg, args.dry_run)
        if cfg.cluster.scheduler != "local":
            submit(cfg, args.dry_run)
            if probe_keys(cfg):
                print(f"[{label(cfg)}] the library overhead's probes are not part of a batch job: "
                      f"{library_overhead.overhead_path(name)} is left as it is", flush=True)
            return 0
        point_dir = job_dir(cfg, create=True)
        print(f"[{label(cfg)}] calibrating {cfg.workers} ranks here; job directory {point_dir.path}", flush=True)
        done = run_here(cfg, point_dir)
    except (ConfigError, SchedulerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    if done.status != Status.finished:
        print(f"[{label(cfg)}] {done.status}: {done.error} (run {done.run_id})", file=sys.stderr)
        return 1
    print(f"\n{summary_table(load_record(name))}\n\n[{label(cfg)}] recorded as run {done.run_id} and in "
          f"{record_path(name)}")
    return measure_overhead(cfg)


def measure_overhead(cfg: DictConfig) -> int:
    """After the job here: the library overhead of `calibration.probe_strategies` on probe networks; exit code."""
    keys = probe_keys(cfg)
    if not keys:
        return 0
    passes = cfg.calibration.probe_passes
    probes = len(keys) * len(overhead_probes.SHAPES)
    print(f"\n[{label(cfg)}] library overhead of {', '.join(keys)}: {probes} probe points "
          f"here on {max(cfg.workers, 2)} workers (single on 1), {passes} pass(es) over them, experiment "
          f"{overhead_probes.EXPERIMENT}", flush=True)
    try:
        path = overhead_probes.measure(cfg.cluster.name, keys, passes, cfg.workers)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    print(f"\n{overhead_table(path)}\n\n[{label(cfg)}] library overhead in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
