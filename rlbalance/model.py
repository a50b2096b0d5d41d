"""Actor-critic networks: an MLP for vector observations and the Nature CNN for Atari frames."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .config import ConfigError, LearnerConfig
from .envs import EnvSpec


class ActorCritic(nn.Module):
    """``forward(obs) -> (logits [N, A], value [N])``; uint8 observations are scaled to [0, 1]."""

    def __init__(self, torso: nn.Module, torso_out: int, num_actions: int, value_torso: nn.Module | None = None):
        super().__init__()
        self.torso = torso
        # A separate value torso (MLP default) keeps the large value-loss gradients out of the policy's features.
        self.value_torso = value_torso
        self.policy = nn.Linear(torso_out, num_actions)
        self.baseline = nn.Linear(torso_out, 1)
        nn.init.orthogonal_(self.policy.weight, 0.01)
        nn.init.zeros_(self.policy.bias)
        nn.init.orthogonal_(self.baseline.weight, 1.0)
        nn.init.zeros_(self.baseline.bias)

    @staticmethod
    def _prep(obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / 255.0 if obs.dtype == torch.uint8 else obs.float()
        if x.dim() == 4:  # images: channels-last convolutions are ~25% faster on a CPU (oneDNN) and suit GPUs
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._prep(obs)
        h = self.torso(x)
        hv = h if self.value_torso is None else self.value_torso(x)
        return self.policy(h), self.baseline(hv).squeeze(-1)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample actions; returns (actions [N] int64, logits [N, A]). The value head is not evaluated."""
        logits = self.policy(self.torso(self._prep(obs)))
        # Gumbel-max: argmax(logits + Gumbel noise) is a sample from softmax(logits).
        u = torch.rand(logits.shape, generator=generator, device=logits.device).clamp_(1e-20, 1.0)
        actions = (logits - torch.log(-torch.log(u))).argmax(dim=-1)
        return actions, logits


def _mlp(in_dim: int, hidden: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    for h in hidden:
        lin = nn.Linear(in_dim, h)
        nn.init.orthogonal_(lin.weight, np.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers += [lin, nn.Tanh()]
        in_dim = h
    return nn.Sequential(*layers)


def _nature_cnn(in_ch: int, size: int) -> tuple[nn.Sequential, int]:
    conv = nn.Sequential(
        nn.Conv2d(in_ch, 32, 8, stride=4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
        nn.Flatten(),
    )
    with torch.no_grad():
        flat = conv(torch.zeros(1, in_ch, size, size)).shape[1]
    torso = nn.Sequential(conv, nn.Linear(flat, 512), nn.ReLU())
    for m in torso.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.orthogonal_(m.weight, np.sqrt(2))
            nn.init.zeros_(m.bias)
    return torso, 512


def resolve_model(cfg: LearnerConfig, spec: EnvSpec) -> str:
    if cfg.model != "auto":
        return cfg.model
    return "nature_cnn" if len(spec.obs_shape) == 3 else "mlp"


def build_model(cfg: LearnerConfig, spec: EnvSpec) -> ActorCritic:
    kind = resolve_model(cfg, spec)
    if kind == "mlp":
        in_dim = int(np.prod(spec.obs_shape))
        return ActorCritic(_mlp(in_dim, cfg.hidden_sizes), cfg.hidden_sizes[-1], spec.num_actions,
                           value_torso=_mlp(in_dim, cfg.hidden_sizes))
    if len(spec.obs_shape) != 3 or spec.obs_shape[1] < 36 or spec.obs_shape[2] < 36:
        raise ConfigError(f"learner.model='nature_cnn' needs observations shaped [channels, H, W] with H, W >= 36; "
                          f"this env gives {list(spec.obs_shape)}: use learner.model=mlp")
    torso, out = _nature_cnn(spec.obs_shape[0], spec.obs_shape[1])
    return ActorCritic(torso, out, spec.num_actions)


def resolve_devices(name: str, n: int) -> list[torch.device]:
    """The learner's devices: n CUDA devices, or n CPU replicas."""
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
