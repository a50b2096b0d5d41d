"""rlbalance's own partially observed task: CartPole with its velocities hidden.

``rlbalance/CartPoleNoVelocity-v1`` is gymnasium's CartPole-v1 (500-step limit) whose observation keeps the
cart's position and the pole's angle and drops both velocities, so a feed-forward policy on one observation
cannot tell which way the pole moves; a recurrent policy (learner.core=lstm) can infer it from the history.
The usual memory benchmark of recurrent RL code (as in Stable-Baselines3 Contrib's and CleanRL's LSTM examples).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

KEPT = [0, 2]  # cart position, pole angle (1 and 3 are the velocities)


class CartPoleNoVelocity(gym.ObservationWrapper):
    def __init__(self, env: gym.Env):
        super().__init__(env)
        box = env.observation_space
        self.observation_space = gym.spaces.Box(box.low[KEPT], box.high[KEPT], dtype=np.float32)

    def observation(self, obs):
        return np.asarray(obs, dtype=np.float32)[KEPT]


def _make(**kwargs) -> gym.Env:
    return CartPoleNoVelocity(gym.make("CartPole-v1", **kwargs))


def register() -> None:
    if "rlbalance/CartPoleNoVelocity-v1" not in gym.registry:
        gym.register("rlbalance/CartPoleNoVelocity-v1", entry_point=_make)
