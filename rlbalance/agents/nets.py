"""Network pieces every agent builds from: the MLP and Nature CNN torsos, observation scaling and
normalisation, the LSTM step and sequence, the bfloat16 torso, and moving a batch to the learner device."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlbalance.agents.precision import resolve as resolve_precision
from rlbalance.config import LearnerConfig
from rlbalance.core.errors import ConfigError
from rlbalance.envs.batch import EnvSpec


def batch_to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A batch on ``device``: on CUDA pinned first, then copied without blocking."""
    nb = device.type == "cuda"
    return {k: (v.pin_memory() if nb else v).to(device, non_blocking=nb) for k, v in batch.items()}


class ObsNorm(nn.Module):
    """Running mean and variance of the observations (parallel Welford updates from each training batch),
    applied as (x - mean) / sqrt(var + eps) clipped to [-clip, clip]. The statistics are parameters without
    gradients, so checkpoints, actor-side weight copies and replicas carry them with the weights."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0):
        super().__init__()
        self.mean = nn.Parameter(torch.zeros(shape), requires_grad=False)
        self.var = nn.Parameter(torch.ones(shape), requires_grad=False)
        self.count = nn.Parameter(torch.full((1,), 1e-4), requires_grad=False)
        self.clip = clip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch [..., *shape] into the statistics."""
        x = x.reshape(-1, *self.mean.shape).float()
        if x.shape[0]:
            self.fold(x.shape[0], x.mean(0), x.var(0, unbiased=False))

    @torch.no_grad()
    def fold(self, n: float, b_mean: torch.Tensor, b_var: torch.Tensor) -> None:
        """Fold a batch's count, mean and (biased) variance into the statistics (parallel Welford)."""
        if n == 0:
            return
        total = self.count + n
        delta = b_mean - self.mean
        m2 = self.var * self.count + b_var * n + delta.pow(2) * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)


def lstm_step(core: nn.LSTMCell, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM step; ``state`` [N, 2H] holds (h, c) side by side: returns (h, the new [N, 2H])."""
    h, c = core(x, (state[:, :core.hidden_size], state[:, core.hidden_size:]))
    return h, torch.cat([h, c], dim=1)


def lstm_sequence(core: nn.LSTMCell, x: torch.Tensor, state0: torch.Tensor, keep: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``core`` over rows x [T1, N, F] from ``state0`` [N, 2H], the state zeroed before row t where ``keep`` [T1, N]
    is 0 (row 0's is ignored): the same arithmetic as ``lstm_step`` row after row, with the input projection of all
    rows done as one matrix product (one large GEMM instead of T1 small ones: ~5% of an R2D2 Pong update on a CPU).
    Returns (h [T1, N, H], the state after each row [T1, N, 2H])."""
    size = core.hidden_size
    gx = F.linear(x, core.weight_ih, core.bias_ih)
    h, c = state0[:, :size], state0[:, size:]
    hs, cs = [], []
    for t in range(x.shape[0]):
        if t:
            k = keep[t].view(-1, 1)
            h, c = h * k, c * k
        gates = gx[t] + F.linear(h, core.weight_hh, core.bias_hh)
        i, f, g, o = gates.chunk(4, dim=1)  # (LSTMCell's gate order)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
        cs.append(c)
    hs_t = torch.stack(hs)
    return hs_t, torch.cat([hs_t, torch.stack(cs)], dim=-1)


def run_torso(torso: nn.Module, x: torch.Tensor, precision: str = "fp32") -> torch.Tensor:
    """``torso(x)``; at precision 'bf16' under bfloat16 autocast on x's device, the features returned as float32
    (learner.torso_precision; 'auto' is decided per device and input by rlbalance.agents.precision)."""
    if precision == "auto":
        precision = resolve_precision("auto", x.device.type, x.dim() == 4)
    if precision != "bf16":
        return torso(x)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        return torso(x).float()


def scaled_input(obs: torch.Tensor, precision: str = "fp32") -> torch.Tensor:
    """Observations as the networks take them: float, uint8 scaled to [0, 1], images [N, C, H, W] channels-last
    (oneDNN's convolutions run ~25% faster in that layout on a CPU, and it suits GPUs). Where the torso runs at
    bfloat16 (``precision``, see run_torso) uint8 images become bfloat16 here, the copy autocast would make anyway;
    bfloat16 images (``prepared_frames``) are taken as they are. The layout is changed on the uint8 bytes and the
    scaling done in place, one float copy in all: float-then-reorder made two copies and a division, ~13% of an
    R2D2 Pong update on a CPU."""
    if obs.dim() != 4:
        return obs.float().mul_(1.0 / 255.0) if obs.dtype == torch.uint8 else obs.float()
    x = obs.contiguous(memory_format=torch.channels_last)
    bf16 = resolve_precision(precision, obs.device.type, True) == "bf16"
    if obs.dtype != torch.uint8:
        return x if x.dtype == torch.bfloat16 and bf16 else x.float()
    return x.to(torch.bfloat16 if bf16 else torch.float32).mul_(1.0 / 255.0)


def prepared_frames(x: torch.Tensor, precision: str) -> torch.Tensor:
    """Unrolls of uint8 images [T, N, C, H, W] as the torso takes them (see scaled_input: scaled to [0, 1], at
    bfloat16 where the torso runs at it, else float32), each frame stored channels-last (a view of that shape over
    [T, N, H, W, C] memory): done once per batch, so the rows a learner takes for each minibatch and epoch are
    ready as they are. Other tensors as they are."""
    if x.dim() != 5 or x.dtype != torch.uint8:
        return x
    bf16 = resolve_precision(precision, x.device.type, True) == "bf16"
    nhwc = x.permute(0, 1, 3, 4, 2)
    out = torch.empty(nhwc.shape, dtype=torch.bfloat16 if bf16 else torch.float32, device=x.device)
    return out.copy_(nhwc).mul_(1.0 / 255.0).permute(0, 1, 4, 2, 3)


def select_columns(x: torch.Tensor, dim: int, idx: torch.Tensor) -> torch.Tensor:
    """``x.index_select(dim, idx)`` (a memory copy of whole slices: ~7x faster than advanced indexing on a CPU for
    Atari frames) that keeps frames stored channels-last (``prepared_frames``) so."""
    if x.dim() == 5 and dim < 2 and x.stride(2) == 1 and x.shape[2] > 1:
        return x.permute(0, 1, 3, 4, 2).index_select(dim, idx).permute(0, 1, 4, 2, 3)
    return x.index_select(dim, idx)


def select_steps(x: torch.Tensor, t: int, idx: torch.Tensor) -> torch.Tensor:
    """Steps ``idx`` of the first ``t`` rows of [T+1, N, ...] unrolls, numbered time-major (step ``s * N + j`` is
    row s of column j), as [1, len(idx), ...]: a minibatch of single steps drawn from across the batch, as PPO
    shuffles its rollout. Frames stored channels-last (``prepared_frames``) stay so."""
    if x.dim() == 5 and x.stride(2) == 1 and x.shape[2] > 1:
        nhwc = x[:t].permute(0, 1, 3, 4, 2)
        return nhwc.reshape(-1, *nhwc.shape[2:]).index_select(0, idx).unsqueeze(0).permute(0, 1, 4, 2, 3)
    return x[:t].reshape(-1, *x.shape[2:]).index_select(0, idx).unsqueeze(0)


def make_adam(params, lr: float, eps: float, device: torch.device) -> torch.optim.Adam:
    """Adam as every learner takes it: the fused kernel (one pass over all parameters per step instead of a loop
    of small kernels per tensor; ~4x cheaper a step on a CPU for the Nature CNN, bench/results/precision/), the
    same update rule."""
    return torch.optim.Adam(list(params), lr=lr, eps=eps, fused=device.type in ("cpu", "cuda"))


def clear_grads(params: Sequence[torch.Tensor]) -> None:
    """``optimizer.zero_grad(set_to_none=True)`` for a parameter list, without the optimizer's per-call wrapping
    (~0.1 ms a step: a tenth of a small MLP's whole optimizer step on a CPU)."""
    for p in params:
        p.grad = None


def clip_grads(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for a parameter list of one device and dtype (a learner's): the global
    2-norm of the gradients (returned, before clipping) and the gradients scaled to at most ``max_norm``, in three
    multi-tensor ops, without the per-call grouping of tensors by device (~40% of its cost for a small MLP)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def load_optimizer(opt: torch.optim.Optimizer, state: dict) -> None:
    """``opt.load_state_dict(state)``, keeping ``opt``'s own kernel choice: a checkpoint's param groups carry the
    settings of the optimizer that wrote it (``fused`` None in checkpoints from before make_adam), which would
    otherwise replace this one's."""
    opt.load_state_dict(state)
    for g in opt.param_groups:
        for key in ("fused", "foreach"):
            if key in opt.defaults:
                g[key] = opt.defaults[key]


def mlp(in_dim: int, hidden: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    for h in hidden:
        lin = nn.Linear(in_dim, h)
        nn.init.orthogonal_(lin.weight, np.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers += [lin, nn.Tanh()]
        in_dim = h
    return nn.Sequential(*layers)


def nature_cnn(in_ch: int, size: int) -> tuple[nn.Sequential, int]:
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
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return torso, 512


def resolve_model(cfg: LearnerConfig, spec: EnvSpec) -> str:
    if cfg.model != "auto":
        return cfg.model
    return "nature_cnn" if len(spec.obs_shape) == 3 else "mlp"


def check_cnn_shape(spec: EnvSpec) -> None:
    if len(spec.obs_shape) != 3 or spec.obs_shape[1] < 36 or spec.obs_shape[2] < 36:
        raise ConfigError(f"learner.model='nature_cnn' needs observations shaped [channels, H, W] with H, W >= 36; "
                          f"this env gives {list(spec.obs_shape)}: use learner.model=mlp")
