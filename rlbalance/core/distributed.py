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


def private_rendezvous() -> str:
    """A rendezvous for the learner processes of one node: a file store in a new folder only this user can open
    (0700). Nothing listens on the network for it: torch's TCPStore binds every interface whatever host it is given,
    and rank 0 unpickles what the other ranks send through the group (gather_object, broadcast_object_list), so a
    port reachable from other machines would be a way in. Remove the folder with ``close_rendezvous``."""
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix="rlbalance-rendezvous-"), "store")


def close_rendezvous(path: str | None) -> None:
    import shutil

    if path:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface (``lo`` on Linux), for gloo's and NCCL's sockets."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addrs):
            return name
    return None


def init(rank: int, world: int, device: torch.device, rendezvous: str | None = None,
         timeout_s: float = 120.0) -> None:
    """Join the learners' process group (rank ``rank`` of ``world``). ``rendezvous``: the file store of
    ``private_rendezvous`` (all ranks on this node: the group's sockets are bound to the loopback interface too, so
    no other machine can reach any of them); None: a torchrun launch, at the store torchrun made (MASTER_ADDR and
    MASTER_PORT, which the user chose and which other nodes must reach). A collective that waits longer than
    ``timeout_s`` for a rank fails with torch's error rather than wait forever."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    if rendezvous is None:
        dist.init_process_group(backend_for(device), init_method="env://", rank=rank, world_size=world,
                                timeout=timeout)
        return
    lo = loopback_interface()
    if lo:  # gloo's pairs and NCCL's bootstrap sockets otherwise bind the host name's address
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)
    store = dist.FileStore(rendezvous, world)
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world, timeout=timeout)


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
