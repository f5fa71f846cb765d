"""Strategy knobs reach the library that implements them."""

from types import SimpleNamespace

import pytest
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from suite.config import GradCompressionConfig
from suite.dist import DistEnv, resolve_device
from suite.strategies.ddp import DDP


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield DistEnv(0, 1, 0, 1, resolve_device("cpu", 0), "gloo")
    dist.destroy_process_group()


def test_ddp_knobs_configure_distributed_data_parallel(one_rank_group):
    strategy = DDP(bucket_cap_mb=3.0, gradient_as_bucket_view=True, static_graph=True, find_unused_parameters=True)
    cfg = SimpleNamespace(grad_compression=GradCompressionConfig(name="powersgd", rank=2, start_iter=5))
    model = strategy.parallelize(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), one_rank_group, cfg)
    assert model.bucket_bytes_cap == 3 * 2**20
    assert model.gradient_as_bucket_view and model.static_graph and model.find_unused_parameters
    assert strategy.knobs()["bucket_cap_mb"] == 3.0 and "name" not in strategy.knobs()
    assert isinstance(strategy.unwrap(model), nn.Sequential)
    ((hook, state),) = model._comm_hooks
    assert hook is powerSGD_hook.powerSGD_hook
    assert (state.matrix_approximation_rank, state.start_powerSGD_iter) == (2, 5)
