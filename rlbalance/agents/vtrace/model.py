"""Actor-critic networks: an MLP for vector observations and the Nature CNN for Atari frames."""

from __future__ import annotations

import torch
from torch import nn

from rlbalance.agents.nets import ObsNorm, lstm_sequence, lstm_step, run_torso, scaled_input
from rlbalance.envs.spaces import ActionSpec


class ActorCritic(nn.Module):
    """``forward(obs) -> (policy parameters [N, P], value [N])``; uint8 observations are scaled to [0, 1].

    The policy parameters are those of ``action`` (rlbalance.envs.spaces): logits for discrete spaces,
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
        x = scaled_input(obs, self.torso_precision)
        return self.obs_norm(x) if self.obs_norm is not None else x  # (MLP only: no image layout to keep)

    def _policy_features(self, x: torch.Tensor) -> torch.Tensor:
        return run_torso(self.torso, x, self.torso_precision)

    def _value_features(self, x: torch.Tensor) -> torch.Tensor:
        assert self.value_torso is not None, "only a model with a value torso of its own has value features"
        return run_torso(self.value_torso, x, self.torso_precision)

    @property
    def lstm(self) -> nn.LSTMCell:
        """The policy's LSTM core (a recurrent model's)."""
        assert self.core is not None, "a feed-forward model has no core"
        return self.core

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
    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None, explore: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Sample actions (the policy explores by itself: ``explore`` is unused); returns (actions [N] or [N, dim], the
        step's record ``{"logits": policy parameters [N, P]}``). The value head is not
        evaluated. A recurrent model acts from the state at an episode's start (its stepping is ``act_recurrent``)."""
        if self.core is not None:
            first = torch.ones(obs.shape[0], dtype=torch.bool, device=obs.device)
            actions, out, _, _ = self.act_recurrent(obs, self.initial_state(obs.shape[0], obs.device), first,
                                                       generator)
            return actions, out
        params = self._params(self._policy_features(self._prep(obs)))
        return self.action.sample(params, generator), {"logits": params}

    def mode(self, out: dict[str, torch.Tensor]) -> torch.Tensor:
        """The greedy action of a step's record: the mode of the policy (what evaluation plays when asked)."""
        return self.action.mode(out["logits"])

    @property
    def recurrent(self) -> bool:
        return self.core is not None

    def initial_state(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The core state of ``n`` envs at the start of an episode: zeros [n, state_size]."""
        return torch.zeros(n, self.state_size, device=device)

    def _policy_step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's features and the next state, for observations [N, ...] after states [N, state_size]."""
        x = self._prep(obs)
        h, pol = lstm_step(self.lstm, self._policy_features(x), state[:, :2 * self.core_size])
        if self.value_core is None:
            return h, pol
        _, val = lstm_step(self.value_core, self._value_features(x), state[:, 2 * self.core_size:])
        return h, torch.cat([pol, val], dim=1)

    @torch.inference_mode()
    def act_recurrent(self, obs: torch.Tensor, state: torch.Tensor, first: torch.Tensor,
                      generator: torch.Generator | None = None, explore: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """One step of a recurrent policy for N envs: ``state`` [N, state_size] their core states after the last
        step, ``first`` [N] bool whether ``obs`` starts an episode (the state is reset to zeros there). Returns
        (actions, the step's record ``{"logits": policy parameters}``, the state this step started from (after the
        reset), the state after it)."""
        state_in = state * (~first).to(state.dtype).view(-1, 1)
        h, state_out = self._policy_step(obs, state_in)
        params = self._params(h)
        return self.action.sample(params, generator), {"logits": params}, state_in, state_out

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
        hp, states = lstm_sequence(self.lstm, xp, state0[:, :two], keep)
        hv = hp
        if xv is not None and self.value_core is not None:
            hv, val_states = lstm_sequence(self.value_core, xv, state0[:, two:], keep)
            states = torch.cat([states, val_states], dim=-1)
        return self._params(hp), self.baseline(hv).squeeze(-1), states

    def values_after(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Values [N] of observations that follow the core states ``state`` [N, state_size] (a recurrent model's
        bootstrap from a time limit's last observation)."""
        x = self._prep(obs)
        if self.value_core is None:
            h, _ = lstm_step(self.lstm, self._policy_features(x), state)
        else:
            h, _ = lstm_step(self.value_core, self._value_features(x), state[:, 2 * self.core_size:])
        return self.baseline(h).squeeze(-1)


