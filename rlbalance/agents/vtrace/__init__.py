"""The V-trace agent: IMPALA's off-policy actor-critic (and APPO with learner.ppo_clip).

``vtrace.vtrace``: the targets, a pure function; ``model.ActorCritic``: the net; ``learner.Learner``: the loss and the
optimizer step; ``agent.VTrace``: what the registry holds."""

from rlbalance.agents.vtrace.agent import VTrace
from rlbalance.agents.vtrace.learner import Learner
from rlbalance.agents.vtrace.model import ActorCritic

__all__ = ["ActorCritic", "Learner", "VTrace"]
