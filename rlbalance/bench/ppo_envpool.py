"""A CleanRL-style PPO on EnvPool, as the peer baseline for CartPole throughput (measured in the same
bench run as our trainer). The loop follows CleanRL's ppo.py structure: one process, a batched
EnvPool env, rollouts of num_steps, GAE, 4 epochs of 4 minibatches, Adam 2.5e-4; only SPS is reported.
"""

from __future__ import annotations

import time

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
            next_v = critic(obs).squeeze(-1)
            adv = torch.zeros_like(rew_buf)
            last = torch.zeros(num_envs)
            for t in reversed(range(num_steps)):
                nonterm = 1.0 - (done if t == num_steps - 1 else done_buf[t + 1])
                nv = next_v if t == num_steps - 1 else val_buf[t + 1]
                delta = rew_buf[t] + 0.99 * nv * nonterm - val_buf[t]
                last = delta + 0.99 * 0.95 * nonterm * last
                adv[t] = last
            ret = adv + val_buf
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
