"""Preallocated rollout buffers and per-actor step slots, in shared memory.

Bulk data (observations, actions, rewards, and the fields the agent records per step) lives in tensors allocated
once, before any actor starts, and shared with the actor processes (torch's file-descriptor strategy: the segments
are unlinked at creation, so nothing is left in /dev/shm even after kill -9). Only buffer indices
and one-byte flags cross process boundaries afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from rlbalance.agents.base import StepField
from rlbalance.envs.batch import EnvSpec

_TORCH_DTYPE = {np.dtype(np.uint8): torch.uint8, np.dtype(np.float32): torch.float32,
                np.dtype(np.float64): torch.float32, np.dtype(np.int64): torch.float32}


def torch_dtype(np_dtype: np.dtype) -> torch.dtype:
    return _TORCH_DTYPE.get(np.dtype(np_dtype), torch.float32)


@dataclass
class RolloutBuffers:
    """``n`` unroll buffers, each [T+1, K]; row t holds x_t, a_t, the agent's record of the step, r_t, done_t."""

    obs: torch.Tensor       # [n, T+1, K, *obs_shape]
    action: torch.Tensor    # [n, T+1, K] int64 (Discrete), [n, T+1, K, dim] int64 or float32 (see distributions)
    reward: torch.Tensor    # [n, T+1, K] float32
    done: torch.Tensor      # [n, T+1, K] bool: the episode (for learning) ended after a_t
    truncated: torch.Tensor  # [n, T+1, K] bool: ...by a time limit; bootstrap from final_obs
    final_obs: torch.Tensor  # [n, T+1, K, *obs_shape]: the last observation where truncated
    ep_end: torch.Tensor    # [n, T+1, K] bool: a whole game ended after a_t
    ep_return: torch.Tensor  # [n, T+1, K] float32: that game's return where ep_end
    ep_length: torch.Tensor  # [n, T+1, K] int64: that game's length where ep_end
    version: torch.Tensor   # [n] int64: policy version (learner updates) that started the unroll
    core: torch.Tensor      # [n, K, S] float32: a recurrent policy's state at row 0 (S = 0: feed-forward)
    client: torch.Tensor    # [n] int64: the env group that filled it (its envs are known by (client, column))
    unroll: torch.Tensor    # [n] int64: that group's unroll number (consecutive unrolls of an env follow on)
    record: dict[str, torch.Tensor] = field(default_factory=dict)  # [n, T+1, K, *shape] each: Agent.step_record

    @classmethod
    def allocate(cls, n: int, t: int, k: int, spec: EnvSpec, shared: bool, record: dict[str, StepField],
                 core_size: int = 0) -> "RolloutBuffers":
        """``record``: the agent's per-step fields (``registry.step_record``)."""
        def z(shape, dtype):
            x = torch.zeros(shape, dtype=dtype)
            return x.share_memory_() if shared else x

        return cls(
            obs=z((n, t + 1, k, *spec.obs_shape), torch_dtype(spec.obs_dtype)),
            action=z((n, t + 1, k, *spec.action.store_shape), spec.action.torch_dtype),
            record={name: z((n, t + 1, k, *f.shape), f.dtype) for name, f in record.items()},
            reward=z((n, t + 1, k), torch.float32),
            done=z((n, t + 1, k), torch.bool),
            truncated=z((n, t + 1, k), torch.bool),
            final_obs=z((n, t + 1, k, *spec.obs_shape), torch_dtype(spec.obs_dtype)),
            ep_end=z((n, t + 1, k), torch.bool),
            ep_return=z((n, t + 1, k), torch.float32),
            ep_length=z((n, t + 1, k), torch.int64),
            version=z((n,), torch.int64),
            core=z((n, k, core_size), torch.float32),
            client=z((n,), torch.int64),
            unroll=z((n,), torch.int64),
        )

    def view(self, i: int) -> "UnrollView":
        """Numpy views of buffer i, for an actor to fill in place."""
        views = {f.name: getattr(self, f.name)[i].numpy() for f in fields(self) if f.name != "record"}
        return UnrollView(**views, record={name: x[i].numpy() for name, x in self.record.items()})

    def gather(self, idx: list[int]) -> dict[str, torch.Tensor]:
        """Copy buffers ``idx`` into one time-major batch [T+1, len(idx)*K, ...]; the record's fields by their names."""
        out = {}
        rows = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("version", "core", "client", "unroll", "record")}
        for name, full in {**rows, **self.record}.items():
            x = full[idx]  # [b, T+1, K, ...] (a copy)
            x = x.transpose(0, 1)
            out[name] = x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])
        out["version"] = self.version[idx].clone()
        out["client"] = self.client[idx].clone()
        out["unroll"] = self.unroll[idx].clone()
        core = self.core[idx]  # [b, K, S]: columns in the order of the time-major rows above
        out["core"] = core.reshape(core.shape[0] * core.shape[1], *core.shape[2:])
        return out


@dataclass
class UnrollView:
    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    ep_end: np.ndarray
    ep_return: np.ndarray
    ep_length: np.ndarray
    version: np.ndarray  # 0-d
    core: np.ndarray     # [K, S]
    client: np.ndarray   # 0-d
    unroll: np.ndarray   # 0-d
    record: dict[str, np.ndarray]  # [T+1, K, *shape] each

    def arrays(self) -> dict[str, np.ndarray]:
        """Every field by name, the record's among them (what a Ray actor sends of a whole unroll)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "record"}
        return {**out, **self.record}

    def load(self, arrays: dict[str, np.ndarray]) -> int:
        """Copy ``arrays`` (as ``arrays()`` gives them) into this buffer; the bytes copied."""
        n = 0
        for name, x in arrays.items():
            (self.record[name] if name in self.record else getattr(self, name))[...] = x
            n += x.nbytes
        return n


@dataclass
class StepSlots:
    """Per-client slots for central inference: the actor writes obs (and, for a recurrent policy, which envs start
    an episode), the server writes actions (and the core state each env's step started from)."""

    obs: torch.Tensor      # [num_actors, K, *obs_shape]
    action: torch.Tensor   # [num_actors, K, *action store shape]
    version: torch.Tensor  # [num_actors] int64
    first: torch.Tensor    # [num_actors, K] bool: obs starts an episode
    core_in: torch.Tensor  # [num_actors, K, S] float32 (S = 0: feed-forward)
    record: dict[str, torch.Tensor]  # [num_actors, K, *shape] each: the agent's record of the step (step_record)

    @classmethod
    def allocate(cls, num_actors: int, k: int, spec: EnvSpec, shared: bool, record: dict[str, StepField],
                 core_size: int = 0) -> "StepSlots":
        def z(shape, dtype):
            x = torch.zeros(shape, dtype=dtype)
            return x.share_memory_() if shared else x

        return cls(obs=z((num_actors, k, *spec.obs_shape), torch_dtype(spec.obs_dtype)),
                   action=z((num_actors, k, *spec.action.store_shape), spec.action.torch_dtype),
                   record={name: z((num_actors, k, *f.shape), f.dtype) for name, f in record.items()},
                   version=z((num_actors,), torch.int64), first=z((num_actors, k), torch.bool),
                   core_in=z((num_actors, k, core_size), torch.float32))


@dataclass
class SharedWeights:
    """A flat copy of the policy's parameters for actor-side inference, with a version counter.

    One writer (the learner) and many readers (actors), with no lock: a reader that is SIGKILLed mid-copy
    must not block the writer. A sequence counter does it (a seqlock): the writer makes it odd while it
    copies and even again after; a reader retries a copy that overlapped a write."""

    flat: torch.Tensor     # [P] float32
    version: torch.Tensor  # [1] int64
    seq: torch.Tensor      # [1] int64: odd while the learner writes

    @classmethod
    def allocate(cls, model: torch.nn.Module) -> "SharedWeights":
        vec = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
        return cls(flat=vec.clone().share_memory_(), version=torch.zeros(1, dtype=torch.int64).share_memory_(),
                   seq=torch.zeros(1, dtype=torch.int64).share_memory_())

    def publish(self, model: torch.nn.Module, version: int) -> None:
        vec = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
        self.seq[0] += 1
        self.flat.copy_(vec)
        self.version[0] = version
        self.seq[0] += 1

    def load_into(self, model: torch.nn.Module) -> int:
        while True:
            before = int(self.seq[0])
            if before % 2:
                time.sleep(0.0005)
                continue
            with torch.no_grad():
                offset = 0
                for p in model.parameters():
                    n = p.numel()
                    p.copy_(self.flat[offset:offset + n].view(p.shape))
                    offset += n
                version = int(self.version[0])
            if int(self.seq[0]) == before:
                return version
