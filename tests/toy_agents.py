"""An agent that lives only in the tests: REINFORCE with returns within each unroll (no critic, no bootstrap), a
feed-forward softmax policy. It proves the agent interface: every runner trains it by its name
'toy_agents:Reinforce' (learner.agent), with no line of rlbalance changed for it.

Its per-step record is its own (``step_record``): the policy's scores under the name ``scores``, the log-probability
of the action taken (a scalar, float64) and the temperature it was sampled at (float16); its per-env acting values
are those temperatures (``acting_values``: a different one for every env). The learner checks at its first step
that all three arrived as the net gave them, row by row and env by env."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from rlbalance.agents.base import Agent, LearnerBase, StepField
from rlbalance.agents.nets import batch_to
from rlbalance.envs.spaces import ActionSpec


class PolicyNet(nn.Module):
    recurrent = False

    def __init__(self, obs_dim: int, num_actions: int):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, num_actions))
        self.action = ActionSpec.discrete(num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(obs.float())

    @torch.inference_mode()
    def act(self, obs, generator=None, temperature=None):
        temp = torch.ones(obs.shape[0], device=obs.device) if temperature is None else temperature
        scores = self(obs)
        action = self.action.sample(scores / temp[:, None], generator)
        logp = torch.log_softmax(scores / temp[:, None], -1).gather(1, action[:, None]).squeeze(1)
        return action, {"scores": scores, "logp": logp.double(), "temperature": temp.half()}

    def mode(self, out):
        return out["scores"].argmax(-1)


def temperatures(cfg) -> np.ndarray:
    """Every env's sampling temperature [clients, K]: 1 to 2, no two envs alike."""
    n, k = cfg.num_clients, cfg.actors.envs_per_actor
    return (1.0 + np.arange(n * k, dtype=np.float32).reshape(n, k) / max(1, n * k - 1)).astype(np.float32)


class ReinforceLearner(LearnerBase):
    def __init__(self, net: PolicyNet, cfg, device, step_lock=None):
        import contextlib

        self.model, self.device, self.cfg = net.to(device), device, cfg
        self.step_lock = step_lock or contextlib.nullcontext()
        self.optimizer = torch.optim.Adam(net.parameters(), lr=cfg.learner.learning_rate)
        self.updates = self.steps = 0
        # (None until the first step has checked them)
        self.max_logit_gap: float | None = None  # |scores the actors recorded - this net's| at their weights
        self.max_logp_gap: float | None = None   # |log-probability recorded - this net's at the recorded temperature|
        self.max_temperature_gap: float | None = None  # |temperature recorded - the env's own (temperatures(cfg))|

    def lr_now(self) -> float:
        return self.cfg.learner.learning_rate

    def train(self, batch):
        t0 = time.perf_counter()
        b = batch_to(batch, self.device)
        t = b["action"].shape[0] - 1
        reward, done = b["reward"][:t].float(), b["done"][:t].float()
        ret = torch.zeros_like(reward)
        acc = torch.zeros_like(reward[0])
        for i in reversed(range(t)):  # returns within the unroll, cut where episodes end
            acc = reward[i] + self.cfg.learner.discount * acc * (1.0 - done[i])
            ret[i] = acc
        t1 = time.perf_counter()
        logits = self.model(b["obs"][:t].reshape(-1, *b["obs"].shape[2:])).reshape(t, -1, self.model.action.head_size)
        if self.updates == 0:  # before the first step the actors acted with these very weights
            self._check_record(b, logits.detach(), t)
        logp = self.model.action.log_prob(logits, b["action"][:t])
        loss = -(logp * (ret - ret.mean())).mean()
        self.optimizer.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        with self.step_lock:
            self.optimizer.step()
        self.updates += 1
        self.steps += t * b["action"].shape[1]
        return {"loss": float(loss.detach()), "time_h2d": t1 - t0, "time_fwd_bwd": t2 - t1,
                "time_optim": time.perf_counter() - t2}

    def _check_record(self, b, scores, t: int) -> None:
        assert b["logp"].dtype == torch.float64 and b["temperature"].dtype == torch.float16, (b["logp"].dtype,)
        temp = b["temperature"][:t].float()
        self.max_logit_gap = float((scores - b["scores"][:t]).abs().max())
        logp = torch.log_softmax(scores / temp[..., None], -1).gather(2, b["action"][:t, :, None]).squeeze(2)
        self.max_logp_gap = float((logp - b["logp"][:t].float()).abs().max())
        table = torch.as_tensor(temperatures(self.cfg))  # [clients, K]
        k = table.shape[1]
        own = table[b["client"].repeat_interleave(k), torch.arange(b["client"].numel() * k) % k]
        self.max_temperature_gap = float((temp - own.half().float()).abs().max())

    def scalars(self) -> dict[str, float]:
        return {"toy/max_logit_gap": -1.0 if self.max_logit_gap is None else self.max_logit_gap}

    def figures(self) -> dict:
        return {"toy": {"max_logit_gap": self.max_logit_gap, "max_logp_gap": self.max_logp_gap,
                        "max_temperature_gap": self.max_temperature_gap, "updates": self.updates}}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "updates": self.updates, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates, self.steps = int(state["updates"]), int(state["steps"])


class Reinforce(Agent):
    name = "reinforce"

    def build_net(self, cfg, spec) -> PolicyNet:
        return PolicyNet(int(np.prod(spec.obs_shape)), spec.num_actions)

    def state_size(self, cfg, spec) -> int:
        return 0

    def step_record(self, cfg, spec) -> dict[str, StepField]:
        return {"scores": StepField((spec.num_actions,)), "logp": StepField((), torch.float64),
                "temperature": StepField((), torch.float16)}

    def acting_values(self, cfg) -> np.ndarray:
        return temperatures(cfg)

    def make_learner(self, net, cfg, spec, device, step_lock=None, distributed=False) -> ReinforceLearner:
        return ReinforceLearner(net, cfg, device, step_lock)

    def step_sizes(self, cfg, quick: bool) -> list[int]:
        return [8, 16]

    def sized(self, cfg, batch_size: int):
        return replace(cfg, actors=replace(cfg.actors, envs_per_actor=batch_size),
                       inference=replace(cfg.inference, max_batch=0), learner=replace(cfg.learner, batch_size=batch_size))

    def learner_work(self, cfg) -> dict:
        t, b = cfg.learner.unroll_length, cfg.learner.batch_size
        return {"batch_size": b, "rows_per_sample": t + 1, "env_steps_per_train_step": b * t,
                "row_forwards_per_sample": 3 * t}
