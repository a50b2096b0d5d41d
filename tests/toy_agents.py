"""An agent that lives only in the tests: REINFORCE with returns within each unroll (no critic, no bootstrap), a
feed-forward softmax policy. It proves the agent interface: every runner trains it by its name
'toy_agents:Reinforce' (learner.agent), with no line of rlbalance changed for it."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from rlbalance.agents.base import Agent, LearnerBase
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
    def act(self, obs, generator=None, explore=None):
        logits = self(obs)
        return self.action.sample(logits, generator), logits


class ReinforceLearner(LearnerBase):
    def __init__(self, net: PolicyNet, cfg, device, step_lock=None):
        import contextlib

        self.model, self.device, self.cfg = net.to(device), device, cfg
        self.step_lock = step_lock or contextlib.nullcontext()
        self.optimizer = torch.optim.Adam(net.parameters(), lr=cfg.learner.learning_rate)
        self.updates = self.steps = 0
        self.max_logit_gap = 0.0  # |logits the actors recorded - this net's| at the weights they acted with

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
            self.max_logit_gap = float((logits.detach() - b["logits"][:t]).abs().max())
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

    def scalars(self) -> dict[str, float]:
        return {"toy/max_logit_gap": self.max_logit_gap}

    def figures(self) -> dict:
        return {"toy": {"max_logit_gap": self.max_logit_gap, "updates": self.updates}}

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
