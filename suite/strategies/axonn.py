"""AxoNN (Singh and Bhatele; Study N's authors' framework), run through its own engine as Study N ran it.

`axonn.init` builds AxoNN's process groups over the suite's process group (already initialised: gloo on CPU ranks,
NCCL on GPUs), and each step is AxoNN's `AxoNN_Inter_Layer_Engine.forward_backward_optimizer`: the replica's
micro-batches forward and backward, the cross-entropy in full precision, `sync_gradients` averaging the gradients
over the data-parallel group, and the optimizer's step. This is its data parallelism (G_data = workers); its
inter-layer pipelining (G_inter, over MPI) and intra-layer parallelism (G_intra) are not run by the suite yet.
The installed package is `make axonn`'s (suite/tools/install_axonn.py): as published on GPU machines, patched for
CPU ranks elsewhere; the run records which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from suite.errors import ConfigError
from suite.placement import will_use_cuda
from suite.runtime.optim import build_optimizer
from suite.strategies.base import Library, RankContext, Runtime, Strategy, Supports
from suite.vocabulary import Family

# AxoNN's computation dtype per precision: its own loss scaling in float16 (the final softmax in full precision).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class AxoNNRuntime(Runtime):
    def __init__(self, rank: RankContext, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        from axonn import axonn as ax
        from axonn.inter_layer import AxoNN_Inter_Layer_Engine

        super().__init__(rank, model, optimizer)
        ax.init(G_inter=1, G_data=rank.layout.dp, gpus_per_node=rank.cfg.cluster.workers_per_node)
        ax.config.micro_batch_size = rank.layout.micro_batch_size
        self.engine = AxoNN_Inter_Layer_Engine(model, rank.loss_fn, computation_dtype=DTYPES[rank.cfg.precision])

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One step of AxoNN's engine (forward, backward, gradient sync and update inside it: the phase breakdown has
        no forward, backward or optimizer time for it)."""
        self.optimizer.zero_grad(set_to_none=True)  # the engine accumulates into the gradients it finds
        loss = self.engine.forward_backward_optimizer(inputs, targets, self.optimizer)
        return torch.tensor(loss, device=self.rank.env.device)

    def effective_settings(self) -> dict[str, Any]:
        from suite.tools.install_axonn import installed_build

        build = installed_build() or {"version": "unknown", "build": "not installed by make axonn"}
        return {**super().effective_settings(), "axonn.version": build["version"], "axonn.build": build["build"],
                "precision.implementation": "AxoNN's engine" + (" + its loss scaler"
                                                                if self.rank.cfg.precision == "fp16" else "")}


@dataclass(frozen=True)
class AxoNN(Strategy):
    name: str = "axonn"
    family: ClassVar[Family] = Family.replicated
    label: ClassVar[str] = "AxoNN"
    # The engine runs forward, backward and the step itself: no gradient accumulation of the suite's, no
    # recomputation wrapped around its model.
    supports: ClassVar[Supports] = Supports(activation_checkpointing=False, counts_communication=True)
    requires: ClassVar[tuple[Library, ...]] = (Library("AxoNN", "axonn", "axonn"),)
    accumulation_hint: ClassVar[str] = "AxoNN's engine takes one mini-batch per step"

    def check(self, cfg) -> None:
        if cfg.precision == "fp16" and not will_use_cuda(cfg.cluster):
            raise ConfigError("strategy axonn: precision=fp16 (AxoNN's loss scaling) runs on GPUs only; use fp32 or "
                              "bf16 on CPU ranks")

    def setup(self, model: nn.Module, rank: RankContext) -> AxoNNRuntime:
        model = model.to(rank.env.device)
        return AxoNNRuntime(rank, model, build_optimizer(model.parameters(), rank.cfg.optimizer))
