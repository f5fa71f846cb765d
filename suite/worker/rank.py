"""One rank of a point: `python -m suite.worker <point dir>`, started by a launcher (the local one, srun, jsrun,
mpiexec).

It reads the resolved config from the point directory, finds its place in the job from the launcher's
environment (`suite.runtime.rendezvous`), trains, and leaves its results there (see `suite.records.point_dir`).
Rank 0 prints progress; every rank logs to logs/rank<r>.log. SIGTERM stops it as `timeout`.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys

from suite.records.point_dir import PointDir
from suite.runtime.rendezvous import discover
from suite.signals import raise_on_sigterm

log = logging.getLogger("suite")


def setup_logging(out: PointDir, rank: int) -> None:
    out.logs.mkdir(parents=True, exist_ok=True)
    logfile = open(out.rank_log(rank), "a", buffering=1)
    faulthandler.enable(file=logfile)  # a crash in native code still leaves its stack in the log
    handlers: list[logging.Handler] = [logging.StreamHandler(logfile)]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank{rank}] %(message)s", handlers=handlers)


def train_point(out: PointDir) -> None:
    # Imported here so that a broken import is reported like any other failure of the point.
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from suite.errors import ConfigError
    from suite.records.manifest import environment_manifest, rank_info
    from suite.runtime.dist import init_distributed, shutdown
    from suite.strategies import build_strategy
    from suite.worker.trainer import Trainer

    cfg = OmegaConf.load(out.config)
    strategy = build_strategy(cfg)
    processes = strategy.layout(cfg).processes
    rendezvous = discover(os.environ, expected_world_size=processes)
    if rendezvous.world_size != processes:
        raise ConfigError(f"started as {rendezvous.world_size} ranks by {rendezvous.source}, "
                          f"but the point runs {processes} (workers={cfg.workers}, strategy {strategy.name})")
    log.info(rendezvous.describe())
    env = init_distributed(cfg.cluster.device, cfg.cluster.threads_per_worker, rendezvous)
    try:
        ranks = [None] * env.world_size
        dist.all_gather_object(ranks, rank_info(env.device))
        if env.is_main:
            out.write_manifest(environment_manifest(ranks, env.backend))
        trainer = Trainer(cfg, env, strategy, out, os.environ.get("SUITE_POINT_LABEL", ""))
        summary = trainer.run()
        if env.is_main:
            out.write_summary(summary)
    finally:
        shutdown()


def main(point_dir: str) -> int:
    raise_on_sigterm()
    out = PointDir(point_dir)
    rank = discover(os.environ).rank
    setup_logging(out, rank)
    try:
        train_point(out)
        return 0
    except BaseException as exc:
        log.exception("rank %d failed", rank)
        out.write_error(rank, exc)
        return 1

