"""The learner device(s) a run names: auto, cpu or cuda (refused, naming the fix, where none is visible)."""

from __future__ import annotations

import torch

from rlbalance.core.errors import ConfigError


def resolve_devices(name: str, n: int) -> list[torch.device]:
    """The devices of n learner processes on one node: cuda:0..n-1 (refused, naming the fix, where fewer are
    visible), or the CPU n times."""
    first = resolve_device(name)
    if n == 1:
        return [first]
    if first.type == "cuda":
        have = torch.cuda.device_count()
        if n > have:
            raise ConfigError(f"learner.devices={n} but {have} CUDA device(s) are visible: use at most {have}")
        return [torch.device("cuda", i) for i in range(n)]
    return [first] * n


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("learner.device='cuda' but no CUDA device is visible: use learner.device=auto or cpu")
    return torch.device(name)
