"""R2D2's network: torso (MLP or Nature CNN), LSTM, dueling head; epsilon-greedy acting."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rlbalance.agents.nets import lstm_sequence, lstm_step, mlp, nature_cnn, run_torso, scaled_input
from rlbalance.envs.spaces import ActionSpec


class R2D2Net(nn.Module):
    """Torso (an MLP, or the Nature CNN for image observations) -> LSTM -> dueling head: Q = V + A - mean(A).
    ``forward`` runs over sequences [T1, B, ...] from start states [B, 2H] with resets where ``first``."""

    recurrent = True  # (the runners' test for a policy that carries a state per env)

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, hidden_sizes: tuple[int, ...] = (64, 64),
                 core_size: int = 128, cnn: bool | None = None):
        super().__init__()
        self.cnn = len(obs_shape) == 3 if cnn is None else cnn
        if self.cnn:
            self.torso, out = nature_cnn(obs_shape[0], obs_shape[1])
        else:
            self.torso, out = mlp(int(np.prod(obs_shape)), hidden_sizes), hidden_sizes[-1]
        # core_size 0: no LSTM (a feed-forward Q-network on the same sequence replay: the memory task's control)
        self.core = nn.LSTMCell(out, core_size) if core_size else None
        self.torso_precision = "fp32"  # learner.torso_precision (build_model sets it): see run_torso
        head_in = core_size or out
        self.core_size, self.num_actions = core_size, num_actions
        self.state_size = 2 * core_size
        self.action = ActionSpec.discrete(num_actions)  # (the actions' shape and dtype, as the buffers store them)
        self.value = nn.Linear(head_in, 1)
        self.advantage = nn.Linear(head_in, num_actions)

    def initial_state(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(n, 2 * self.core_size, device=device)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        return run_torso(self.torso, scaled_input(obs, self.torso_precision), self.torso_precision)

    def _step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.core is None:
            h, state = x, state
        else:
            h, state = lstm_step(self.core, x, state)
        return self._head(h), state

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(dim=-1, keepdim=True)

    def forward(self, obs: torch.Tensor, state0: torch.Tensor, first: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-values [T1, B, A] and the state after each row [T1, B, 2H]; row 0's ``first`` is ignored (``state0``
        is the state row 0 starts from, as recorded)."""
        t1, b = obs.shape[:2]
        x = self._features(obs.reshape(t1 * b, *obs.shape[2:])).reshape(t1, b, -1)
        keep = (~first).to(state0.dtype)
        if self.core is None:
            return self._head(x), state0.expand(t1, *state0.shape)
        h, states = lstm_sequence(self.core, x, state0, keep)
        return self._head(h), states

    @torch.inference_mode()
    def act_recurrent(self, obs: torch.Tensor, state: torch.Tensor, first: torch.Tensor,
                      generator: torch.Generator | None = None, explore: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """Epsilon-greedy actions for N envs (``explore`` [N], each env's own epsilon; None: greedy), as the runners
        call a recurrent policy. Returns (actions, the step's record ``{"q": Q-values}``, the state the step started
        from (reset where ``first``), the state after it)."""
        state_in = state * (~first).to(state.dtype).view(-1, 1)
        q, state_out = self._step(self._features(obs), state_in)
        actions = q.argmax(dim=-1)
        if explore is not None:
            roll = torch.rand(q.shape[0], generator=generator, device=q.device) < explore
            random = torch.randint(0, self.num_actions, (q.shape[0],), generator=generator, device=q.device)
            actions = torch.where(roll, random, actions)
        return actions, {"q": q}, state_in, state_out

    @staticmethod
    def mode(out: dict[str, torch.Tensor]) -> torch.Tensor:
        """The greedy action of a step's record: argmax Q (what evaluation plays)."""
        return out["q"].argmax(dim=-1)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None, explore: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Actions from an episode's start state (greedy without ``explore``: what a profile or calibration times)."""
        first = torch.ones(obs.shape[0], dtype=torch.bool, device=obs.device)
        actions, q, _, _ = self.act_recurrent(obs, self.initial_state(obs.shape[0], obs.device), first, generator,
                                              explore)
        return actions, q
