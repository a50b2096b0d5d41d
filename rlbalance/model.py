"""Actor-critic networks: an MLP for vector observations and the Nature CNN for Atari frames."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .config import ConfigError, LearnerConfig
from .distributions import ActionSpec
from .envs import EnvSpec


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
    """``torso(x)``; with ``precision`` 'bf16' under bfloat16 autocast on x's device, the features returned as float32
    (learner.torso_precision)."""
    if precision != "bf16":
        return torso(x)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        return torso(x).float()


def scaled_input(obs: torch.Tensor) -> torch.Tensor:
    """Observations as the networks take them: float, uint8 scaled to [0, 1], images [N, C, H, W] channels-last
    (oneDNN's convolutions run ~25% faster in that layout on a CPU, and it suits GPUs). The layout is changed on
    the uint8 bytes and the scaling done in place, one float copy in all: float-then-reorder made two copies and a
    division, ~13% of an R2D2 Pong update on a CPU."""
    x = obs.contiguous(memory_format=torch.channels_last) if obs.dim() == 4 else obs
    return x.float().mul_(1.0 / 255.0) if obs.dtype == torch.uint8 else x.float()


class ActorCritic(nn.Module):
    """``forward(obs) -> (policy parameters [N, P], value [N])``; uint8 observations are scaled to [0, 1].

    The policy parameters are those of ``action`` (rlbalance.distributions): logits for discrete spaces,
    [mean, log_std] for a Box (the log-std a state-independent parameter)."""

    def __init__(self, torso: nn.Module, torso_out: int, num_actions: int | ActionSpec,
                 value_torso: nn.Module | None = None, obs_norm: ObsNorm | None = None, core_size: int = 0):
        super().__init__()
        self.action = num_actions if isinstance(num_actions, ActionSpec) else ActionSpec.discrete(num_actions)
        self.torso = torso
        self.torso_precision = "fp32"  # learner.torso_precision (build_model sets it): see run_torso
        # A separate value torso (MLP default) keeps the large value-loss gradients out of the policy's features.
        self.value_torso = value_torso
        self.obs_norm = obs_norm
        # A recurrent core (learner.core=lstm) between the torso and the heads. With a separate value torso (the
        # MLP) the value has its own core too (as Stable-Baselines3's recurrent PPO keeps separate actor and critic
        # LSTMs); the Nature CNN's heads share one. An env's state is one flat row [h, c (, h_v, c_v)], carried by
        # whoever evaluates the policy (the inference server, an actor) and recorded at the start of each unroll.
        self.core = nn.LSTMCell(torso_out, core_size) if core_size else None
        self.value_core = nn.LSTMCell(torso_out, core_size) if core_size and value_torso is not None else None
        self.core_size = core_size
        self.state_size = core_size * (4 if self.value_core is not None else 2)
        head_in = core_size or torso_out
        self.policy = nn.Linear(head_in, self.action.head_size)
        self.baseline = nn.Linear(head_in, 1)
        self.log_std = nn.Parameter(torch.zeros(self.action.dim)) if self.action.kind == "box" else None
        nn.init.orthogonal_(self.policy.weight, 0.01)
        nn.init.zeros_(self.policy.bias)
        nn.init.orthogonal_(self.baseline.weight, 1.0)
        nn.init.zeros_(self.baseline.bias)

    def _prep(self, obs: torch.Tensor) -> torch.Tensor:
        x = scaled_input(obs)
        return self.obs_norm(x) if self.obs_norm is not None else x  # (MLP only: no image layout to keep)

    def _policy_features(self, x: torch.Tensor) -> torch.Tensor:
        return run_torso(self.torso, x, self.torso_precision)

    def _value_features(self, x: torch.Tensor) -> torch.Tensor:
        return run_torso(self.value_torso, x, self.torso_precision)

    def _params(self, h: torch.Tensor) -> torch.Tensor:
        out = self.policy(h)
        if self.log_std is not None:
            out = torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        return out

    def forward(self, obs: torch.Tensor, state0: torch.Tensor | None = None, first: torch.Tensor | None = None):
        """(policy parameters [N, P], values [N]) of observations [N, ...]; a recurrent model takes unrolls
        instead, see ``forward_sequence`` (the learner calls it through here, so DistributedDataParallel sees it)."""
        if self.core is not None:
            if state0 is None or first is None:
                raise TypeError("a recurrent model runs over unrolls: model(obs [T1, N, ...], state0 [N, S], "
                                "first [T1, N]); one step is act_recurrent")
            return self.forward_sequence(obs, state0, first)
        x = self._prep(obs)
        h = self._policy_features(x)
        hv = h if self.value_torso is None else self._value_features(x)
        return self._params(h), self.baseline(hv).squeeze(-1)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample actions; returns (actions [N] or [N, dim], policy parameters [N, P]). The value head is not
        evaluated. A recurrent model acts from the state at an episode's start (its stepping is ``act_recurrent``)."""
        if self.core is not None:
            first = torch.ones(obs.shape[0], dtype=torch.bool, device=obs.device)
            actions, params, _, _ = self.act_recurrent(obs, self.initial_state(obs.shape[0], obs.device), first,
                                                       generator)
            return actions, params
        params = self._params(self._policy_features(self._prep(obs)))
        return self.action.sample(params, generator), params

    @property
    def recurrent(self) -> bool:
        return self.core is not None

    def initial_state(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The core state of ``n`` envs at the start of an episode: zeros [n, state_size]."""
        return torch.zeros(n, self.state_size, device=device)

    def _policy_step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's features and the next state, for observations [N, ...] after states [N, state_size]."""
        x = self._prep(obs)
        h, pol = lstm_step(self.core, self._policy_features(x), state[:, :2 * self.core_size])
        if self.value_core is None:
            return h, pol
        _, val = lstm_step(self.value_core, self._value_features(x), state[:, 2 * self.core_size:])
        return h, torch.cat([pol, val], dim=1)

    @torch.inference_mode()
    def act_recurrent(self, obs: torch.Tensor, state: torch.Tensor, first: torch.Tensor,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                         torch.Tensor]:
        """One step of a recurrent policy for N envs: ``state`` [N, state_size] their core states after the last
        step, ``first`` [N] bool whether ``obs`` starts an episode (the state is reset to zeros there). Returns
        (actions, policy parameters, the state this step started from (after the reset), the state after it)."""
        state_in = state * (~first).to(state.dtype).view(-1, 1)
        h, state_out = self._policy_step(obs, state_in)
        params = self._params(h)
        return self.action.sample(params, generator), params, state_in, state_out

    def forward_sequence(self, obs: torch.Tensor, state0: torch.Tensor, first: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A recurrent model over unrolls: ``obs`` [T1, N, ...], ``state0`` [N, state_size] the state row 0 started
        from (as the actor recorded it), ``first`` [T1, N] bool whether row t starts an episode (row 0's is
        ignored: ``state0`` is already reset). Returns policy parameters [T1, N, P], values [T1, N] and the state
        after each row [T1, N, state_size] (before any reset of the next)."""
        t1, n = obs.shape[:2]
        x = self._prep(obs.reshape(t1 * n, *obs.shape[2:]))
        xp = self._policy_features(x).reshape(t1, n, -1)
        xv = self._value_features(x).reshape(t1, n, -1) if self.value_core is not None else None
        keep = (~first).to(state0.dtype)
        two = 2 * self.core_size
        hp, states = lstm_sequence(self.core, xp, state0[:, :two], keep)
        hv = hp
        if xv is not None:
            hv, val_states = lstm_sequence(self.value_core, xv, state0[:, two:], keep)
            states = torch.cat([states, val_states], dim=-1)
        return self._params(hp), self.baseline(hv).squeeze(-1), states

    def values_after(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Values [N] of observations that follow the core states ``state`` [N, state_size] (a recurrent model's
        bootstrap from a time limit's last observation)."""
        x = self._prep(obs)
        if self.value_core is None:
            h, _ = lstm_step(self.core, self._policy_features(x), state)
        else:
            h, _ = lstm_step(self.value_core, self._value_features(x), state[:, 2 * self.core_size:])
        return self.baseline(h).squeeze(-1)


@torch.inference_mode()
def policy_actions(model: ActorCritic, x: torch.Tensor, generator: torch.Generator | None, greedy: bool,
                   state: torch.Tensor | None = None, first: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Actions for observations ``x`` (greedy: the distribution's mode), as evaluation plays them; a recurrent
    model also takes its envs' core states and which observations start an episode, and returns the new states."""
    if model.recurrent:
        actions, params, _, state = model.act_recurrent(x, state, first, generator)
    else:
        actions, params = model.act(x, generator)
    return (model.action.mode(params) if greedy else actions), state


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
    if cfg.agent == "r2d2":
        from .agents.r2d2 import R2D2Net

        if spec.action.kind != "discrete":
            raise ConfigError(f"learner.agent=r2d2 needs a Discrete action space (Q-learning over actions); this env "
                              f"has {spec.action.describe()}: use learner.agent=vtrace")
        if kind == "nature_cnn":
            _check_cnn_shape(spec)
        model = R2D2Net(spec.obs_shape, spec.num_actions, cfg.hidden_sizes, cfg.core_units, cnn=kind == "nature_cnn")
    elif kind == "mlp":
        in_dim = int(np.prod(spec.obs_shape))
        norm = ObsNorm(tuple(spec.obs_shape)) if cfg.normalize_observations else None
        model = ActorCritic(_mlp(in_dim, cfg.hidden_sizes), cfg.hidden_sizes[-1], spec.action,
                            value_torso=_mlp(in_dim, cfg.hidden_sizes), obs_norm=norm, core_size=cfg.core_units)
    else:
        _check_cnn_shape(spec)
        torso, out = _nature_cnn(spec.obs_shape[0], spec.obs_shape[1])
        model = ActorCritic(torso, out, spec.action, core_size=cfg.core_units)
    model.torso_precision = cfg.torso_precision
    return model


def _check_cnn_shape(spec: EnvSpec) -> None:
    if len(spec.obs_shape) != 3 or spec.obs_shape[1] < 36 or spec.obs_shape[2] < 36:
        raise ConfigError(f"learner.model='nature_cnn' needs observations shaped [channels, H, W] with H, W >= 36; "
                          f"this env gives {list(spec.obs_shape)}: use learner.model=mlp")


def core_state_size(cfg: LearnerConfig, spec: EnvSpec) -> int:
    """The size of one env's recurrent state for this model (0: feed-forward): what buffers and slots hold."""
    if cfg.agent == "r2d2":  # one LSTM (h, c) between the torso and the dueling head (none: learner.core=none)
        return 2 * cfg.core_units
    return cfg.core_units * (4 if resolve_model(cfg, spec) == "mlp" else 2)


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
