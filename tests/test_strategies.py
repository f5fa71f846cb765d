"""Strategy knobs reach the library that implements them."""

from types import SimpleNamespace

import pytest
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from suite.config import GradCompressionConfig, OptimizerConfig
from suite.layout import Layout
from suite.runtime.metrics import PhaseTimer
from suite.runtime.numerics import make_precision
from suite.strategies.base import RankContext
from suite.strategies.ddp import DDP, apply_grad_compression


def test_ddp_knobs_configure_distributed_data_parallel(one_rank_group):
    strategy = DDP(bucket_cap_mb=3.0, gradient_as_bucket_view=True, static_graph=True, find_unused_parameters=True)
    env = one_rank_group
    cfg = SimpleNamespace(grad_compression=GradCompressionConfig(), optimizer=OptimizerConfig())
    rank = RankContext(cfg, env, Layout(dp=1, mini_batch=4), make_precision("fp32", env.device),
                       PhaseTimer(env.device), nn.functional.cross_entropy)
    runtime = strategy.setup(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), rank)
    model = runtime.model
    assert model.bucket_bytes_cap == 3 * 2**20
    assert model.gradient_as_bucket_view and model.static_graph and model.find_unused_parameters
    assert strategy.knobs()["bucket_cap_mb"] == 3.0 and "name" not in strategy.knobs()
    assert isinstance(runtime.plain, nn.Sequential)
    assert not model._comm_hooks  # grad_compression none: DDP's own all-reduce


@pytest.mark.parametrize("name, hook", [("fp16", default_hooks.fp16_compress_hook),
                                        ("bf16", default_hooks.bf16_compress_hook),
                                        ("powersgd", powerSGD_hook.powerSGD_hook)])
def test_grad_compression_registers_its_ddp_hook(one_rank_group, name, hook):
    model = DistributedDataParallel(nn.Linear(8, 2))
    apply_grad_compression(model, GradCompressionConfig(name=name, rank=2, start_iter=5))
    ((registered, state),) = model._comm_hooks
    assert registered is hook
    if name == "powersgd":
        assert (state.matrix_approximation_rank, state.start_powerSGD_iter) == (2, 5)
