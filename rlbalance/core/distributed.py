"""torch.distributed for the learner: one learner process per device, gradients all-reduced by
DistributedDataParallel (NCCL between GPUs, gloo on CPUs), so every replica holds the same weights after each
optimizer step. The algorithm code (the agents' learners) asks this module only for the process group's size and
for the sums it needs across ranks; process start-up and rendezvous live here too.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist


def backend_for(device: torch.device) -> str:
    """NCCL between GPUs, gloo between CPU learners."""
    return "nccl" if device.type == "cuda" else "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, for a one-node rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init(rank: int, world: int, device: torch.device, addr: str = "127.0.0.1", port: int | None = None,
         timeout_s: float = 120.0) -> None:
    """Join the learners' process group (rank ``rank`` of ``world``) over TCP at ``addr``:``port``; with no port
    (a torchrun launch), at the MASTER_ADDR/MASTER_PORT it sets. A collective that waits longer than
    ``timeout_s`` for a rank fails with torch's error rather than wait forever."""
    if port is None:
        addr = os.environ.get("MASTER_ADDR", addr)
        port = int(os.environ.get("MASTER_PORT", 29500))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for(device), init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def close() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@torch.no_grad()
def global_moments(x: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Count, mean and (biased) variance over the rows of ``x`` [n, *shape] on every rank together: each rank
    contributes its count, sum and sum of squares to one all-reduce, so every rank gets the same figures."""
    x = x.float()
    packed = torch.cat([torch.tensor([float(x.shape[0])], device=x.device), x.sum(0).flatten(),
                        x.pow(2).sum(0).flatten()])
    dist.all_reduce(packed)
    n = packed[0]
    size = x[0].numel()
    mean = (packed[1:1 + size] / n).reshape(x.shape[1:])
    var = (packed[1 + size:] / n).reshape(x.shape[1:]) - mean.pow(2)
    return float(n), mean, var.clamp_min(0.0)


def all_max(value: float, device: torch.device | str = "cpu") -> float:
    """The largest of ``value`` over every rank (``value`` itself without a process group)."""
    if world_size() == 1:
        return float(value)
    t = torch.tensor([float(value)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def all_min(value: float, device: torch.device | str = "cpu") -> float:
    """The smallest of ``value`` over every rank."""
    return -all_max(-value, device)
