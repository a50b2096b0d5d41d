"""How an actor's env group gets its actions: a policy asked in two halves (``Policy``), answered by the central
inference server through shared-memory slots (``CentralClient``) or evaluated in this process (``DirectPolicy``:
the serial runner, actor-side inference with a ``LocalModel``); ``EnvStates`` is what central inference keeps per env.
``net_step`` is one step of any agent's net as every runner takes it; the agent's per-env acting values travel with
it (``acting_values``), and its record of the step comes back by name (``Agent.step_record``)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from rlbalance.agents import registry
from rlbalance.config import Config
from rlbalance.runtime.buffers import SharedWeights, StepSlots


class Policy(Protocol):
    core_in: np.ndarray | None  # a recurrent policy: the core state [K, 2, H] the last answered step started from

    def request(self, obs: np.ndarray, first: np.ndarray) -> None:
        """Ask for actions for observations [K, ...]; ``first`` [K] bool: which of them start an episode (a
        recurrent policy resets those envs' state). May return before the actions are ready."""

    def receive(self) -> tuple[np.ndarray, dict[str, np.ndarray], int]:
        """The answer to the last request: (actions [K], the agent's record of the step (name: [K, *shape]), policy
        version)."""


class CentralClient:
    """Central inference: write obs to this group's slot, flag the server; later read the answer."""

    def __init__(self, client_id: int, slots: StepSlots, conn):
        self.conn = conn
        self.obs = slots.obs[client_id].numpy()
        self.action = slots.action[client_id].numpy()
        self.record = {name: x[client_id].numpy() for name, x in slots.record.items()}
        self.version = slots.version[client_id : client_id + 1].numpy()
        self.first = slots.first[client_id].numpy()
        self.core_in = slots.core_in[client_id].numpy() if slots.core_in.shape[-1] else None

    def request(self, obs: np.ndarray, first: np.ndarray) -> None:
        self.obs[...] = obs
        self.first[...] = first
        self.conn.send_bytes(b"r")

    def receive(self):
        self.conn.recv_bytes()
        return self.action, self.record, int(self.version[0])


def net_step(net: Any, obs: torch.Tensor, state: torch.Tensor | None, first: torch.Tensor | None,
             generator: torch.Generator | None, value: torch.Tensor | None = None):
    """One step of any agent's policy net for N envs, as every runner takes it: (actions, the net's ``out`` record
    of the step (name: [N, *shape]), the state the step started from, the state after it); the states are None for a
    feed-forward net. ``value`` [N]: the agent's per-env acting values (``Agent.acting_values``), or None."""
    with torch.inference_mode():
        if state is None:
            actions, out = net.act(obs, generator, value)
            return actions, out, None, None
        return net.act_recurrent(obs, state, first, generator, value)


class EnvStates:
    """What central inference keeps for every env of every client (env group), on the learner device: a recurrent
    net's core state (reset where the actor flags an episode's first observation) and the agent's acting values
    (``values`` [clients, K], see ``acting_values``); ``step`` is one step of the net for a batch of clients. The
    inference server and the Ray feeder both step through it."""

    def __init__(self, net: Any, clients: int, k: int, device: torch.device,
                 values: torch.Tensor | None = None):
        self.net, self.k, self.values = net, k, values
        self.state: torch.Tensor | None = None
        if getattr(net, "recurrent", False):
            with torch.inference_mode():
                self.state = net.initial_state(clients * k, device).view(clients, k, -1)

    def step(self, idx: torch.Tensor, obs: torch.Tensor, first: torch.Tensor | None, generator: torch.Generator):
        """Clients ``idx`` [n] (on the device), their envs' observations [n*K, ...] and first flags [n*K] (None for a
        feed-forward net): (actions, the net's record of the step, the states the step started from or None); the new
        states are kept."""
        value = None if self.values is None else self.values[idx].reshape(-1)
        state = None if self.state is None else self.state[idx].reshape(len(idx) * self.k, -1)
        actions, out, core_in, state_out = net_step(self.net, obs, state, first, generator, value)
        if state_out is not None and self.state is not None:
            with torch.inference_mode():
                self.state[idx] = state_out.view(len(idx), self.k, -1)
        return actions, out, core_in


class DirectPolicy:
    """A policy evaluated at request time in this process (serial runner, actor-side inference): ``net`` on
    ``device`` for one env group of ``k`` envs (a recurrent net: with their core states), ``values`` [k] those
    envs' acting values (None: none), ``before()`` run before each step (actor-side: the weight sync)."""

    def __init__(self, net: Any, k: int, generator: torch.Generator, version_fn,
                 values: torch.Tensor | None = None, device: torch.device | str = "cpu", before=None):
        self.net, self.generator, self.version_fn, self.values, self.device = net, generator, version_fn, values, device
        self.before = before
        self.state = net.initial_state(k, device) if getattr(net, "recurrent", False) else None
        self.answer: tuple[np.ndarray, dict[str, np.ndarray], int] | None = None
        self.core_in: np.ndarray | None = None

    def request(self, obs: np.ndarray, first: np.ndarray) -> None:
        if self.before is not None:
            self.before()
        dev = self.device
        actions, out, core_in, self.state = net_step(self.net, torch.from_numpy(obs).to(dev), self.state,
                                                     torch.from_numpy(first).to(dev), self.generator, self.values)
        self.core_in = None if core_in is None else core_in.cpu().numpy()
        self.answer = (actions.cpu().numpy(), {name: x.cpu().numpy() for name, x in out.items()}, self.version_fn())

    def receive(self):
        return self.answer


class LocalModel:
    """Actor-side inference: a CPU copy of the model, synced when sync_every learner updates passed.
    One per actor process, shared by its env groups (each with its own DirectPolicy)."""

    def __init__(self, model: torch.nn.Module, weights: SharedWeights, sync_every: int, seed: int):
        self.model, self.weights, self.sync_every = model, weights, sync_every
        self.generator = torch.Generator().manual_seed(seed)
        self.version = weights.load_into(model)

    def _sync(self) -> None:
        if int(self.weights.version[0]) - self.version >= self.sync_every:
            self.version = self.weights.load_into(self.model)

    def policy(self, k: int, values: torch.Tensor | None = None) -> DirectPolicy:
        """The policy of one env group of ``k`` envs (``values``: their acting values, see ``net_step``)."""
        return DirectPolicy(self.model, k, self.generator, lambda: self.version, values, before=self._sync)


def acting_values(cfg: Config, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """Every env's acting values [clients, K] on ``device`` (the agent's, see ``Agent.acting_values``); None where
    its net takes none."""
    x = registry.acting_values(cfg)
    return None if x is None else torch.as_tensor(x, dtype=torch.float32, device=device)


def group_values(values: torch.Tensor | None, client: int) -> torch.Tensor | None:
    """Env group ``client``'s row of ``values`` (None stays None)."""
    return None if values is None else values[client]
