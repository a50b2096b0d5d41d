"""A user's own environments, as a user would write them: a module that registers them with gymnasium.
Used by tests/test_envs.py through `--env.id custom_envs:Corridor-v0` and `env.imports`."""

import gymnasium as gym


class Corridor(gym.Env):
    """Walk right along a corridor of ``length`` cells; the observation is the cell (Discrete), reward 1 at the end."""

    def __init__(self, length: int = 5):
        self.length = length
        self.observation_space = gym.spaces.Discrete(length)
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right
        self.pos = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self.pos, {}

    def step(self, action):
        self.pos = min(self.length - 1, max(0, self.pos + (1 if action == 1 else -1)))
        done = self.pos == self.length - 1
        return self.pos, float(done), done, False, {}


class Varying(gym.Env):
    """Observations of varying length (a Sequence space): no fixed-size network input for them."""

    observation_space = gym.spaces.Sequence(gym.spaces.Discrete(3))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return (1, 2), {}

    def step(self, action):
        return (0,), 0.0, True, False, {}


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=20)
gym.register("Varying-v0", entry_point=Varying)
