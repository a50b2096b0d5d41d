"""The agents rlbalance knows: one line each. ``get(name)`` is how everything else finds one.

A name is a built-in agent's (``AGENTS``) or ``'module:attr'``: an :class:`~rlbalance.agents.base.Agent` (or its
class) importable in every process (the learner, actor processes, Ray workers), as env ids take ``'module:EnvId'``.
"""

from __future__ import annotations

import importlib

from rlbalance.agents.base import Agent
from rlbalance.agents.r2d2 import R2D2
from rlbalance.agents.vtrace import VTrace
from rlbalance.core.errors import ConfigError

AGENTS: dict[str, Agent] = {
    "vtrace": VTrace(),
    "r2d2": R2D2(),
}


def get(name: str) -> Agent:
    """The agent ``learner.agent`` names (a ConfigError naming the field where none is)."""
    if name in AGENTS:
        return AGENTS[name]
    module, _, attr = name.partition(":")
    if not attr:
        raise ConfigError(f"learner.agent={name!r}: no such agent; use one of {sorted(AGENTS)} or 'module:Agent'")
    try:
        obj: object = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"learner.agent={name!r}: cannot import module {module!r} ({e}); put it on PYTHONPATH") from e
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, Agent):
        obj = obj()
    if not isinstance(obj, Agent):
        raise ConfigError(f"learner.agent={name!r}: {attr} in {module} is not an rlbalance Agent")
    AGENTS[name] = obj
    return obj


def build_model(cfg, spec):
    """The net of ``cfg.agent`` (a LearnerConfig) for an env ``spec``, its torso at learner.torso_precision."""
    net = get(cfg.agent).build_net(cfg, spec)
    net.torso_precision = cfg.torso_precision
    return net


def core_state_size(cfg, spec) -> int:
    """One env's recurrent state size for ``cfg.agent``'s net (0: feed-forward): what buffers and slots hold."""
    return get(cfg.agent).state_size(cfg, spec)


def make_learner(net, cfg, spec, device, step_lock=None, distributed: bool = False):
    """The learner of ``cfg.learner.agent`` over ``net``."""
    return get(cfg.learner.agent).make_learner(net, cfg, spec, device, step_lock=step_lock, distributed=distributed)
