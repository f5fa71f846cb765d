"""Benchmark: the suite's DDP point against a minimal hand-written DDP loop (same model, data, batch).

Run under torchrun with 2 workers (`make bench-overhead`). The two alternate for several rounds in
the same process group, so machine noise hits both; it prints the median step time of each and
their ratio (the suite's overhead; target <= 1.02).

    python -m torch.distributed.run --standalone --nproc-per-node=2 -m suite.tools.benchmarks.overhead \
        [--rounds N] [override ...]     # overrides change the point, e.g. steps_per_epoch=2 (a smoke run)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from suite.data import build_datasets
from suite.models import build_model
from suite.point_dir import PointDir
from suite.runtime.dist import init_distributed, shutdown
from suite.runtime.metrics import synchronize
from suite.runtime.rendezvous import discover
from suite.strategies import build_strategy
from suite.sweep.plan import plan
from suite.worker.trainer import Trainer

POINT = ["dataset=cifar10", "network=resnet18", "strategy=ddp", "workers=2", "batch_size=16",
         "dataset.samples=1024", "dataset.val_samples=32", "epochs=1", "steps_per_epoch=10", "warmup_steps=2",
         "eval_batches=1", "log_every=1000"]
ROUNDS = 7


def minimal_ddp_step_time(cfg, device: torch.device) -> float:
    """What a researcher would write by hand: no timers, no phases, no bookkeeping."""
    torch.manual_seed(cfg.seed)
    data = build_datasets(cfg.dataset, cfg.seed)
    model = DistributedDataParallel(build_model(cfg.network, cfg.dataset).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optimizer.lr, momentum=cfg.optimizer.momentum,
                          weight_decay=cfg.optimizer.weight_decay)
    sampler = DistributedSampler(data.train, shuffle=True, seed=cfg.seed, drop_last=True)
    # Read as the suite reads it (loader processes, pinned pages on a GPU): the ratio is that of the loops alone.
    workers = cfg.dataset.loader_workers
    loader = DataLoader(data.train, cfg.batch_size, sampler=sampler, drop_last=True, num_workers=workers,
                        pin_memory=device.type == "cuda", persistent_workers=workers > 0)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _, (x, y) in zip(range(cfg.warmup_steps), loader):
        step(x, y)
    # The timed steps are an epoch, begun as the suite begins one: its loader starts reading then, and where
    # the loader is the bottleneck (ImageNet-sized images made on the fly) its first batches are waited for.
    sampler.set_epoch(1)
    synchronize(device)
    start = time.perf_counter()
    for _, (x, y) in zip(range(cfg.steps_per_epoch), loader):
        step(x, y)
    synchronize(device)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item() / cfg.steps_per_epoch


def suite_step_time(cfg, env, workdir: str) -> float:
    summary = Trainer(cfg, env, build_strategy(cfg), PointDir(workdir)).run()
    return summary["epoch_time_s_mean"] / summary["steps_per_epoch"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.tools.benchmarks.overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="alternations of the two loops")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to the benchmark's point")
    args = parser.parse_intermixed_args(argv)
    (point,) = plan([POINT + args.overrides], experiment="bench")
    cfg = point.cfg
    rendezvous = discover(os.environ, expected_world_size=point.processes)
    env = init_distributed(cfg.cluster.device, cfg.cluster.threads_per_worker, rendezvous,
                           cfg.cluster.share_gpus, cfg.cluster.gpu_order)
    minimal, suite = [], []
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            minimal.append(minimal_ddp_step_time(cfg, env.device))
            suite.append(suite_step_time(cfg, env, workdir))
            if env.is_main:
                print(f"round {r + 1}/{args.rounds}: minimal {minimal[-1] * 1e3:.1f} ms/step, "
                      f"suite {suite[-1] * 1e3:.1f} ms/step", flush=True)
    if env.is_main:
        m, s = statistics.median(minimal), statistics.median(suite)
        print(f"\n{point.label}, global batch {point.global_batch_size}, {cfg.steps_per_epoch} timed steps x "
              f"{args.rounds} rounds\nmedian step time: minimal DDP loop {m * 1e3:.1f} ms, suite {s * 1e3:.1f} ms\n"
              f"overhead ratio suite/minimal = {s / m:.3f} (target <= 1.02)")
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
