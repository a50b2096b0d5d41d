"""Action spaces and the policy distributions over them.

An :class:`ActionSpec` describes what the env takes; the policy's output for one env is a flat vector of
distribution parameters (``param_size`` floats), which is what the actors record as the behaviour policy
("logits" in the buffers) and what the learner turns into log-probabilities and entropies:

- ``Discrete(n)``: n logits, a categorical distribution.
- ``MultiDiscrete(nvec)`` (and ``MultiBinary(n)``, as n twos): the logits of each sub-action side by side,
  independent categoricals; log-probabilities and entropies add up.
- ``Box`` (any shape, flattened): a diagonal Gaussian, mean from the network and a state-independent
  log standard deviation (a learned parameter), stored as [mean, log_std]. The sampled action is recorded
  unchanged (so its log-probability is exact) and *clipped* to the space's bounds only when the env gets it,
  as CleanRL's and Stable-Baselines3's PPO do; squashing (tanh) would change the log-probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

_LOG_2PI = math.log(2 * math.pi)


@dataclass(frozen=True)
class ActionSpec:
    kind: str                          # 'discrete' | 'multi_discrete' | 'box'
    nvec: tuple[int, ...] = ()         # discrete: (n,); multi_discrete: each sub-action's choices
    shape: tuple[int, ...] = ()        # box: the env's action shape (flattened to dim for the policy)
    low: tuple[float, ...] = ()        # box: bounds per flattened dim (may be infinite)
    high: tuple[float, ...] = ()
    binary: bool = False               # multi_discrete made from a MultiBinary space

    @classmethod
    def discrete(cls, n: int) -> "ActionSpec":
        return cls("discrete", (int(n),))

    @classmethod
    def from_space(cls, space, env_id: str = "") -> "ActionSpec":
        """The spec of a gymnasium action space; a ConfigError (naming the space) for anything unsupported."""
        import gymnasium as gym

        from rlbalance.core.errors import ConfigError

        if isinstance(space, gym.spaces.Discrete):
            if int(space.start) != 0:
                raise ConfigError(f"env.id={env_id!r}: its action space {space} starts at {space.start}; "
                                  "supported: Discrete starting at 0 (wrap the env to shift its actions)")
            return cls.discrete(int(space.n))
        if isinstance(space, gym.spaces.MultiDiscrete):
            if space.nvec.ndim != 1 or np.any(space.start != 0):
                raise ConfigError(f"env.id={env_id!r}: its action space {space} is not supported; MultiDiscrete "
                                  "must be one-dimensional and start at 0")
            return cls("multi_discrete", tuple(int(x) for x in space.nvec))
        if isinstance(space, gym.spaces.MultiBinary):
            n = int(np.prod(space.shape))
            return cls("multi_discrete", (2,) * n, shape=tuple(space.shape), binary=True)
        if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):
            low, high = space.low.reshape(-1).astype(float), space.high.reshape(-1).astype(float)
            return cls("box", shape=tuple(space.shape), low=tuple(low.tolist()), high=tuple(high.tolist()))
        raise ConfigError(f"env.id={env_id!r}: its action space {space} is not supported; supported: Discrete, "
                          "MultiDiscrete, MultiBinary and Box of floats (a diagonal Gaussian policy)")

    # --- sizes and storage ---------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        """Actions per env step: 1 sub-action for Discrete, len(nvec), or the Box's flattened size."""
        if self.kind == "box":
            return int(np.prod(self.shape)) if self.shape else 1
        return len(self.nvec) if self.kind == "multi_discrete" else 1

    @property
    def head_size(self) -> int:
        """The policy head's outputs: logits, or the Gaussian's means."""
        return self.dim if self.kind == "box" else int(sum(self.nvec))

    @property
    def param_size(self) -> int:
        """The recorded behaviour parameters per env: logits, or [mean, log_std]."""
        return 2 * self.dim if self.kind == "box" else int(sum(self.nvec))

    @property
    def store_shape(self) -> tuple[int, ...]:
        """One env step's action as stored: () for Discrete, (dim,) otherwise."""
        return () if self.kind == "discrete" else (self.dim,)

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float32 if self.kind == "box" else torch.int64

    def describe(self) -> str:
        if self.kind == "discrete":
            return f"Discrete({self.nvec[0]})"
        if self.kind == "multi_discrete":
            return f"MultiBinary({self.dim})" if self.binary else f"MultiDiscrete({list(self.nvec)})"
        return f"Box({list(self.shape)})"

    # --- to and from the env -------------------------------------------------------------------------
    def to_env(self, action: np.ndarray):
        """One env's stored action as the env takes it (a Box action clipped to its bounds)."""
        if self.kind == "discrete":
            return int(action)
        if self.kind == "multi_discrete":
            a = np.asarray(action, dtype=np.int64)
            return a.astype(np.int8).reshape(self.shape) if self.binary else a
        a = np.clip(np.asarray(action, dtype=np.float32), self._low, self._high)
        return a.reshape(self.shape)

    def batch_to_env(self, actions: np.ndarray) -> np.ndarray:
        """A batch [K, ...] of stored actions as a vector env takes them."""
        if self.kind == "box":
            return np.clip(actions.astype(np.float32), self._low, self._high).reshape(len(actions), *self.shape)
        return actions

    @property
    def _low(self) -> np.ndarray:
        return np.asarray(self.low, dtype=np.float32)

    @property
    def _high(self) -> np.ndarray:
        return np.asarray(self.high, dtype=np.float32)

    def random(self, rng: np.random.Generator, k: int) -> np.ndarray:
        """K uniformly random actions, as stored (a Box's infinite bounds read as [-1, 1])."""
        if self.kind == "discrete":
            return rng.integers(0, self.nvec[0], k)
        if self.kind == "multi_discrete":
            return rng.integers(0, np.asarray(self.nvec), (k, self.dim))
        low = np.where(np.isfinite(self._low), self._low, -1.0)
        high = np.where(np.isfinite(self._high), self._high, 1.0)
        return rng.uniform(low, high, (k, self.dim)).astype(np.float32)

    # --- the distribution, on parameter tensors [..., param_size] -----------------------------------
    def _split(self, params: torch.Tensor) -> list[torch.Tensor]:
        return list(params.split(list(self.nvec), dim=-1))

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a) [...] for parameters [..., P] and stored actions [...] or [..., dim]."""
        if self.kind == "discrete":
            return F.log_softmax(params, dim=-1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        if self.kind == "multi_discrete":
            a = actions.long()
            return sum(F.log_softmax(p, dim=-1).gather(-1, a[..., i:i + 1]).squeeze(-1)
                       for i, p in enumerate(self._split(params)))
        mean, log_std = params.chunk(2, dim=-1)
        z = (actions.float() - mean) * torch.exp(-log_std)
        return (-0.5 * z.pow(2) - log_std - 0.5 * _LOG_2PI).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        if self.kind == "discrete":
            logp = F.log_softmax(params, dim=-1)
            return -(logp.exp() * logp).sum(-1)
        if self.kind == "multi_discrete":
            return sum(-(F.softmax(p, -1) * F.log_softmax(p, -1)).sum(-1) for p in self._split(params))
        _, log_std = params.chunk(2, dim=-1)
        return (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(-1)

    def sample(self, params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Actions [N] or [N, dim] drawn from parameters [N, P]."""
        if self.kind == "box":
            mean, log_std = params.chunk(2, dim=-1)
            noise = torch.randn(mean.shape, generator=generator, device=mean.device)
            return mean + noise * log_std.exp()
        parts = [params] if self.kind == "discrete" else self._split(params)
        out = []
        for p in parts:
            # Gumbel-max: argmax(logits + Gumbel noise) is a sample from softmax(logits).
            u = torch.rand(p.shape, generator=generator, device=p.device).clamp_(1e-20, 1.0)
            out.append((p - torch.log(-torch.log(u))).argmax(dim=-1))
        return out[0] if self.kind == "discrete" else torch.stack(out, dim=-1)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        """The most likely action (the Gaussian's mean)."""
        if self.kind == "discrete":
            return params.argmax(dim=-1)
        if self.kind == "multi_discrete":
            return torch.stack([p.argmax(dim=-1) for p in self._split(params)], dim=-1)
        return params.chunk(2, dim=-1)[0]
