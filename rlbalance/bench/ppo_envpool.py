"""CleanRL-style PPO on EnvPool, the peers we measure ourselves against on the same machine.

``ppo_envpool_sps``: CartPole (the baseline for CartPole throughput and time to 475, measured in the same bench
run as our trainer), after CleanRL's ppo.py: one process, a batched EnvPool env, rollouts of num_steps, GAE,
4 epochs of 4 minibatches, Adam 2.5e-4. ``ppo_envpool_atari``: Atari with the settings of CleanRL's PPO for
Atari on EnvPool, resumable, with its curve (``rlbalance bench atari-peer``).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch import nn


def _layer(i, o, std=np.sqrt(2)):
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.zeros_(lin.bias)
    return lin


def ppo_envpool_sps(total_steps: int = 200_000, num_envs: int = 8, num_steps: int = 128, seed: int = 0,
                    target: float | None = None) -> dict:
    """SPS over ``total_steps``; with ``target``, also the wall time and env steps at which the mean return of
    the last 100 episodes first reached it (checked after each rollout), and the curve (seconds, steps, mean)."""
    import envpool

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    envs = envpool.make_gymnasium("CartPole-v1", num_envs=num_envs, seed=seed)
    obs_dim, n_act = envs.observation_space.shape[0], envs.action_space.n
    actor = nn.Sequential(_layer(obs_dim, 64), nn.Tanh(), _layer(64, 64), nn.Tanh(), _layer(64, n_act, 0.01))
    critic = nn.Sequential(_layer(obs_dim, 64), nn.Tanh(), _layer(64, 64), nn.Tanh(), _layer(64, 1, 1.0))
    opt = torch.optim.Adam(list(actor.parameters()) + list(critic.parameters()), lr=2.5e-4, eps=1e-5)
    obs_buf = torch.zeros(num_steps, num_envs, obs_dim)
    act_buf = torch.zeros(num_steps, num_envs, dtype=torch.long)
    logp_buf, rew_buf, done_buf, val_buf = (torch.zeros(num_steps, num_envs) for _ in range(4))
    obs = torch.tensor(envs.reset()[0], dtype=torch.float32)
    done = torch.zeros(num_envs)
    steps, t0 = 0, time.perf_counter()
    returns, ep_ret = [], np.zeros(num_envs)
    curve, hit = [], None
    while steps < total_steps:
        for t in range(num_steps):
            obs_buf[t], done_buf[t] = obs, done
            with torch.no_grad():
                dist = torch.distributions.Categorical(logits=actor(obs))
                a = dist.sample()
                logp_buf[t], val_buf[t] = dist.log_prob(a), critic(obs).squeeze(-1)
            act_buf[t] = a
            o, r, term, trunc, _ = envs.step(a.numpy())
            ep_ret += r
            d = term | trunc
            returns += ep_ret[d].tolist()
            ep_ret[d] = 0
            rew_buf[t] = torch.tensor(r, dtype=torch.float32)
            obs, done = torch.tensor(o, dtype=torch.float32), torch.tensor(d, dtype=torch.float32)
        steps += num_steps * num_envs
        if returns:
            mean = float(np.mean(returns[-100:]))
            curve.append((time.perf_counter() - t0, steps, mean))
            if target is not None and hit is None and mean >= target:
                hit = curve[-1]
        with torch.no_grad():
            adv, ret = _gae(rew_buf, done_buf, val_buf, critic(obs).squeeze(-1), done, 0.99, 0.95)
        b_obs, b_act, b_logp = obs_buf.reshape(-1, obs_dim), act_buf.reshape(-1), logp_buf.reshape(-1)
        b_adv, b_ret = adv.reshape(-1), ret.reshape(-1)
        n = b_obs.shape[0]
        for _ in range(4):
            perm = torch.randperm(n)
            for mb in perm.split(n // 4):
                dist = torch.distributions.Categorical(logits=actor(b_obs[mb]))
                ratio = (dist.log_prob(b_act[mb]) - b_logp[mb]).exp()
                a_mb = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg = torch.max(-a_mb * ratio, -a_mb * ratio.clamp(0.8, 1.2)).mean()
                v_loss = 0.5 * ((critic(b_obs[mb]).squeeze(-1) - b_ret[mb]) ** 2).mean()
                loss = pg + 0.5 * v_loss - 0.01 * dist.entropy().mean()
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(list(actor.parameters()) + list(critic.parameters()), 0.5)
                opt.step()
    wall = time.perf_counter() - t0
    envs.close()
    out = {"sps": steps / wall, "steps": steps, "wall_s": wall,
           "return_last100": float(np.mean(returns[-100:])) if returns else float("nan")}
    if target is not None:
        out.update(target=target, seconds_to_target=hit[0] if hit else None, steps_to_target=hit[1] if hit else None,
                   curve=curve)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The Atari peer: CleanRL's PPO for Atari on EnvPool, as its documentation publishes it (8 envs, rollouts of 128
# steps, Adam 2.5e-4 annealed linearly to 0 over CleanRL's 10M agent steps (40M frames) whatever --frames says,
# so a run stopped earlier learns as the start of CleanRL's run does, 4 epochs of 4 minibatches, clip 0.1 on the
# policy and the value, entropy 0.01, value 0.5, grad norm 0.5, GAE lambda 0.95, discount 0.99; EnvPool with
# episodic life and rewards clipped to [-1, 1], sticky actions off, the Nature CNN on 4 stacked 84x84 frames). One
# process: the env steps and the learner take turns on all the CPUs. The return reported is the game's (unclipped,
# over all lives).

ATARI_PEER = {"num_envs": 8, "num_steps": 128, "learning_rate": 2.5e-4, "anneal_lr": True, "epochs": 4,
              "minibatches": 4, "clip": 0.1, "entropy_cost": 0.01, "value_cost": 0.5, "max_grad_norm": 0.5,
              "gae_lambda": 0.95, "discount": 0.99, "episodic_life": True, "reward_clip": True,
              "anneal_frames": 40_000_000}


class _NatureNet(nn.Module):
    def __init__(self, n_actions: int):
        super().__init__()
        self.torso = nn.Sequential(
            _conv(4, 32, 8, 4), nn.ReLU(), _conv(32, 64, 4, 2), nn.ReLU(), _conv(64, 64, 3, 1), nn.ReLU(),
            nn.Flatten(), _layer(64 * 7 * 7, 512), nn.ReLU())
        self.pi, self.v = _layer(512, n_actions, 0.01), _layer(512, 1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.torso(obs.float() / 255.0)
        return self.pi(h), self.v(h).squeeze(-1)


def _conv(i, o, k, s):
    c = nn.Conv2d(i, o, k, s)
    nn.init.orthogonal_(c.weight, np.sqrt(2))
    nn.init.zeros_(c.bias)
    return c


def game_over(terminated: np.ndarray, truncated: np.ndarray, info: dict) -> np.ndarray:
    """Where a game (not a life) ended: with episodic life EnvPool's ``terminated`` marks every life lost, and
    ``info['terminated']`` the game's end."""
    return np.asarray(info["terminated"], dtype=bool) | np.asarray(truncated, dtype=bool)


def ppo_envpool_atari(game: str, frames: int, seed: int, state_path: Path, progress=print,
                      checkpoint_interval_s: float = 300.0, log_interval_s: float = 10.0,
                      settings: dict | None = None, stop=lambda: False, until: float | None = None) -> dict:
    """Train the Atari peer on ``game`` (EnvPool's ``GAME-v5``) to ``frames`` frames, resuming from
    ``state_path`` where an earlier call left it (same game, seed and settings; ``frames`` may grow, since the
    learning rate anneals over ``settings['anneal_frames']``). Returns the run: its curve (``frames``, ``wall_s``:
    seconds of training summed over sessions, ``return``: mean game return of the last 100 games, ``fps``, and the
    means of ``PEER_STATS`` over the updates since the row before) every ``log_interval_s``, and
    ``outcome`` 'completed', 'reached' where ``until`` is given and the mean of the last 100 games (100 of them)
    reached it, or 'interrupted' where ``stop()`` turned true (checked after each rollout; the state is saved
    then)."""
    import os

    import envpool

    t_session = time.perf_counter()  # wall time counts the envs' start, as our trainer's counts its actors'
    s = {**ATARI_PEER, **(settings or {})}
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(ncpu)
    torch.manual_seed(seed)
    n, t_len = s["num_envs"], s["num_steps"]
    run = {"game": game, "seed": seed, "frames": 0, "wall_s": 0.0, "returns": [], "curve": [], "settings": s,
           "sessions": 0}
    saved = torch.load(state_path, map_location="cpu", weights_only=True) if state_path.is_file() else None
    if saved is not None:
        was = saved["run"]
        if (was["game"], was["seed"], was["settings"]) != (game, seed, s):
            raise ValueError(f"{state_path} holds the peer on {was['game']} seed {was['seed']} with settings "
                             f"{was['settings']}, not {game} seed {seed} with {s}: give another output folder, or "
                             "the same game, seed and settings")
        run = was
    # A resumed run's envs start new games, seeded apart from the sessions before (their unfinished games are lost:
    # their frames count, their scores do not, as in our trainer).
    envs = envpool.make_gymnasium(f"{game}-v5", num_envs=n, seed=seed + 10_000 * run["sessions"],
                                  num_threads=min(n, ncpu), episodic_life=s["episodic_life"],
                                  reward_clip=s["reward_clip"], repeat_action_probability=0.0)
    run["sessions"] += 1
    net = _NatureNet(envs.action_space.n)
    opt = torch.optim.Adam(net.parameters(), lr=s["learning_rate"], eps=1e-5)
    per_rollout = n * t_len * 4  # frames: frameskip 4
    rollouts = max(1, frames // per_rollout)
    if saved is not None:
        net.load_state_dict(saved["net"])
        opt.load_state_dict(saved["opt"])
        torch.set_rng_state(saved["torch_rng"])
        progress(f"[{game} peer] resuming at {run['frames']:,} frames")

    def save() -> None:
        state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = state_path.with_suffix(".tmp")
        torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "torch_rng": torch.get_rng_state(),
                    "run": run}, tmp)
        os.replace(tmp, state_path)

    obs_buf = torch.zeros((t_len, n, 4, 84, 84), dtype=torch.uint8)
    act_buf = torch.zeros((t_len, n), dtype=torch.long)
    logp_buf, rew_buf, done_buf, val_buf = (torch.zeros(t_len, n) for _ in range(4))
    obs = torch.from_numpy(envs.reset()[0])
    done = torch.zeros(n)
    game_ret = np.zeros(n)
    wall0 = run["wall_s"]
    last_log = last_ckpt = last_progress = t_session
    frames_at_log, t_at_log = run["frames"], t_session
    stat_sums, stat_n = dict.fromkeys(PEER_STATS, 0.0), 0  # the updates' measures since the last curve row
    outcome = "completed"
    if until is not None and run.get("reached") is not None and run["reached"] >= until:
        outcome = "reached"  # an earlier call stopped at this ``until`` or a higher one
    while run["frames"] < rollouts * per_rollout and outcome != "reached":
        if s["anneal_lr"]:
            done_frac = min(1.0, run["frames"] / s["anneal_frames"])
            for g in opt.param_groups:
                g["lr"] = s["learning_rate"] * (1.0 - done_frac)
        for t in range(t_len):
            obs_buf[t], done_buf[t] = obs, done
            with torch.no_grad():
                logits, v = net(obs)
                dist = torch.distributions.Categorical(logits=logits)
                a = dist.sample()
            act_buf[t], logp_buf[t], val_buf[t] = a, dist.log_prob(a), v
            o, r, term, trunc, info = envs.step(a.numpy())
            game_ret += info["reward"]  # the unclipped reward
            ended = game_over(term, trunc, info)
            run["returns"] = (run["returns"] + game_ret[ended].tolist())[-100:]
            game_ret[ended] = 0.0
            rew_buf[t] = torch.from_numpy(np.asarray(r, dtype=np.float32))
            obs, done = torch.from_numpy(o), torch.from_numpy((term | trunc).astype(np.float32))
        run["frames"] += per_rollout
        upd = _ppo_update(net, opt, s, obs, done, obs_buf, act_buf, logp_buf, rew_buf, done_buf, val_buf)
        for k in PEER_STATS:
            stat_sums[k] += upd[k]
        stat_n += 1
        now = time.perf_counter()
        run["wall_s"] = wall0 + (now - t_session)
        reached = until is not None and len(run["returns"]) == 100 and float(np.mean(run["returns"])) >= until
        if now - last_log >= log_interval_s or run["frames"] >= rollouts * per_rollout or reached:
            fps = (run["frames"] - frames_at_log) / (now - t_at_log)
            mean = float(np.mean(run["returns"])) if run["returns"] else None
            run["curve"].append({"frames": run["frames"], "wall_s": round(run["wall_s"], 2), "return": mean,
                                 "fps": fps, **{k: stat_sums[k] / stat_n for k in PEER_STATS}})
            last_log, frames_at_log, t_at_log = now, run["frames"], now
            stat_sums, stat_n = dict.fromkeys(PEER_STATS, 0.0), 0
        if now - last_progress >= 30.0:
            mean = run["curve"][-1]["return"] if run["curve"] else None
            progress(f"[{game} peer] {run['frames'] / 1e6:.2f}M / {frames / 1e6:.1f}M frames, "
                     f"{run['curve'][-1]['fps'] if run['curve'] else 0:,.0f} FPS, last-100 "
                     f"{'-' if mean is None else f'{mean:+.1f}'}, {run['wall_s'] / 60:.1f} min")
            last_progress = now
        if now - last_ckpt >= checkpoint_interval_s:
            save()
            last_ckpt = now
        if reached:
            outcome, run["reached"] = "reached", until
            break
        if stop():
            outcome = "interrupted"
            break
    save()
    envs.close()
    return {**run, "outcome": outcome}


def _gae(rew, done_buf, val, next_v, next_done, discount: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns of a [T, N] rollout, as CleanRL computes them: ``done_buf[t]`` marks the
    observation at step t as the first of a new episode; the rollout's end bootstraps from ``next_v``."""
    t_len = rew.shape[0]
    adv = torch.zeros_like(rew)
    last = torch.zeros_like(rew[0])
    for t in reversed(range(t_len)):
        nonterm = 1.0 - (next_done if t == t_len - 1 else done_buf[t + 1])
        nv = next_v if t == t_len - 1 else val[t + 1]
        last = rew[t] + discount * nv * nonterm - val[t] + discount * lam * nonterm * last
        adv[t] = last
    return adv, adv + val


PEER_STATS = ("entropy", "clip_fraction", "approx_kl", "grad_norm")  # per update, as our learner records them


def _ppo_update(net, opt, s, obs, done, obs_buf, act_buf, logp_buf, rew_buf, done_buf, val_buf) -> dict:
    """CleanRL's PPO update on one rollout; returns the means over its optimizer steps of the policy's entropy, the
    clip fraction, the approximate KL to the acting policy (CleanRL's (r - 1) - log r) and the gradient norm before
    clipping, the measures our learner's metrics hold (``loss/entropy``, ``loss/clip_fraction``, ...)."""
    sums = dict.fromkeys(PEER_STATS, 0.0)
    steps = 0
    with torch.no_grad():
        adv, ret = _gae(rew_buf, done_buf, val_buf, net(obs)[1], done, s["discount"], s["gae_lambda"])
    b_obs, b_act, b_logp = obs_buf.flatten(0, 1), act_buf.flatten(), logp_buf.flatten()
    b_adv, b_ret, b_val = adv.flatten(), ret.flatten(), val_buf.flatten()
    rows, clip = b_obs.shape[0], s["clip"]
    for _ in range(s["epochs"]):
        for mb in torch.randperm(rows).split(rows // s["minibatches"]):
            logits, v = net(b_obs[mb])
            dist = torch.distributions.Categorical(logits=logits)
            log_ratio = dist.log_prob(b_act[mb]) - b_logp[mb]
            ratio = log_ratio.exp()
            a_mb = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
            pg = torch.max(-a_mb * ratio, -a_mb * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_clipped = b_val[mb] + (v - b_val[mb]).clamp(-clip, clip)
            v_loss = 0.5 * torch.max((v - b_ret[mb]) ** 2, (v_clipped - b_ret[mb]) ** 2).mean()
            entropy = dist.entropy().mean()
            loss = pg + s["value_cost"] * v_loss - s["entropy_cost"] * entropy
            opt.zero_grad()
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(net.parameters(), s["max_grad_norm"])
            opt.step()
            with torch.no_grad():
                sums["entropy"] += float(entropy)
                sums["clip_fraction"] += float(((ratio - 1).abs() > clip).float().mean())
                sums["approx_kl"] += float(((ratio - 1) - log_ratio).mean())
                sums["grad_norm"] += float(grad_norm)
            steps += 1
    return {k: v / steps for k, v in sums.items()}
