"""Small pixel tasks of rlbalance's own, for tests a CNN must learn from pixels in CI-sized budgets.

``rlbalance/Catch-v0``: a ball falls one row per step down a 10 x 10 grid from a random column; the agent
moves a two-cell paddle on the bottom row left, not at all, or right. Reward +1 when the paddle is under
the ball as it lands, -1 otherwise; an episode is 9 steps. Observations are a [1, 40, 40] uint8 image
(each cell 4 x 4 pixels): the task can only be solved by reading where the ball is. A random policy
scores about -0.6, a perfect one +1.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

GRID, CELL = 10, 4


class CatchEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self):
        size = GRID * CELL
        self.observation_space = gym.spaces.Box(0, 255, (1, size, size), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.ball_row = self.ball_col = self.paddle = 0

    def _obs(self) -> np.ndarray:
        img = np.zeros((GRID, GRID), dtype=np.uint8)
        img[self.ball_row, self.ball_col] = 255
        img[GRID - 1, self.paddle:self.paddle + 2] = 128
        return np.kron(img, np.ones((CELL, CELL), dtype=np.uint8))[None]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.ball_row = 0
        self.ball_col = int(self.np_random.integers(GRID))
        self.paddle = int(self.np_random.integers(GRID - 1))
        return self._obs(), {}

    def step(self, action):
        self.paddle = int(np.clip(self.paddle + int(action) - 1, 0, GRID - 2))
        self.ball_row += 1
        done = self.ball_row == GRID - 1
        reward = 0.0
        if done:
            reward = 1.0 if self.paddle <= self.ball_col <= self.paddle + 1 else -1.0
        return self._obs(), reward, done, False, {}


def register() -> None:
    if "rlbalance/Catch-v0" not in gym.registry:
        gym.register("rlbalance/Catch-v0", entry_point=CatchEnv)
