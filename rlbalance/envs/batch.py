"""Environments the actors step: K of them at once, with same-step autoreset.

``make_env_batch(cfg, k, seed)`` returns an :class:`EnvBatch` of K environments. When one ends, the
observation returned for it is the first of its next episode and ``done`` marks the transition, the
convention V-trace needs (SEED RL, TorchBeast). Episode returns are tracked per *game*: with episodic
life on, ``done`` fires at each life loss but the return keeps adding up until the game is over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from rlbalance.config import EnvConfig
from rlbalance.config.user_modules import import_user_modules
from rlbalance.core.errors import ConfigError
from rlbalance.envs.spaces import ActionSpec


@dataclass(frozen=True)
class EnvSpec:
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int  # the policy's outputs per env as recorded: a Discrete space's n, else action.param_size
    frames_per_step: int
    action: ActionSpec = None  # type: ignore[assignment]  # None: Discrete(num_actions), made by __post_init__

    def __post_init__(self):
        if self.action is None:
            object.__setattr__(self, "action", ActionSpec.discrete(self.num_actions))

    @property
    def obs_bytes(self) -> int:
        """Bytes of one observation."""
        return int(np.prod(self.obs_shape)) * np.dtype(self.obs_dtype).itemsize

    @classmethod
    def of(cls, obs_shape, obs_dtype, action: ActionSpec, frames_per_step: int) -> "EnvSpec":
        return cls(tuple(obs_shape), np.dtype(obs_dtype), action.param_size, frames_per_step, action)


class StepResult(NamedTuple):
    obs: np.ndarray        # [K, ...] next observations (the first of a new episode where done)
    reward: np.ndarray     # [K] float32
    done: np.ndarray       # [K] bool: the (learning) episode ended with this step
    truncated: np.ndarray  # [K] bool: it ended by a time limit, not a terminal state (see final_obs)
    game_over: np.ndarray  # [K] bool: a whole game ended (differs from done with episodic life)
    ep_return: np.ndarray  # [K] the finished game's return where game_over, else 0
    ep_length: np.ndarray  # [K] the finished game's length where game_over, else 0


class SyntheticEnv:
    """A vectorised environment with a tunable CPU cost per step and observation shape.

    Each step of each env burns ``step_us`` microseconds of real CPU time (a busy loop on the
    process's CPU clock), so the env ceiling is known in advance. The task is learnable: reward 1
    when the action equals ``argmax`` of the first ``num_actions`` observation entries.
    """

    def __init__(self, k: int, obs_shape: tuple[int, ...], num_actions: int, step_us: float,
                 episode_len: int, seed: int, cost: str = "busy", fault: str = "", dtype: str = "float32"):
        self.k, self.obs_shape, self.num_actions = k, tuple(obs_shape), num_actions
        self.sleep = cost == "sleep"
        kind, _, n = fault.partition(":")
        self.fault, self.fault_at, self.steps = kind, int(n or 0), 0
        self.step_ns = int(step_us * 1000)
        self.episode_len = episode_len
        self.rng = np.random.default_rng(seed)
        self.t = np.zeros(k, dtype=np.int64)
        self.obs = np.zeros((k, *self.obs_shape), dtype=np.dtype(dtype))
        self.flat = self.obs.reshape(k, -1)
        self.n_key = min(num_actions, self.flat.shape[1])

    def _draw(self, idx: np.ndarray | slice) -> None:
        shape = self.flat[idx, : self.n_key].shape
        self.flat[idx, : self.n_key] = (self.rng.standard_normal(shape) if self.flat.dtype != np.uint8
                                         else self.rng.integers(0, 256, shape, dtype=np.uint8))

    def reset(self) -> np.ndarray:
        self.t[:] = 0
        self._draw(slice(None))
        return self.obs

    def _inject_fault(self) -> None:
        self.steps += 1
        if self.steps < self.fault_at or self.fault in ("", "nan"):
            return
        if self.fault == "raise":
            raise RuntimeError(f"synthetic fault: env raised at step {self.steps}")
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "kill":
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        self._inject_fault()
        if self.step_ns and self.sleep:
            time.sleep(self.step_ns * self.k / 1e9)
        elif self.step_ns:
            end = time.thread_time_ns() + self.step_ns * self.k
            while time.thread_time_ns() < end:
                pass
        reward = (actions == self.flat[:, : self.n_key].argmax(axis=1)).astype(np.float32)
        if self.fault == "nan" and self.steps >= self.fault_at:
            reward[:] = np.nan
        self.t += 1
        done = self.t >= self.episode_len
        self.t[done] = 0
        self._draw(slice(None))
        return self.obs, reward, done, done.copy()


class EpisodicLife(gym.Wrapper):
    """End the learning episode at each life loss; reset the game only when it is really over."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        info["game_over"] = self.game_over
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:  # a lost life: continue the same game with a no-op
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


def _register_ale() -> None:
    try:
        import ale_py
    except ImportError as e:  # pragma: no cover - ale-py is a dependency
        raise ConfigError("env.id is an ALE id but ale-py is not installed: pip install ale-py") from e
    gym.register_envs(ale_py)


def make_single(cfg: EnvConfig, seed: int, render_mode: str | None = None) -> gym.Env:
    """One gymnasium env with the preprocessing its family needs (its id checked, and registered, by _check_id);
    ``render_mode='rgb_array'`` for videos."""
    if cfg.is_atari:
        _register_ale()
        kwargs = dict(frameskip=1, repeat_action_probability=cfg.sticky_actions, full_action_space=False)
        if render_mode:
            kwargs["render_mode"] = render_mode
        if cfg.max_episode_steps:
            kwargs["max_num_frames_per_episode"] = cfg.max_episode_steps * cfg.frameskip
        else:
            kwargs["max_num_frames_per_episode"] = 108_000
        env = gym.make(cfg.id, **kwargs)
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=cfg.noop_max, frame_skip=cfg.frameskip, screen_size=cfg.screen_size,
            grayscale_obs=True, terminal_on_life_loss=False, scale_obs=False)
        if cfg.episodic_life:
            env = EpisodicLife(env)
        env = gym.wrappers.FrameStackObservation(env, cfg.frame_stack)
    else:
        kwargs = {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}
        if render_mode:
            kwargs["render_mode"] = render_mode
        try:
            env = gym.make(import_user_modules(cfg), **cfg.make_kwargs, **kwargs)
        except TypeError as e:
            if not cfg.make_kwargs:
                raise
            raise ConfigError(f"env.kwargs={cfg.kwargs}: gymnasium.make({cfg.id!r}) does not take them ({e}); "
                              "give only the env's own keyword arguments") from None
        except gym.error.DependencyNotInstalled as e:  # e.g. Box2D for LunarLander, MuJoCo for HalfCheetah
            raise ConfigError(f"env.id={cfg.id!r} needs a package that is not installed: {e}") from None
        env = _flat_observations(env, cfg.id)
    env.action_space.seed(seed)
    return env


def _flat_observations(env: gym.Env, env_id: str) -> gym.Env:
    """Box observations pass as they are; Discrete (one-hot), MultiDiscrete, MultiBinary, Text, and Dict or Tuple
    of those are flattened by gymnasium into one float32 vector. Variable-sized spaces are refused, naming them."""
    space = env.observation_space
    if isinstance(space, gym.spaces.Box):
        return env
    try:
        flat = gym.spaces.flatten_space(space)
    except NotImplementedError:
        flat = None
    if not isinstance(flat, gym.spaces.Box):  # variable-sized spaces (Sequence, Graph) have no fixed vector
        env.close()
        raise ConfigError(f"env.id={env_id!r}: its observation space {space} cannot be given to the network; "
                          "supported: Box of any rank, Discrete, MultiDiscrete, MultiBinary, Text, and Dict or Tuple "
                          "of those (flattened)")
    return gym.wrappers.DtypeObservation(gym.wrappers.FlattenObservation(env), np.float32)


def _check_id(cfg: EnvConfig) -> None:
    if cfg.id == "synthetic" or cfg.backend == "envpool":
        return
    env_id = import_user_modules(cfg)
    if cfg.is_atari:
        _register_ale()
    from rlbalance.envs.pixel import register
    from rlbalance.envs.toy import register as register_toys

    register()
    register_toys()
    if env_id not in gym.registry:
        close = [k for k in gym.registry if env_id.lower().split("-")[0].split("/")[-1] in k.lower()][:5]
        hint = f" (did you mean one of {close}?)" if close else ""
        raise ConfigError(f"env.id={cfg.id!r} is not a registered environment{hint}; use a gymnasium id such as "
                          "CartPole-v1, an ALE id such as ALE/Pong-v5, 'synthetic', or your own as 'module:EnvId' "
                          "(or list the module that registers it in env.imports)")


INT32_SEEDS = 2**31 - 1


class EnvPoolBatch:
    """EnvPool's batched C++ envs, turned to same-step autoreset: where envs end, their reset is
    stepped at once (EnvPool resets on the *next* step, ignoring its action)."""

    def __init__(self, cfg: EnvConfig, k: int, seed: int):
        try:
            import envpool
        except ImportError:
            raise ConfigError("env.backend='envpool' but envpool is not installed: pip install envpool "
                              "(or: pip install -e '.[envpool]'), or use env.backend=gymnasium") from None
        task = cfg.id.removeprefix("ALE/")
        kwargs: dict = {}
        if cfg.is_atari:
            kwargs = dict(episodic_life=cfg.episodic_life, reward_clip=False, noop_max=cfg.noop_max,
                          frame_skip=cfg.frameskip, stack_num=cfg.frame_stack, img_height=cfg.screen_size,
                          img_width=cfg.screen_size, repeat_action_probability=cfg.sticky_actions)
            if cfg.max_episode_steps:
                kwargs["max_episode_steps"] = cfg.max_episode_steps
        elif cfg.max_episode_steps:
            kwargs["max_episode_steps"] = cfg.max_episode_steps
        if task not in envpool.list_all_envs():
            raise ConfigError(f"env.id={cfg.id!r} is not an EnvPool task; use env.backend=gymnasium")
        # One thread: an actor is one core's worth of env stepping, as with the gymnasium backend.
        # EnvPool takes int32 seeds only; ours grow with run.seed and the learner rank (rank r adds 7919 r to
        # run.seed, and a group's seed is run.seed x 1,000,003 + ...), so fold them into that range.
        self.env = envpool.make_gymnasium(task, num_envs=k, seed=int(seed % INT32_SEEDS), num_threads=1, **kwargs)
        self.atari = cfg.is_atari
        space = self.env.observation_space
        self.action = ActionSpec.from_space(self.env.action_space, cfg.id)
        self.spec = EnvSpec.of(space.shape, space.dtype, self.action, cfg.frameskip if cfg.is_atari else 1)
        self.k = k

    def reset(self) -> np.ndarray:
        obs, _ = self.env.reset()
        return obs

    def step(self, actions: np.ndarray):
        env_actions = actions.astype(np.int32) if self.action.kind == "discrete" else self.action.batch_to_env(actions)
        obs, rew, term, trunc, info = self.env.step(env_actions)
        done = term | trunc
        final = obs.copy() if trunc.any() else None
        game_over = done.copy()
        if self.atari:  # EnvPool's own flag for the game's end (with episodic life, ``term`` marks every life lost)
            game_over = done & (info["terminated"].astype(bool) | trunc)
        if done.any():
            ids = np.nonzero(done)[0]
            obs = obs.copy()
            noop = np.zeros((len(ids), *env_actions.shape[1:]), dtype=env_actions.dtype)
            obs[ids], *_ = self.env.step(noop, env_id=ids)
        return obs, rew.astype(np.float32), done, trunc & ~term, game_over, final

    def close(self) -> None:
        self.env.close()


class EnvBatch:
    """K environments stepped together. ``step`` returns obs, reward, done, and finished episodes."""

    def __init__(self, cfg: EnvConfig, k: int, seed: int, fault_armed: bool = False):
        _check_id(cfg)
        self.cfg, self.k, self.seed = cfg, k, seed
        self.synthetic = None
        self.pool = None
        self.envs: list[gym.Env] = []
        if cfg.backend == "envpool" and cfg.id != "synthetic":
            self.pool = EnvPoolBatch(cfg, k, seed)
            self.spec = self.pool.spec
        elif cfg.id == "synthetic":
            self.synthetic = SyntheticEnv(k, cfg.synthetic_obs_shape, cfg.synthetic_actions,
                                          cfg.synthetic_step_us, cfg.synthetic_episode_len, seed, cfg.synthetic_cost,
                                          cfg.synthetic_fault if fault_armed or cfg.synthetic_fault.startswith("nan")
                                          else "", cfg.synthetic_obs_dtype)
            self.spec = EnvSpec(tuple(cfg.synthetic_obs_shape), np.dtype(cfg.synthetic_obs_dtype), cfg.synthetic_actions,
                                1)
        else:
            self.envs = [make_single(cfg, seed + i) for i in range(k)]
            space = self.envs[0].observation_space
            try:
                action = ActionSpec.from_space(self.envs[0].action_space, cfg.id)
            except ConfigError:
                self.close()
                raise
            self.spec = EnvSpec.of(space.shape, space.dtype, action, cfg.frameskip if cfg.is_atari else 1)
        self.obs = np.zeros((k, *self.spec.obs_shape), dtype=self.spec.obs_dtype)
        self.reward = np.zeros(k, dtype=np.float32)
        self.done = np.zeros(k, dtype=bool)
        self.truncated = np.zeros(k, dtype=bool)
        # The last observation of an episode cut by a time limit, to bootstrap its value from.
        self.final_obs = np.zeros_like(self.obs)
        self.ep_return = np.zeros(k, dtype=np.float64)
        self.ep_length = np.zeros(k, dtype=np.int64)

    def reset(self) -> np.ndarray:
        if self.synthetic is not None:
            self.obs[:] = self.synthetic.reset()
        elif self.pool is not None:
            self.obs[:] = self.pool.reset()
        else:
            for i, env in enumerate(self.envs):
                self.obs[i], _ = env.reset(seed=self.seed + i)
        self.ep_return[:] = 0
        self.ep_length[:] = 0
        return self.obs

    def step(self, actions: np.ndarray) -> StepResult:
        """Step every env; where one ends, reset it at once (same-step autoreset)."""
        game_over = np.zeros(self.k, dtype=bool)
        self.truncated[:] = False
        if self.synthetic is not None:
            obs, rew, term, trunc = self.synthetic.step(actions)
            self.obs[:] = obs
            self.reward[:] = rew
            self.done[:] = term | trunc
            game_over[:] = self.done
        elif self.pool is not None:
            obs, rew, done, trunc, over, final = self.pool.step(actions)
            self.obs[:], self.reward[:], self.done[:], self.truncated[:] = obs, rew, done, trunc
            game_over[:] = over
            if trunc.any():
                self.final_obs[trunc] = final[trunc]
        else:
            to_env = self.spec.action.to_env
            for i, env in enumerate(self.envs):
                obs, rew, term, trunc, info = env.step(to_env(actions[i]))
                done = term or trunc
                self.reward[i] = rew
                self.done[i] = done
                if done:
                    game_over[i] = info.get("game_over", True)
                    if trunc and not term:
                        self.truncated[i] = True
                        self.final_obs[i] = obs
                    obs, _ = env.reset()
                self.obs[i] = obs
        self.ep_return += self.reward
        self.ep_length += 1
        finished = np.where(game_over, self.ep_return, 0.0)
        lengths = np.where(game_over, self.ep_length, 0)
        self.ep_return[game_over] = 0
        self.ep_length[game_over] = 0
        return StepResult(self.obs, self.reward, self.done, self.truncated, game_over, finished, lengths)

    def close(self) -> None:
        for env in self.envs:
            env.close()
        if self.pool is not None:
            self.pool.close()


def probe_spec(cfg: EnvConfig) -> EnvSpec:
    """The env's spec, from one throw-away env (checks the id before any process starts)."""
    batch = EnvBatch(cfg, 1, 0)
    spec = batch.spec
    batch.close()
    return spec
