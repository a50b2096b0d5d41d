"""R2D2 (Kapturowski et al., "Recurrent Experience Replay in Distributed Reinforcement Learning", ICLR 2019; the
defaults are the paper's and SEED RL's Atari settings).

- ``algo``: the value rescaling h and its inverse, n-step double-Q targets, sequence priorities, the epsilon ladder;
- ``replay``: the prioritised sampler (a sum tree), the sequence replay, the assembler of consecutive unrolls;
- ``net``: ``R2D2Net`` (torso, LSTM, dueling head; epsilon-greedy acting);
- ``learner``: ``R2D2Learner``, one update (burn-in, targets, the importance-weighted TD loss, new priorities);
- ``agent``: ``R2D2Agent`` (what the runners call) and ``R2D2`` (the registry's entry).
"""

from rlbalance.agents.r2d2.agent import GREEDY_EPSILON, R2D2, R2D2Agent, replay_verdict
from rlbalance.agents.r2d2.algo import (
                                        RESCALE_EPS,
                                        env_epsilons,
                                        epsilon_ladder,
                                        initial_priorities,
                                        inverse_rescale,
                                        n_step_double_q_targets,
                                        rescale,
                                        sequence_priorities,
)
from rlbalance.agents.r2d2.learner import R2D2Learner, R2D2Settings
from rlbalance.agents.r2d2.net import R2D2Net
from rlbalance.agents.r2d2.replay import PrioritySampler, SequenceAssembler, SequenceReplay

__all__ = ["GREEDY_EPSILON", "PrioritySampler", "R2D2", "R2D2Agent", "R2D2Learner", "R2D2Net", "R2D2Settings",
           "RESCALE_EPS", "SequenceAssembler", "SequenceReplay", "env_epsilons", "epsilon_ladder", "initial_priorities",
           "inverse_rescale",
           "n_step_double_q_targets", "replay_verdict", "rescale", "sequence_priorities"]
