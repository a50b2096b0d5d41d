"""Evaluate a trained policy: play whole games with a run's checkpoint, no learning, and report the returns.

Each of the K envs plays the same number of games (episodes / K, rounded up; K at most the games asked for, so
``--episodes 3`` plays 3 games, not one per default env), so short games are not over-counted the way "the first
N games to finish" would. Returns are whole-game returns, unclipped (with episodic life, all lives of a game).
Actions are sampled from the policy, as in training, or the most likely action with ``greedy`` (an agent with no
policy to sample, a Q-network: always its greedy action). Envs are seeded apart from the training seeds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlbalance.agents import registry
from rlbalance.config import EnvConfig
from rlbalance.core.errors import ConfigError
from rlbalance.core.jsonio import atomic_write_json
from rlbalance.envs.batch import EnvBatch, probe_spec
from rlbalance.runtime.actor import client_seed
from rlbalance.runtime.policies import net_step
from rlbalance.runtime.devices import resolve_device
from rlbalance.runtime.rundir import RunDir

# Eval envs are seeded away from the run's training envs, which take client_seed(cfg, c) + 0..K-1 (+ 7919 per restart).
EVAL_SEED_OFFSET = 500_009


def evaluate(run_dir: str | Path, episodes: int = 10, num_envs: int = 8, greedy: bool = False,
             checkpoint: str | Path | None = None, device: str = "cpu", seed: int | None = None,
             max_steps: int = 10_000_000, progress: bool = True, out_dir: str | Path | None = None,
             threads: int | None = None, trust_modules: bool = False) -> dict:
    """Play ``episodes`` games (at least) with the run's latest (or the given) checkpoint; with ``out_dir``, writes
    eval.json there (the run directory itself only when given as ``out_dir``: a run read is not a run written).
    Stops early after ``max_steps`` env steps, keeping the games finished by then (``complete`` False).
    ``threads``: torch intra-op threads for the policy while it plays (restored after); None keeps the process's.
    ``trust_modules``: import the modules the run's config names (a custom env or agent); refused otherwise, since
    a run directory may come from anyone (rlbalance/config/trust.py)."""
    check_eval_args(episodes, num_envs, max_steps, threads)
    run = RunDir(Path(run_dir))
    cfg = run.read_config(trust_modules=trust_modules)
    ckpt_path = Path(checkpoint) if checkpoint else run.latest_checkpoint()
    if ckpt_path is None:
        raise ConfigError(f"run_dir {run.path}: no checkpoint in {run.ckpt_dir}; train first, or pass --checkpoint")
    state = run.load_checkpoint(ckpt_path)
    env_cfg: EnvConfig = cfg.env
    spec = probe_spec(env_cfg)
    dev = resolve_device(device)
    model = registry.build_model(cfg.learner, spec).to(dev)
    model.load_state_dict(state["model"])
    model.eval()
    seed = client_seed(cfg, 0) + EVAL_SEED_OFFSET if seed is None else seed
    num_envs = min(num_envs, episodes)  # no env plays games nobody asked for
    per_env = math.ceil(episodes / num_envs)
    gen = torch.Generator(device=dev).manual_seed(seed)
    returns: list[list[float]] = [[] for _ in range(num_envs)]
    lengths: list[list[int]] = [[] for _ in range(num_envs)]
    core = model.initial_state(num_envs, dev) if model.recurrent else None
    first = torch.ones(num_envs, dtype=torch.bool, device=dev)
    steps, t0 = 0, time.perf_counter()
    with contextlib.ExitStack() as done:  # each thing made is undone on the way out, however it is left
        envs = EnvBatch(env_cfg, num_envs, seed)
        done.callback(envs.close)
        bar = _bar(per_env * num_envs, progress)
        if bar is not None:
            done.callback(bar[0].stop)
        used_threads = done.enter_context(torch_threads(threads))
        obs = envs.reset()
        while any(len(r) < per_env for r in returns) and steps < max_steps:
            actions, core = policy_actions(model, torch.from_numpy(obs).to(dev), gen, greedy, core, first)
            r = envs.step(actions.cpu().numpy())
            obs = r.obs
            first = torch.from_numpy(r.done | r.truncated).to(dev)
            steps += num_envs
            for i in np.flatnonzero(r.game_over):
                if len(returns[i]) < per_env:
                    returns[i].append(float(r.ep_return[i]))
                    lengths[i].append(int(r.ep_length[i]))
                    if bar is not None:
                        bar[0].advance(bar[1])
    flat = [x for r in returns for x in r]
    flat_len = [x for n in lengths for x in n]

    def stat(fn, xs):
        return float(fn(xs)) if xs else None

    result = {
        "env": env_cfg.id, "checkpoint": str(ckpt_path), "checkpoint_steps": int(state["steps"]),
        "checkpoint_updates": int(state["updates"]), "policy": _policy_kind(cfg, greedy),
        # complete: every env played its games; False where --max-steps ran out first (the games played are kept)
        "complete": len(flat) == per_env * num_envs,
        "episodes": len(flat), "games_per_env": per_env, "num_envs": num_envs, "seed": seed,
        "return_mean": stat(np.mean, flat), "return_std": stat(np.std, flat),
        "return_min": stat(np.min, flat), "return_max": stat(np.max, flat),
        "length_mean": stat(np.mean, flat_len), "returns": flat, "lengths": flat_len,
        "env_steps": steps, "frames": steps * spec.frames_per_step, "wall_s": time.perf_counter() - t0,
        "device": str(dev), "torch_threads": used_threads,
    }
    result["run_dir"] = str(run.path)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(out_dir) / "eval.json", result)
    return result


def check_eval_args(episodes: int = 1, num_envs: int = 1, max_steps: int = 1, threads: int | None = None) -> None:
    """Refuse a bad count (a ConfigError naming its option) before anything is played or written."""
    for name, value in (("--episodes", episodes), ("--envs", num_envs), ("--max-steps", max_steps)):
        if value < 1:
            raise ConfigError(f"{name} {value}: must be >= 1")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads {threads}: must be >= 1 (one per core is the fastest on an idle machine)")


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Torch's intra-op thread count set to ``threads`` inside the block (None: the process's own), restored after;
    yields the count in use."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def _bar(total: int, enabled: bool):
    if not enabled:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]eval games"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    task = bar.add_task("eval", total=total)
    bar.start()
    return bar, task


def record_video(run_dir: str | Path, out: str | Path, greedy: bool = False,
                 checkpoint: str | Path | None = None, device: str = "cpu", seed: int | None = None,
                 max_steps: int = 10_000, threads: int | None = None, trust_modules: bool = False) -> dict:
    """One game played by the run's policy, as an MP4 (the env's own rgb frames, written by OpenCV);
    stops after ``max_steps`` agent steps; ``threads`` and ``trust_modules`` as in :func:`evaluate`. Returns the video's path, frames,
    fps, the game's return and the torch threads it played with."""
    import cv2

    from rlbalance.envs.batch import _check_id, make_single

    check_eval_args(threads=threads)
    if max_steps < 1:
        raise ConfigError(f"--video-steps {max_steps}: must be >= 1")
    run = RunDir(Path(run_dir))
    cfg = run.read_config(trust_modules=trust_modules)
    env_cfg = dataclasses.replace(cfg.env, backend="gymnasium")  # EnvPool does not render; same preprocessing
    if env_cfg.id == "synthetic":
        raise ConfigError("--video: the synthetic env has nothing to show; record a gymnasium or ALE env")
    ckpt_path = Path(checkpoint) if checkpoint else run.latest_checkpoint()
    if ckpt_path is None:
        raise ConfigError(f"run_dir {run.path}: no checkpoint in {run.ckpt_dir}; train first, or pass --checkpoint")
    state = run.load_checkpoint(ckpt_path)
    _check_id(env_cfg)
    spec = probe_spec(cfg.env)
    dev = resolve_device(device)
    model = registry.build_model(cfg.learner, spec).to(dev)
    model.load_state_dict(state["model"])
    model.eval()
    seed = client_seed(cfg, 0) + EVAL_SEED_OFFSET if seed is None else seed
    env = make_single(env_cfg, seed, render_mode="rgb_array")
    if "rgb_array" not in (env.metadata.get("render_modes") or []):
        env.close()
        raise ConfigError(f"--video: {env_cfg.id} cannot render rgb frames (its render modes: "
                          f"{env.metadata.get('render_modes')})")
    # one rendered frame per agent step: an Atari agent step is frameskip emulator frames
    # (the Atari 2600 draws 60 frames a second, whatever ALE's metadata says)
    fps = 60.0 / env_cfg.frameskip if env_cfg.is_atari else float(env.metadata.get("render_fps") or 30)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=dev).manual_seed(seed)
    obs, _ = env.reset(seed=seed)
    frame: Any = env.render()  # (rgb_array: an image)
    h, w = frame.shape[:2]
    tmp = path.with_name(path.name + ".tmp.mp4")
    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter.fourcc(*"mp4v"), fps, (w, h))
    if not writer.isOpened():
        env.close()
        raise ConfigError(f"--video: OpenCV cannot write MP4 to {path}")
    frames, ret, steps, over = 0, 0.0, 0, False
    core = model.initial_state(1, dev) if model.recurrent else None
    first = torch.ones(1, dtype=torch.bool, device=dev)
    with torch_threads(threads) as used_threads:
        try:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
            frames += 1
            while not over and steps < max_steps:
                x = torch.as_tensor(np.asarray(obs, dtype=spec.obs_dtype)[None]).to(dev)
                a, core = policy_actions(model, x, gen, greedy, core, first)
                obs, r, term, trunc, info = env.step(model.action.to_env(a[0].cpu().numpy()))
                first[0] = bool(term) or bool(trunc)
                ret += float(r)
                steps += 1
                over = bool(trunc) or (bool(term) and info.get("game_over", True))
                if term and not over:  # episodic life: a lost life, the game goes on
                    obs, _ = env.reset()
                frame = env.render()
                writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
                frames += 1
        except BaseException:
            writer.release()
            tmp.unlink(missing_ok=True)
            raise
        finally:
            writer.release()
            env.close()
    tmp.replace(path)
    return {"path": str(path), "frames": frames, "fps": fps, "seconds": frames / fps, "agent_steps": steps,
            "game_over": over, "return": ret, "checkpoint_steps": int(state["steps"]),
            "policy": _policy_kind(cfg, greedy), "torch_threads": used_threads}


def _policy_kind(cfg, greedy: bool) -> str:
    """How the actions were chosen: greedy where asked, or where the agent plays nothing else (a Q-network)."""
    return "greedy" if greedy or registry.get(cfg.learner.agent).greedy_eval else "sampled"


def policy_actions(model: Any, x: torch.Tensor, generator: torch.Generator | None, greedy: bool,
                   state: torch.Tensor | None = None, first: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Actions for observations ``x`` (greedy: the net's ``mode`` of the step's record), as evaluation plays them; a
    recurrent net also takes its envs' core states and which observations start an episode, and returns the new
    states."""
    actions, out, _, state = net_step(model, x, state if model.recurrent else None, first, generator)
    return (model.mode(out) if greedy else actions), state
