"""The agents rlbalance knows: one line each. ``get(name)`` is how everything else finds one.

A name is a built-in agent's (``AGENTS``) or ``'module:attr'``: an :class:`~rlbalance.agents.base.Agent` (or its
class) importable in every process (the learner, actor processes, Ray workers), as env ids take ``'module:EnvId'``.
"""

from __future__ import annotations

import importlib

from rlbalance.agents.base import Agent, StepField
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


#: the transition's fields, which every buffer row holds whatever the agent (a record field may not take their names)
TRANSITION_FIELDS = frozenset({"obs", "action", "reward", "done", "truncated", "final_obs", "ep_end", "ep_return",
                               "ep_length", "version", "core", "client", "unroll", "first", "core_in"})


def step_record(cfg, spec) -> dict[str, StepField]:
    """What ``cfg.learner.agent``'s actors record per env step, by name (``Agent.step_record``), checked: at least one
    field, no name of the transition's, each a StepField."""
    agent = get(cfg.learner.agent)
    record = dict(agent.step_record(cfg, spec))
    if not record:
        raise ConfigError(f"learner.agent={cfg.learner.agent!r}: step_record declares no field; an agent records at "
                          "least what its actors acted by (e.g. policy parameters)")
    for name, f in record.items():
        if name in TRANSITION_FIELDS or not name.isidentifier():
            raise ConfigError(f"learner.agent={cfg.learner.agent!r}: step_record field {name!r} is taken by the "
                              f"transition or is not an identifier; rename it (taken: {sorted(TRANSITION_FIELDS)})")
        if not isinstance(f, StepField):
            raise ConfigError(f"learner.agent={cfg.learner.agent!r}: step_record field {name!r} is {f!r}; declare it "
                              "as rlbalance.agents.base.StepField(shape, dtype)")
    return record


def acting_values(cfg):
    """Every env's acting values [clients, K] (``Agent.acting_values``), or None."""
    return get(cfg.learner.agent).acting_values(cfg)


def make_learner(net, cfg, spec, device, step_lock=None, distributed: bool = False):
    """The learner of ``cfg.learner.agent`` over ``net``."""
    return get(cfg.learner.agent).make_learner(net, cfg, spec, device, step_lock=step_lock, distributed=distributed)
