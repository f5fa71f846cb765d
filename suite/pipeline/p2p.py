"""Tensors of any shape and dtype between two ranks: a small header (dtype, shape) then the data.

Messages between one pair of ranks arrive in the order they were sent, so a header and its data
never interleave with another message from the same sender.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64)
MAX_DIMS = 8


def _header(tensor: torch.Tensor) -> torch.Tensor:
    header = torch.zeros(2 + MAX_DIMS, dtype=torch.int64)
    header[0], header[1] = DTYPES.index(tensor.dtype), tensor.dim()
    header[2:2 + tensor.dim()] = torch.tensor(tensor.shape)
    return header


def isend(tensor: torch.Tensor, peer: int, group=None) -> list:
    """Start sending to global rank `peer` over `group` (None: the default group); the returned works hold the
    buffers alive until waited on."""
    tensor = tensor.detach().contiguous()
    header = _header(tensor).to(tensor.device)
    return [dist.isend(header, peer, group), dist.isend(tensor, peer, group)]


def recv(peer: int, device: torch.device, group=None) -> torch.Tensor:
    header = torch.empty(2 + MAX_DIMS, dtype=torch.int64, device=device)
    dist.recv(header, peer, group)
    dtype, dims = DTYPES[int(header[0])], int(header[1])
    tensor = torch.empty(header[2:2 + dims].tolist(), dtype=dtype, device=device)
    dist.recv(tensor, peer, group)
    return tensor


def wait_all(works: list) -> None:
    for work in works:
        work.wait()
    works.clear()
