"""The pure pieces of R2D2: the invertible value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x (Pohlen et al.
2018), n-step double-Q targets, sequence priorities (eta max + (1 - eta) mean of |TD|) and the Ape-X epsilon ladder."""

from __future__ import annotations

import numpy as np
import torch

RESCALE_EPS = 1e-3


def rescale(x: torch.Tensor, eps: float = RESCALE_EPS) -> torch.Tensor:
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_rescale(x: torch.Tensor, eps: float = RESCALE_EPS) -> torch.Tensor:
    return torch.sign(x) * (((torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)) ** 2 - 1.0)


def n_step_double_q_targets(q_online: torch.Tensor, q_target: torch.Tensor, rewards: torch.Tensor,
                            done: torch.Tensor, discount: float, n: int, eps: float = RESCALE_EPS,
                            truncated: torch.Tensor | None = None, final_value: torch.Tensor | None = None
                            ) -> torch.Tensor:
    """Targets [T1 - n, B] for rows 0..T1-n-1 of sequences [T1, B]: ``q_online`` and ``q_target`` [T1, B, A] the
    online and target networks' (rescaled) values of every row, ``rewards`` [T1, B] r_t, ``done`` [T1, B] whether
    the episode ended after a_t. Rows past T1-n-1 have no bootstrap row in the sequence (they are the next
    sequence's burn-in or overlap). ``truncated`` [T1, B]: of those ends, the ones a time limit made, where the
    return bootstraps from ``final_value`` [T1, B] (the unrescaled double-Q value of the episode's last
    observation) instead of ending."""
    t1 = rewards.shape[0]
    t = t1 - n
    if t < 1:
        raise ValueError(f"a sequence of {t1} rows has no row with an {n}-step target")
    alive = torch.ones_like(rewards[:t])  # the episode has not ended before step k
    ret = torch.zeros_like(rewards[:t])
    for k in range(n):
        ret = ret + alive * (discount ** k) * rewards[k:k + t]
        if truncated is not None:
            assert final_value is not None, "a truncated step is bootstrapped from its final observation's value"
            ret = ret + alive * truncated[k:k + t].to(ret.dtype) * (discount ** (k + 1)) * final_value[k:k + t]
        alive = alive * (1.0 - done[k:k + t].float())
    best = q_online[n:n + t].argmax(dim=-1, keepdim=True)  # double Q: the online net picks, the target net values
    boot = inverse_rescale(q_target[n:n + t].gather(-1, best).squeeze(-1), eps)
    return rescale(ret + alive * (discount ** n) * boot, eps)


def sequence_priorities(td: torch.Tensor, eta: float = 0.9) -> torch.Tensor:
    """Priority [B] of each sequence from its TD errors [T, B]."""
    a = td.abs()
    return eta * a.max(dim=0).values + (1.0 - eta) * a.mean(dim=0)


def initial_priorities(seqs: dict[str, np.ndarray], burn_in: int, n_step: int, discount: float, eta: float = 0.9,
                       eps: float = RESCALE_EPS) -> np.ndarray | None:
    """Priorities [B] of new sequences (batch-major: q [B, T1, A], action, reward, done [B, T1]) from the Q-values
    the actors acted by, as Ape-X, R2D2 and SEED RL give them: n-step targets from those same values (one estimate
    stands for both online and target nets), over the rows after the burn-in. The last row's Q-values were never
    computed for this sequence (that observation is the next unroll's first), so targets stop n rows before it; a
    time limit's end counts as a terminal here (a priority, not a target).
    None where fewer than one row would have a target (the replay then gives its largest priority)."""
    if "q" not in seqs or seqs["q"].shape[-1] == 0:
        return None
    cut = slice(burn_in, seqs["q"].shape[1] - 1)
    rows = {k: torch.from_numpy(np.ascontiguousarray(np.swapaxes(seqs[k][:, cut], 0, 1))) for k in
            ("q", "action", "reward", "done")}  # time-major [T, B, ...]
    q = rows["q"].float()
    if q.shape[0] <= n_step:
        return None
    y = n_step_double_q_targets(q, q, rows["reward"].float(), rows["done"], discount, n_step, eps)
    t = y.shape[0]
    taken = q[:t].gather(-1, rows["action"][:t].long().unsqueeze(-1)).squeeze(-1)
    return sequence_priorities(y - taken, eta).numpy().astype(np.float64)


def env_epsilons(cfg) -> np.ndarray:
    """Each env's exploration rate [clients, K]: the ladder over all the envs of ``cfg`` (a learner rank's config
    where there are several learner processes: each rank's actors span the whole ladder), dealt out across the env
    groups like cards, so that every group's K envs span the ladder and any number of running actors does too (a
    self-balancing run allocates for more actors than it runs)."""
    k = cfg.actors.envs_per_actor
    ladder = epsilon_ladder(cfg.num_clients * k, cfg.r2d2.epsilon_base, cfg.r2d2.epsilon_alpha)
    return np.ascontiguousarray(ladder.reshape(k, -1).T)


def epsilon_ladder(n: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """The exploration rate of each of ``n`` actors (or envs): base ** (1 + alpha i / (n - 1))."""
    if n == 1:
        return np.array([base])
    return base ** (1.0 + alpha * np.arange(n) / (n - 1))
