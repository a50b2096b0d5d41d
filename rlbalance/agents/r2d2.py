"""R2D2's algorithm pieces (Kapturowski et al., "Recurrent Experience Replay in Distributed Reinforcement
Learning", ICLR 2019; the defaults are the paper's and SEED RL's Atari settings).

- ``rescale`` / ``inverse_rescale``: h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x and its exact inverse (Pohlen et al.
  2018), so Q-learning sees values of a bounded scale without reward clipping.
- ``n_step_double_q_targets``: y_t = h(sum_{k<n} gamma^k r_{t+k} + gamma^n h^-1(Q_target(s_{t+n}, argmax_a
  Q_online(s_{t+n}, a)))), the sum cut and the bootstrap dropped where the episode ends within the n steps.
- ``sequence_priorities``: eta max_t |delta_t| + (1 - eta) mean_t |delta_t| per sequence (eta 0.9).
- ``PrioritySampler``: proportional prioritised sampling (priority ** alpha) over a sum tree, with importance
  weights (N P(i)) ** -beta normalised by their maximum over the batch.
- ``epsilon_ladder``: the per-actor exploration rates of Ape-X/R2D2, eps_i = 0.4 ** (1 + 7 i / (N - 1)).
"""

from __future__ import annotations

import numpy as np
import torch

RESCALE_EPS = 1e-3


def rescale(x: torch.Tensor, eps: float = RESCALE_EPS) -> torch.Tensor:
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_rescale(x: torch.Tensor, eps: float = RESCALE_EPS) -> torch.Tensor:
    return torch.sign(x) * (((torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)) ** 2 - 1.0)


def n_step_double_q_targets(q_online: torch.Tensor, q_target: torch.Tensor, rewards: torch.Tensor,
                            done: torch.Tensor, discount: float, n: int, eps: float = RESCALE_EPS) -> torch.Tensor:
    """Targets [T1 - n, B] for rows 0..T1-n-1 of sequences [T1, B]: ``q_online`` and ``q_target`` [T1, B, A] the
    online and target networks' (rescaled) values of every row, ``rewards`` [T1, B] r_t, ``done`` [T1, B] whether
    the episode ended after a_t. Rows past T1-n-1 have no bootstrap row in the sequence (they are the next
    sequence's burn-in or overlap)."""
    t1 = rewards.shape[0]
    t = t1 - n
    if t < 1:
        raise ValueError(f"a sequence of {t1} rows has no row with an {n}-step target")
    alive = torch.ones_like(rewards[:t])  # the episode has not ended before step k
    ret = torch.zeros_like(rewards[:t])
    for k in range(n):
        ret = ret + alive * (discount ** k) * rewards[k:k + t]
        alive = alive * (1.0 - done[k:k + t].float())
    best = q_online[n:n + t].argmax(dim=-1, keepdim=True)  # double Q: the online net picks, the target net values
    boot = inverse_rescale(q_target[n:n + t].gather(-1, best).squeeze(-1), eps)
    return rescale(ret + alive * (discount ** n) * boot, eps)


def sequence_priorities(td: torch.Tensor, eta: float = 0.9) -> torch.Tensor:
    """Priority [B] of each sequence from its TD errors [T, B]."""
    a = td.abs()
    return eta * a.max(dim=0).values + (1.0 - eta) * a.mean(dim=0)


class PrioritySampler:
    """Proportional prioritised sampling over ``capacity`` slots (a sum tree: O(log N) updates and draws). A slot
    with priority p is drawn with probability p^alpha / sum; empty slots are never drawn."""

    def __init__(self, capacity: int, alpha: float = 0.9, seed: int = 0):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity, self.alpha = capacity, alpha
        self.size = 1
        while self.size < capacity:
            self.size *= 2
        self.tree = np.zeros(2 * self.size, dtype=np.float64)  # leaves at size..2*size-1
        self.rng = np.random.default_rng(seed)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of ``slots`` (0 empties a slot)."""
        slots = np.asarray(slots, dtype=np.int64)
        values = np.power(np.maximum(np.asarray(priorities, dtype=np.float64), 0.0), self.alpha)
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise IndexError(f"slots must be in [0, {self.capacity})")
        for s, v in zip(slots.tolist(), values.tolist()):  # (later duplicates win, as in a plain assignment)
            i = s + self.size
            self.tree[i] = v
            i //= 2
            while i >= 1:  # sums recomputed from the children: no drift from repeated differences
                self.tree[i] = self.tree[2 * i] + self.tree[2 * i + 1]
                i //= 2

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def probability(self, slots: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(slots) + self.size] / self.total

    def sample(self, batch: int, beta: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
        """``batch`` slots drawn with replacement (stratified: one draw from each of ``batch`` equal parts of the
        total), and their importance weights (N P(i))^-beta / max, N the number of filled slots."""
        if self.total <= 0:
            raise ValueError("nothing to sample: every priority is 0")
        bounds = (np.arange(batch) + self.rng.random(batch)) * (self.total / batch)
        slots = np.empty(batch, dtype=np.int64)
        for j, u in enumerate(bounds.tolist()):
            i = 1
            while i < self.size:
                left = self.tree[2 * i]
                if u < left or self.tree[2 * i + 1] <= 0:
                    i = 2 * i
                else:
                    u -= left
                    i = 2 * i + 1
            slots[j] = i - self.size
        filled = int(np.count_nonzero(self.tree[self.size:self.size + self.capacity]))
        w = np.power(filled * self.probability(slots), -beta)
        return slots, w / w.max()


def epsilon_ladder(n: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """The exploration rate of each of ``n`` actors (or envs): base ** (1 + alpha i / (n - 1))."""
    if n == 1:
        return np.array([base])
    return base ** (1.0 + alpha * np.arange(n) / (n - 1))
