"""V-trace (IMPALA, Espeholt et al. 2018), and APPO with learner.ppo_clip: the actor-critic agent."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rlbalance.agents.base import Agent, StepField
from rlbalance.agents.nets import ObsNorm, check_cnn_shape, mlp, nature_cnn, resolve_model
from rlbalance.agents.vtrace.learner import Learner
from rlbalance.agents.vtrace.model import ActorCritic


class VTrace(Agent):
    name = "vtrace"

    def build_net(self, cfg, spec) -> ActorCritic:
        if resolve_model(cfg, spec) == "mlp":
            in_dim = int(np.prod(spec.obs_shape))
            norm = ObsNorm(tuple(spec.obs_shape)) if cfg.normalize_observations else None
            return ActorCritic(mlp(in_dim, cfg.hidden_sizes), cfg.hidden_sizes[-1], spec.action,
                               value_torso=mlp(in_dim, cfg.hidden_sizes), obs_norm=norm, core_size=cfg.core_units)
        check_cnn_shape(spec)
        torso, out = nature_cnn(spec.obs_shape[0], spec.obs_shape[1])
        return ActorCritic(torso, out, spec.action, core_size=cfg.core_units)

    def step_record(self, cfg, spec) -> dict[str, StepField]:
        # the behaviour policy's parameters of each step (a Discrete space's logits, a Box space's mean and log std):
        # V-trace's importance ratios are taken against them
        return {"logits": StepField((spec.num_actions,))}

    def make_learner(self, net, cfg, spec, device, step_lock=None, distributed: bool = False) -> Learner:
        return Learner(net, cfg.learner, device, cfg.run.total_steps, step_lock=step_lock, distributed=distributed)

    def identity(self, cfg) -> dict:
        return {}  # (V-trace checkpoints from before agents were named carry no agent: absent means V-trace)

    def step_sizes(self, cfg, quick: bool) -> list[int]:
        return [8, 16] if quick or cfg.env.is_atari else [8, 16, 32, 64]

    def sized(self, cfg, batch_size: int):
        # (one actor buffer of B envs: inference.max_batch, which no learner step reads, is lifted with it)
        return replace(cfg, actors=replace(cfg.actors, envs_per_actor=batch_size),
                       inference=replace(cfg.inference, max_batch=0),
                       learner=replace(cfg.learner, batch_size=batch_size), run=replace(cfg.run, total_steps=10**12))

    def learner_work(self, cfg) -> dict:
        t, b = cfg.learner.unroll_length, cfg.learner.batch_size
        return {"batch_size": b, "rows_per_sample": t + 1, "env_steps_per_train_step": b * t,
                "row_forwards_per_sample": 3 * (t + 1)}  # a forward and a backward over every row
