"""A user's own environments, as a user would write them: a module that registers them with gymnasium.
Used by tests/envs/test_envs.py through `--env.id custom_envs:Corridor-v0` and `env.imports`."""

import gymnasium as gym
import numpy as np


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


class Switches(gym.Env):
    """Copy three random bits shown in the observation: MultiDiscrete([2, 2, 2]) actions (or MultiBinary(3) with
    binary=True), reward 1/3 per bit copied; 10 steps per episode (a random policy scores 5, the best 10)."""

    def __init__(self, binary: bool = False):
        self.binary = binary
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.MultiBinary(3) if binary else gym.spaces.MultiDiscrete([2, 2, 2])
        self.bits, self.t = np.zeros(3, np.float32), 0

    def _draw(self):
        self.bits = self.np_random.integers(0, 2, 3).astype(np.float32)
        return self.bits.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        reward = float(np.mean(np.asarray(action) == self.bits))
        self.t += 1
        return self._draw(), reward, False, self.t >= 10, {}


class Target(gym.Env):
    """Move a point onto a target: Box(-1, 1, (2,)) actions, the target in the observation, reward
    -|action - target|^2 per step; 10 steps per episode (a random policy scores about -13, the best 0)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _draw(self):
        self.target = self.np_random.uniform(-0.8, 0.8, 2).astype(np.float32)
        return self.target.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, np.float32)), action
        reward = -float(np.sum((np.asarray(action) - self.target) ** 2))
        self.t += 1
        return self._draw(), reward, False, self.t >= 10, {}


class IntBox(gym.Env):
    """Integer Box actions: no policy distribution for them (refused before anything starts)."""

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(0, 4, (2,), np.int64)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}


def make_corridor():
    """An env-creating function (not registered): a corridor of 7 cells, capped at 30 steps."""
    return gym.wrappers.TimeLimit(Corridor(length=7), 30)


# an env-creating function is taken as env.id only where its module registers it so (issue 44)
gym.register("Corridor7-v0", entry_point=make_corridor)
gym.register("IntBox-v0", entry_point=IntBox)
gym.register("Switches-v0", entry_point=Switches)
gym.register("Bits-v0", entry_point=Switches, kwargs={"binary": True})
gym.register("Target-v0", entry_point=Target)
gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=20)
gym.register("Varying-v0", entry_point=Varying)


class BrokenInActors(Corridor):
    """Made fine in the learner (which probes the spaces) and raising in actor processes: an env whose constructor
    fails where it runs (a missing ROM, a library only the learner's node has)."""

    def __init__(self):
        import multiprocessing as mp

        if mp.current_process().name.startswith("rlbalance-actor"):
            raise RuntimeError("BrokenInActors: no simulator licence in this process")
        super().__init__()


gym.register("BrokenInActors-v0", entry_point=BrokenInActors, max_episode_steps=20)
