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
- ``R2D2Net`` (torso, LSTM, dueling head; epsilon-greedy ``act``) and ``R2D2Learner`` (burn-in, targets, the
  importance-weighted TD loss, new priorities, the target net's copies). Not wired into the runners yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

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


# -- the network and the learner step ---------------------------------------------------------------------------

@dataclass(frozen=True)
class R2D2Settings:
    """The learner's settings (the paper's and SEED RL's Atari values). ``burn_in`` rows of each stored sequence
    only warm the recurrent state up (no loss there); targets look ``n_step`` rows ahead."""

    discount: float = 0.997
    n_step: int = 5
    burn_in: int = 40
    learning_rate: float = 1e-4
    adam_eps: float = 1e-3
    max_grad_norm: float = 80.0
    target_update_every: int = 2500  # learner updates between copies of the online net into the target net
    priority_eta: float = 0.9
    rescale_eps: float = RESCALE_EPS


class R2D2Net(nn.Module):
    """Torso (an MLP, or the Nature CNN for image observations) -> LSTM -> dueling head: Q = V + A - mean(A).
    ``forward`` runs over sequences [T1, B, ...] from start states [B, 2H] with resets where ``first``."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, hidden_sizes: tuple[int, ...] = (64, 64),
                 core_size: int = 128):
        super().__init__()
        from rlbalance.model import _mlp, _nature_cnn

        if len(obs_shape) == 3:
            self.torso, out = _nature_cnn(obs_shape[0], obs_shape[1])
        else:
            self.torso, out = _mlp(int(np.prod(obs_shape)), hidden_sizes), hidden_sizes[-1]
        self.core = nn.LSTMCell(out, core_size)
        self.core_size, self.num_actions = core_size, num_actions
        self.value = nn.Linear(core_size, 1)
        self.advantage = nn.Linear(core_size, num_actions)

    def initial_state(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(n, 2 * self.core_size, device=device)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / 255.0 if obs.dtype == torch.uint8 else obs.float()
        return self.torso(x)

    def _step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, c = self.core(x, (state[:, :self.core_size], state[:, self.core_size:]))
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(dim=-1, keepdim=True), torch.cat([h, c], dim=1)

    def forward(self, obs: torch.Tensor, state0: torch.Tensor, first: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-values [T1, B, A] and the state after each row [T1, B, 2H]; row 0's ``first`` is ignored (``state0``
        is the state row 0 starts from, as recorded)."""
        t1, b = obs.shape[:2]
        x = self._features(obs.reshape(t1 * b, *obs.shape[2:])).reshape(t1, b, -1)
        keep = (~first).to(state0.dtype)
        state, qs, states = state0, [], []
        for t in range(t1):
            if t:
                state = state * keep[t].view(-1, 1)
            q, state = self._step(x[t], state)
            qs.append(q)
            states.append(state)
        return torch.stack(qs), torch.stack(states)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, state: torch.Tensor, first: torch.Tensor, epsilon: torch.Tensor,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Epsilon-greedy actions for N envs (``epsilon`` [N], each env's own rate). Returns (actions, Q-values,
        the state the step started from (reset where ``first``), the state after it)."""
        state_in = state * (~first).to(state.dtype).view(-1, 1)
        q, state_out = self._step(self._features(obs), state_in)
        greedy = q.argmax(dim=-1)
        explore = torch.rand(q.shape[0], generator=generator, device=q.device) < epsilon
        random = torch.randint(0, self.num_actions, (q.shape[0],), generator=generator, device=q.device)
        return torch.where(explore, random, greedy), q, state_in, state_out


class R2D2Learner:
    """One R2D2 update on a batch of stored sequences: burn-in (online and target nets from the stored start
    state, no gradient), n-step double-Q targets with the value rescaling, a TD loss weighted by the replay's
    importance weights, new priorities for the sampled sequences, and the target net copied every
    ``target_update_every`` updates."""

    def __init__(self, net: R2D2Net, settings: R2D2Settings = R2D2Settings(), device: torch.device | str = "cpu"):
        import copy

        self.s, self.device = settings, torch.device(device)
        self.net = net.to(self.device)
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=settings.learning_rate, eps=settings.adam_eps)
        self.updates = 0

    def train(self, batch: dict[str, torch.Tensor], weights: torch.Tensor | None = None) -> dict:
        """``batch``: obs [T1, B, ...], action, reward, done, first [T1, B], core [B, 2H] (the state row 0 started
        from). ``weights`` [B]: importance weights (None: 1). Returns the loss figures and ``priorities`` [B]."""
        s = self.s
        b = {k: v.to(self.device) for k, v in batch.items()}
        burn = s.burn_in
        if b["action"].shape[0] <= burn + s.n_step:
            raise ValueError(f"sequences of {b['action'].shape[0]} rows leave nothing to learn from after a "
                             f"burn-in of {burn} and {s.n_step}-step targets")
        state_on = state_tg = b["core"]
        if burn:
            with torch.no_grad():
                _, st_on = self.net(b["obs"][:burn], b["core"], b["first"][:burn])
                _, st_tg = self.target(b["obs"][:burn], b["core"], b["first"][:burn])
            reset = (~b["first"][burn]).to(state_on.dtype).view(-1, 1)  # (forward treats row 0 as already reset)
            state_on, state_tg = st_on[-1] * reset, st_tg[-1] * reset
        rest = {k: b[k][burn:] for k in ("obs", "action", "reward", "done", "first")}
        q, _ = self.net(rest["obs"], state_on, rest["first"])
        with torch.no_grad():
            q_tg, _ = self.target(rest["obs"], state_tg, rest["first"])
            y = n_step_double_q_targets(q.detach(), q_tg, rest["reward"].float(), rest["done"], s.discount,
                                        s.n_step, s.rescale_eps)
        t = y.shape[0]
        q_taken = q[:t].gather(-1, rest["action"][:t].long().unsqueeze(-1)).squeeze(-1)
        td = y - q_taken
        per_seq = 0.5 * (td ** 2).mean(dim=0)
        w = torch.ones_like(per_seq) if weights is None else weights.to(self.device, per_seq.dtype)
        loss = (w * per_seq).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), s.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        if self.updates % s.target_update_every == 0:
            self.target.load_state_dict(self.net.state_dict())
        td = td.detach()
        return {"loss": float(loss.detach()), "grad_norm": float(grad_norm), "q_mean": float(q_taken.detach().mean()),
                "td_abs": float(td.abs().mean()), "priorities": sequence_priorities(td, s.priority_eta).cpu()}


class SequenceReplay:
    """A bounded replay of fixed-length sequences in the learner process, preallocated (its memory is known and
    checked before anything is allocated) and prioritised (``PrioritySampler``). Sequences are stored row-major
    [slot, T1, ...]; a full replay overwrites its oldest. ``field``: the config field that sets ``capacity``,
    named by the error when the replay does not fit in memory."""

    def __init__(self, capacity: int, seq_len: int, obs_shape: tuple[int, ...], obs_dtype, state_size: int,
                 alpha: float = 0.9, seed: int = 0, field: str = "capacity", memory_fraction: float = 0.8):
        import psutil

        from rlbalance.config import ConfigError

        obs_dtype = np.dtype(obs_dtype)
        per_seq = seq_len * (int(np.prod(obs_shape)) * obs_dtype.itemsize + 8 + 4 + 1 + 1) + 4 * state_size
        self.bytes = capacity * per_seq
        available = psutil.virtual_memory().available
        if capacity < 1 or self.bytes > memory_fraction * available:
            raise ConfigError(f"{field}={capacity} is invalid: {capacity:,} sequences of {seq_len} rows take "
                              f"{self.bytes / 2**30:.1f} GiB and {available / 2**30:.1f} GiB are free; use at most "
                              f"{max(1, int(memory_fraction * available // per_seq)):,}")
        self.capacity, self.seq_len = capacity, seq_len
        self.obs = np.zeros((capacity, seq_len, *obs_shape), dtype=obs_dtype)
        self.action = np.zeros((capacity, seq_len), dtype=np.int64)
        self.reward = np.zeros((capacity, seq_len), dtype=np.float32)
        self.done = np.zeros((capacity, seq_len), dtype=bool)
        self.first = np.zeros((capacity, seq_len), dtype=bool)
        self.core = np.zeros((capacity, state_size), dtype=np.float32)
        self.sampler = PrioritySampler(capacity, alpha, seed)
        self.generation = np.zeros(capacity, dtype=np.int64)  # bumped when a slot takes a new sequence
        self.next = 0
        self.filled = 0
        self.inserted = 0
        self.sampled = 0
        self.max_priority = 1.0

    def add(self, seqs: dict[str, np.ndarray], priorities: np.ndarray | None = None) -> np.ndarray:
        """Store B sequences (obs [B, T1, ...], action, reward, done, first [B, T1], core [B, S]); returns their
        slots. Without ``priorities`` they get the largest priority seen so far, so each is sampled soon."""
        n = len(seqs["action"])
        slots = (self.next + np.arange(n)) % self.capacity
        for name in ("obs", "action", "reward", "done", "first", "core"):
            getattr(self, name)[slots] = seqs[name]
        self.generation[slots] += 1
        p = np.full(n, self.max_priority) if priorities is None else np.asarray(priorities, dtype=np.float64)
        self.sampler.update(slots, p)
        self.max_priority = max(self.max_priority, float(p.max(initial=0.0)))
        self.next = int((self.next + n) % self.capacity)
        self.filled = min(self.capacity, self.filled + n)
        self.inserted += n
        return slots

    def sample(self, batch: int, beta: float = 0.6) -> tuple[np.ndarray, torch.Tensor, dict[str, torch.Tensor]]:
        """(slots, importance weights [B], the sequences time-major: [T1, B, ...], core [B, S]); ``out["generation"]``
        identifies the sequences for ``update_priorities`` (a slot overwritten meanwhile keeps its own)."""
        slots, w = self.sampler.sample(batch, beta)
        self.sampled += batch
        out = {name: torch.from_numpy(np.ascontiguousarray(np.swapaxes(getattr(self, name)[slots], 0, 1)))
               for name in ("obs", "action", "reward", "done", "first")}
        out["core"] = torch.from_numpy(self.core[slots])
        out["generation"] = torch.from_numpy(self.generation[slots].copy())
        return slots, torch.from_numpy(w), out

    def update_priorities(self, slots: np.ndarray, priorities, generation=None) -> None:
        """New priorities of sampled ``slots``; with the ``generation`` they were sampled at, those overwritten since
        are left alone (a new sequence does not inherit its predecessor's priority)."""
        slots, p = np.asarray(slots), np.asarray(priorities, dtype=np.float64)
        if generation is not None:
            live = self.generation[slots] == np.asarray(generation)
            slots, p = slots[live], p[live]
        self.sampler.update(slots, p)
        self.max_priority = max(self.max_priority, float(p.max(initial=0.0)))

    def replay_ratio(self) -> float:
        """Sequences sampled per sequence inserted (all of one length: how many times each stored step is learned
        from, on average)."""
        return self.sampled / self.inserted if self.inserted else 0.0
