"""The one interface between an agent (a learning algorithm) and the rest of rlbalance.

An agent is a folder under ``rlbalance/agents/`` with an :class:`Agent` and one line in ``registry.AGENTS``. The
runtime and the analysis call only what is here, so they never ask which agent they carry. The canonical loop, as
the runners run it::

    agent = registry.get(cfg.learner.agent)
    agent.check(cfg, spec)                          # refusals, before any process starts
    net = agent.build_net(cfg.learner, spec)        # the policy the actors (or the inference server) evaluate
    learner = agent.make_learner(net, cfg, spec, device)
    record = agent.step_record(cfg, spec)           # what the actors record per env step, by name
    values = agent.acting_values(cfg)               # per-env values handed to every act call (or None)
    while not done:
        # actors: actions, out, state_in, state = net.act_recurrent(obs, state, first, gen, value)
        #         (feed-forward nets: actions, out = net.act(obs, gen, value)); ``value`` is the env's row of
        #         ``values`` (or None), passed by position; ``out`` is a dict with one tensor [N, *shape] per field
        #         of ``record``, which buffers, step slots, the Ray feeder and the batches carry by its name
        stats = learner.train(batch_of_unrolls)     # any number of gradient steps; batch[name] [T+1, B, *shape]
    learner.figures(); learner.annotate_verdict(verdict)   # its own telemetry and what the verdict means for it

The runtime names none of an agent's fields: it allocates and moves what ``step_record`` declares (policy
parameters for V-trace, Q-values for R2D2, anything for another agent), and a net's ``mode(out)`` is the greedy
action evaluation plays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn


def learning_rate(lc, steps: int, total_steps: int, world: int = 1) -> float:
    """The learning rate after ``steps`` env steps of ``total_steps`` (learner.lr_schedule), scaled for ``world``
    learner processes (learner.lr_scaling): every agent's optimizer follows it."""
    lr = lc.learning_rate * {"none": 1.0, "linear": float(world), "sqrt": world ** 0.5}[lc.lr_scaling]
    if lc.lr_schedule == "constant":
        return lr
    return lr * max(0.0, 1.0 - steps / total_steps)


def shape_rewards(reward: torch.Tensor, lc) -> torch.Tensor:
    """Rewards as the learner takes them: times learner.reward_scale, then clipped to +-learner.reward_clip (0: not
    clipped). The same tensor where neither applies."""
    if lc.reward_scale != 1.0:
        reward = reward * lc.reward_scale
    if lc.reward_clip:
        reward = reward.clamp(-lc.reward_clip, lc.reward_clip)
    return reward


@dataclass(frozen=True)
class StepField:
    """One field of an agent's per-step record: its shape for one env (``()``: a scalar) and its dtype."""

    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32

    @property
    def nbytes(self) -> int:
        """Bytes per env step."""
        return int(np.prod(self.shape, dtype=np.int64)) * torch.empty((), dtype=self.dtype).element_size()


class LearnerBase:
    """What every agent's learner offers the runtime besides ``train``: defaults for the optional parts.

    Required: ``model`` (the net inference uses), ``device``, ``updates`` (optimizer steps taken), ``steps`` (env
    steps consumed), ``train(batch) -> dict`` (loss figures and ``time_*`` stage seconds), ``state_dict``,
    ``load_state_dict``, ``lr_now``."""

    model: Any  # the policy net (an nn.Module with act, act_recurrent, initial_state, action)
    device: torch.device
    updates: int
    steps: int

    def train(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def lr_now(self) -> float:
        raise NotImplementedError

    def scalars(self) -> dict[str, float]:
        """Extra figures for each metrics record (beside the losses)."""
        return {}

    def figures(self) -> dict:
        """The agent's own figures for telemetry.json and the summary, by name (e.g. ``{"replay": {...}}``)."""
        return {}

    def annotate_verdict(self, verdict: dict) -> None:
        """Add to the bottleneck verdict's evidence and advice what it means for this agent."""

    def relayout(self, cfg: Any) -> None:
        """The actors were built (again) for ``cfg``'s layout (a self-balancing run: room for more actors, other envs
        per actor): what the learner keeps per env follows it."""

    def timed_step(self, batch: dict[str, torch.Tensor]) -> None:
        """One gradient step as a run takes it, on ``batch`` (unrolls as the buffers give them) or on what the
        learner holds: what a profile and the learner-ceiling bench time."""
        self.train(batch)


class Agent:
    """One learning algorithm, as the runtime and the analysis see it."""

    name = ""
    #: evaluation plays the net's greedy action whatever it is asked (a Q-network has no policy to sample)
    greedy_eval = False
    #: config fields (section, name) that do not change this agent's work: the planner ignores them when it matches
    #: sweep points to a calibration
    unused_fields: frozenset[tuple[str, str]] = frozenset()
    #: config fields (section, name) of the agent's own that change its work (the planner matches on them too)
    workload_fields: tuple[tuple[str, str], ...] = ()
    #: the most learner devices it trains on (None: one learner process per device, any number)
    max_learner_devices: int | None = None

    def check(self, cfg, spec) -> None:
        """Refuse (ConfigError, naming the field and the fix) what this agent cannot run, before any process
        starts; ``spec`` is the env's."""

    def build_net(self, cfg, spec) -> nn.Module:
        raise NotImplementedError

    def state_size(self, cfg, spec) -> int:
        """One env's recurrent state size (0: feed-forward): what buffers and slots hold for it. The net's own
        ``state_size`` is the one place it is computed (built here with the global RNG put back as it was, so
        asking leaves a run's random numbers as they were)."""
        with torch.random.fork_rng(devices=[]):
            return int(getattr(self.build_net(cfg, spec), "state_size", 0))

    def make_learner(self, net: nn.Module, cfg, spec, device: torch.device, step_lock=None,
                     distributed: bool = False) -> LearnerBase:
        raise NotImplementedError

    def step_record(self, cfg, spec) -> dict[str, StepField]:
        """What the actors record of each env step beside the transition (obs, action, reward, flags), by name:
        what the net's ``act`` returns as ``out`` and the learner reads as ``batch[name]``. Names must not be those
        of the transition's fields (``registry.step_record`` refuses them)."""
        raise NotImplementedError

    def acting_values(self, cfg) -> np.ndarray | None:
        """Per-env values [clients, K] that every act call of that env receives (by position, after the generator):
        an exploration rate, ...; None: the net needs none (a sampled policy explores by itself)."""
        return None

    def identity(self, cfg) -> dict:
        """What a checkpoint of this agent records about it (checked on resume)."""
        return {"agent": self.name}

    # -- calibration and the planner ------------------------------------------------------------------------------

    def short_run(self, cfg) -> dict:
        """Config overrides (by section) for the short runs calibration makes (e.g. learning from the first batch)."""
        return {}

    def step_sizes(self, cfg, quick: bool) -> list[int]:
        """The batch sizes calibration times a learner step at."""
        raise NotImplementedError

    def sized(self, cfg, batch_size: int):
        """``cfg`` with one learner step at ``batch_size`` samples (calibration times ``learner.timed_step`` on it)."""
        raise NotImplementedError

    def learner_work(self, cfg) -> dict:
        """What one learner step is: ``batch_size`` (samples), ``rows_per_sample``, ``env_steps_per_train_step``
        (env steps the actors deliver per step), ``row_forwards_per_sample`` (forward-pass equivalents per row)."""
        raise NotImplementedError
