"""One rank of a point: `python -m suite.worker <point dir>`, started by a launcher (the local one, srun, jsrun,
mpiexec).

It reads the resolved config from the point directory, finds its place in the job from the launcher's
environment (`suite.runtime.rendezvous`), trains (or, in a calibration job's directory, measures the machine:
`suite.worker.calibration_rank`), and leaves its results there (see `suite.point_dir`).
Rank 0 prints progress; every rank logs to logs/rank<r>.log. SIGTERM stops it as `timeout`.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

from suite.errors import raise_on_sigterm
from suite.launch_timing import mark
from suite.point_dir import PointDir
from suite.runtime.rendezvous import discover

if TYPE_CHECKING:
    from suite.runtime.dist import DistEnv

log = logging.getLogger("suite")


def setup_logging(point_dir: PointDir, rank: int) -> None:
    point_dir.logs.mkdir(parents=True, exist_ok=True)
    logfile = open(point_dir.rank_log(rank), "a", buffering=1)
    faulthandler.enable(file=logfile)  # a crash in native code still leaves its stack in the log
    handlers: list[logging.Handler] = [logging.StreamHandler(logfile)]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank{rank}] %(message)s", handlers=handlers)


@contextmanager
def process_group(point_dir: PointDir, cfg, processes: int, what: str) -> Iterator[DistEnv]:
    """Join the job's process group as one of its `processes` ranks (`what` they run, for the error) and
    write the environment manifest; leave it at the end."""
    import torch.distributed as dist

    from suite.errors import ConfigError
    from suite.runtime.dist import init_distributed, shutdown
    from suite.runtime.manifest import environment_manifest, rank_info

    rendezvous = discover(os.environ, expected_world_size=processes)
    if rendezvous.world_size != processes:
        raise ConfigError(f"started as {rendezvous.world_size} ranks by {rendezvous.source}, "
                          f"but the job runs {processes} ({what})")
    log.info(rendezvous.describe())
    if rendezvous.source == "mpiexec/Hydra":
        # Joining MPI first (importing mpi4py initialises it): mpiexec stops every rank as soon as one that joined
        # fails; one that fails before joining would leave the others waiting in a collective until the time limit.
        from mpi4py import MPI  # noqa: F401
    env = init_distributed(cfg.cluster.device, cfg.cluster.threads_per_worker, rendezvous,
                           cfg.cluster.share_gpus, cfg.cluster.gpu_order)
    try:
        ranks = [None] * env.world_size
        dist.all_gather_object(ranks, rank_info(env.device))
        if env.is_main:
            point_dir.write_manifest(environment_manifest(ranks, env.backend))
        yield env
    finally:
        shutdown()


def train_point(point_dir: PointDir, cfg) -> None:
    from suite.runtime.metrics import limit_cpu_memory
    from suite.strategies import build_strategy
    from suite.worker.trainer import Trainer

    strategy = build_strategy(cfg)
    processes = strategy.layout(cfg).processes
    with process_group(point_dir, cfg, processes, f"workers={cfg.workers}, strategy {strategy.name}") as env:
        memory_gb = cfg.cluster.hardware.device_memory_gb
        if env.device.type == "cpu" and memory_gb:
            limit_cpu_memory(memory_gb * 2**30)
        trainer = Trainer(cfg, env, strategy, point_dir, os.environ.get("SUITE_POINT_LABEL", ""))
        summary = trainer.run()
        if env.is_main:
            point_dir.write_summary(summary)


def calibrate(point_dir: PointDir, cfg) -> None:
    from suite.worker.calibration_rank import Calibration

    with process_group(point_dir, cfg, cfg.workers, f"workers={cfg.workers} for the calibration") as env:
        summary = Calibration(cfg.calibration, env).run()
        if env.is_main:
            point_dir.write_summary(summary)


def run_job(point_dir: PointDir) -> None:
    """Train the point, or calibrate the machine, that the directory's config describes."""
    # Imported here so that a broken import is reported like any other failure of the job.
    from omegaconf import OmegaConf

    from suite.config import is_calibration

    cfg = OmegaConf.load(point_dir.config)
    (calibrate if is_calibration(cfg) else train_point)(point_dir, cfg)


def main(path: str) -> int:
    raise_on_sigterm()
    point_dir = PointDir(path)
    rank = discover(os.environ).rank
    mark("started", rank)
    setup_logging(point_dir, rank)
    try:
        run_job(point_dir)
        mark("done", rank)
        return 0
    except BaseException as exc:
        log.exception("rank %d failed", rank)
        point_dir.write_error(rank, exc)
        return 1



def run_rank(point_dir: str) -> NoReturn:
    """`main`, then the end of this process with its exit code (`python -m suite.worker`, or forked by
    `launchers.fork_server`)."""
    code = main(point_dir)
    # Everything is written; skip the interpreter's teardown (about a second of library finalizers per rank).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
