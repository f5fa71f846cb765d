"""A site's rules for the jobs it takes, checked before anything is submitted (one line when broken).

- The queue: a queue the user names must take the job's nodes and time; with none named, the first of the
  cluster's `job.queues` that takes them is picked. A cluster that lists no queues is not checked.
- Jobs at once: where a queue lets one user have only so many jobs, a sweep packs its points into that many.
- File systems: the job's python, working directory, results directory and sqlite store must be on a file
  system the compute nodes mount (`job.shared_paths`).
- Retired machines (`job.successor`) take no jobs, not even a dry run's; their configs stay for pricing and
  reports.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

from omegaconf import OmegaConf

from launchers.batch import Job
from suite.errors import ConfigError
from suite.records.store_health import sqlite_file


def span(queue: Any) -> str:
    """The queue with the limits its site documents, e.g. "debug (1-2 nodes, 5-60 min)"."""
    if queue.gpus:
        limits = [f"{'/'.join(str(n) for n in queue.gpus)} GPUs of one node"]
    elif queue.max_nodes is None:
        limits = [f">= {queue.min_nodes} nodes"] if queue.min_nodes > 1 else []
    else:
        limits = [f"{queue.min_nodes}-{queue.max_nodes} nodes"]
    if queue.max_time_min is not None:
        limits.append(f"{queue.min_time_min}-{queue.max_time_min} min")
    if queue.max_jobs is not None:
        limits.append(f"{queue.max_jobs} job(s) at once")
    return f"{queue.name} ({', '.join(limits)})" if limits else queue.name


def takes(queue: Any, nodes: int, ranks_per_node: int, gpus_per_node: int, time_min: int) -> bool:
    """Whether the queue takes a job of `nodes` nodes, with `ranks_per_node` ranks using `gpus_per_node` GPUs on each,
    for `time_min` minutes. A queue of GPU chunks takes only ranks of one GPU each: its chunk is a GPU with its share
    of the node's cores, and a process driving several GPUs is given a whole node instead."""
    if queue.gpus:
        size_ok = nodes == 1 and gpus_per_node == ranks_per_node and gpus_per_node in queue.gpus
    else:
        size_ok = queue.min_nodes <= nodes and (queue.max_nodes is None or nodes <= queue.max_nodes)
    return size_ok and queue.min_time_min <= time_min and (queue.max_time_min is None or time_min <= queue.max_time_min)


def job_queue(cluster: Any, nodes: int, ranks_per_node: int, gpus_per_node: int) -> Any | None:
    """The queue of a job of `nodes` nodes, with `ranks_per_node` ranks using `gpus_per_node` GPUs on each, for the
    cluster's time limit: the one named, else the first the cluster picks from that takes it. None where the
    cluster lists no queues (the named one, or the site's default, goes unchecked). ConfigError, one line, where no
    queue takes it."""
    job = cluster.job
    if not job.queues:
        return None
    time_min = job.time_limit_min
    size = (nodes, ranks_per_node, gpus_per_node, time_min)
    what = f"{nodes} node(s) x {ranks_per_node} rank(s) ({gpus_per_node} GPU(s)) for {time_min} min"
    queues = "; ".join(span(q) for q in job.queues)
    if job.queue:  # a routing queue is listed once per queue it routes to
        named = [q for q in job.queues if q.name == job.queue]
        if not named:
            raise ConfigError(f"queue {job.queue} is not one of cluster {cluster.name}'s: {queues}")
        taking = [q for q in named if takes(q, *size)]
        if not taking:
            raise ConfigError(f"{what} does not fit queue {job.queue} of cluster {cluster.name} (its queues: {queues})")
        return taking[0]
    for queue in job.queues:
        if queue.pick and takes(queue, *size):
            return queue
    by_name = [span(q) for q in job.queues if not q.pick]
    raise ConfigError(f"{what} fits none of the queues cluster {cluster.name} picks from "
                      f"({'; '.join(span(q) for q in job.queues if q.pick)})"
                      + (f"; name one with QUEUE= ({'; '.join(by_name)})" if by_name else "")
                      + ", or change TIME_LIMIT= or the point's nodes")


def with_queue(job: Job) -> Job:
    """The job with its queue named in its cluster config, so that its script asks for it: the one named (the
    sweep names the one its points were given), else the one its ranks, one GPU each, are given."""
    queue = job_queue(job.cluster, job.nodes, job.ranks_per_node, job.gpus_per_node)
    if queue is None or queue.name == job.cluster.job.queue:
        return job
    return replace(job, cluster=OmegaConf.merge(job.cluster, {"job": {"queue": queue.name}}))


def points_per_job(queue: Any | None, configured: int, points: int) -> int:
    """Points each job of a queue runs, one after another: as configured, or more where the queue lets a user have
    fewer jobs at once than that would submit."""
    if queue is None or queue.max_jobs is None:
        return configured
    return max(configured, math.ceil(points / queue.max_jobs))


def _on(path: str, prefixes: list[str]) -> bool:
    # Not resolved: the job runs this very path (a venv's bin/python, not the interpreter it links to).
    absolute = PurePosixPath(os.path.abspath(path))
    return any(absolute.is_relative_to(prefix) for prefix in prefixes)


def check_in_service(cluster: Any) -> None:
    """ConfigError, one line, where the cluster is a retired machine's."""
    if cluster.job.successor:
        raise ConfigError(f"cluster {cluster.name} is retired and takes no jobs (its config stays for pricing and "
                          f"reports): submit to its successor, CLUSTER={cluster.job.successor}")


def unshared_path(job: Job) -> str | None:
    """The line saying which file the job needs is on no file system its compute nodes mount; None if all are."""
    prefixes = job.cluster.job.shared_paths
    if prefixes is None:
        return None
    store = sqlite_file(job.env.get("MLFLOW_TRACKING_URI", ""))
    needed = {"python": job.python, "working directory": str(job.workdir),
              "results directory": job.env.get("SUITE_RESULTS_DIR"), "sqlite store": store and str(store)}
    for what, path in needed.items():
        if path and not _on(path, list(prefixes)):
            return (f"the job's {what} {path} is on no file system the compute nodes of cluster {job.cluster.name} "
                    f"mount ({', '.join(prefixes)}): put it under one (VENV=, SUITE_RESULTS_DIR=, the checkout)")
    return None
