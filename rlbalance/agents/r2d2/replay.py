"""R2D2's replay: the prioritised sampler (a sum tree), the sequence store, and the assembler that makes sequences of
consecutive unrolls of each env."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np
import torch

from rlbalance.core.errors import ConfigError


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


class SequenceReplay:
    """A bounded replay of fixed-length sequences in the learner process, preallocated (its memory is known and
    checked before anything is allocated) and prioritised (``PrioritySampler``). Sequences are stored row-major
    [slot, T1, ...]; a full replay overwrites its oldest. ``field``: the config field that sets ``capacity``,
    named by the error when the replay does not fit in memory."""

    def __init__(self, capacity: int, seq_len: int, obs_shape: tuple[int, ...], obs_dtype, state_size: int,
                 alpha: float = 0.9, seed: int = 0, field: str = "capacity", memory_fraction: float = 0.8,
                 num_actions: int = 0):
        obs_dtype = np.dtype(obs_dtype)
        self.bytes = self.check_fits(capacity, seq_len, obs_shape, obs_dtype, state_size, field, memory_fraction,
                                     num_actions)
        self.capacity, self.seq_len = capacity, seq_len
        self.obs = np.zeros((capacity, seq_len, *obs_shape), dtype=obs_dtype)
        self.action = np.zeros((capacity, seq_len), dtype=np.int64)
        self.reward = np.zeros((capacity, seq_len), dtype=np.float32)
        self.done = np.zeros((capacity, seq_len), dtype=bool)
        self.first = np.zeros((capacity, seq_len), dtype=bool)
        self.core = np.zeros((capacity, state_size), dtype=np.float32)
        # a time limit inside the sequence: its row (-1: none) and the episode's last observation, to bootstrap from
        self.trunc_row = np.full(capacity, -1, dtype=np.int64)
        self.final_obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        # the Q-values the actors acted by ([.., 0] where not kept): the learner's check that it sees what they saw
        self.q = np.zeros((capacity, seq_len, num_actions), dtype=np.float32)
        self.sampler = PrioritySampler(capacity, alpha, seed)
        self.generation = np.zeros(capacity, dtype=np.int64)  # bumped when a slot takes a new sequence
        self.next = 0
        self.filled = 0
        self.inserted = 0
        self.sampled = 0
        self.max_priority = 1.0

    @staticmethod
    def check_fits(capacity: int, seq_len: int, obs_shape: tuple[int, ...], obs_dtype, state_size: int,
                   field: str = "capacity", memory_fraction: float = 0.8, num_actions: int = 0) -> int:
        """The replay's bytes; a ConfigError naming ``field`` and the largest size that fits where it would not fit in
        ``memory_fraction`` of the free memory."""
        import psutil

        obs_bytes = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
        per_seq = seq_len * (obs_bytes + 8 + 4 + 1 + 1 + 4 * num_actions) + 4 * state_size + obs_bytes + 8
        total = capacity * per_seq
        available = psutil.virtual_memory().available
        if capacity < 1 or total > memory_fraction * available:
            raise ConfigError(f"{field}={capacity} is invalid: {capacity:,} sequences of {seq_len} rows take "
                              f"{total / 2**30:.1f} GiB and {available / 2**30:.1f} GiB are free; use at most "
                              f"{max(1, int(memory_fraction * available // per_seq)):,}")
        return total

    def add(self, seqs: dict[str, np.ndarray], priorities: np.ndarray | None = None) -> np.ndarray:
        """Store B sequences (obs [B, T1, ...], action, reward, done, first [B, T1], core [B, S]; where given,
        trunc_row [B] and final_obs [B, ...], else no time limit); returns their slots. Without ``priorities`` they get the largest priority seen so far, so each is sampled soon."""
        n = len(seqs["action"])
        slots = (self.next + np.arange(n)) % self.capacity
        for name in ("obs", "action", "reward", "done", "first", "core"):
            getattr(self, name)[slots] = seqs[name]
        if "trunc_row" in seqs:
            self.trunc_row[slots] = seqs["trunc_row"]
            self.final_obs[slots] = seqs["final_obs"]
        else:
            self.trunc_row[slots] = -1
        if "q" in seqs and self.q.shape[-1]:
            self.q[slots] = seqs["q"]
        self.generation[slots] += 1
        p = np.full(n, self.max_priority) if priorities is None else np.asarray(priorities, dtype=np.float64)
        self.sampler.update(slots, p)
        self.max_priority = max(self.max_priority, float(p.max(initial=0.0)))
        self.next = int((self.next + n) % self.capacity)
        self.filled = min(self.capacity, self.filled + n)
        self.inserted += n
        return slots

    def sample(self, batch: int, beta: float = 0.6) -> tuple[np.ndarray, torch.Tensor, dict[str, torch.Tensor]]:
        """(slots, importance weights [B], the sequences time-major: [T1, B, ...], core [B, S], trunc_row [B],
        final_obs [B, ...]); ``out["generation"]``
        identifies the sequences for ``update_priorities`` (a slot overwritten meanwhile keeps its own)."""
        slots, w = self.sampler.sample(batch, beta)
        self.sampled += batch
        out = {name: torch.from_numpy(np.ascontiguousarray(np.swapaxes(getattr(self, name)[slots], 0, 1)))
               for name in ("obs", "action", "reward", "done", "first")}
        out["core"] = torch.from_numpy(self.core[slots])
        out["trunc_row"] = torch.from_numpy(self.trunc_row[slots])
        out["final_obs"] = torch.from_numpy(self.final_obs[slots])
        if self.q.shape[-1]:
            out["q"] = torch.from_numpy(np.ascontiguousarray(np.swapaxes(self.q[slots], 0, 1)))
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


class Piece(NamedTuple):
    """One env's share of one unroll, as the assembler chains them: its number, its T + 1 observations, and rows
    0..T-1 of its actions, rewards, cuts (done or time limit), the Q-values acted by; the state row 0 started
    from; the time limits inside it (row, the episode's last observation)."""

    unroll: int
    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    cut: np.ndarray
    core: np.ndarray
    q: np.ndarray
    limits: list


class SequenceAssembler:
    """Sequences of ``units`` consecutive unrolls of one env: each new unroll of an env completes the sequence made
    of it and the ``units - 1`` before it (so consecutive sequences overlap by all but one unroll, as R2D2's replay
    period). A sequence holds rows 0..T-1 of each unroll and the last one's bootstrap row T (``units`` x T + 1 rows),
    and the state its first unroll started from. An env is known by (client, column): the env group that filled
    the buffer and the env's place in it; unrolls are chained only where their numbers follow on (an actor restart
    or an unroll lost starts a new chain: a restarted actor numbers its unrolls from a new base, see
    ``actor.unroll_base``)."""

    def __init__(self, units: int):
        self.units = units
        self.chains: dict[tuple[int, int], deque] = {}

    def add(self, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray] | None:
        obs, action = batch["obs"].numpy(), batch["action"].numpy()
        reward = batch["reward"].numpy()
        truncated = batch["truncated"].numpy()
        cut = batch["done"].numpy() | truncated  # a time limit also ends the trace (and its return bootstraps)
        final_obs = batch.get("final_obs")
        core = batch["core"].numpy()
        q = batch["q"].numpy()  # the Q-values each action was chosen by
        clients, unrolls = batch["client"].tolist(), batch["unroll"].tolist()
        n_buf = len(clients)
        k = action.shape[1] // n_buf
        out: list[list] = []
        for i in range(n_buf):  # (in the order they were filled: the runners deliver each group's unrolls in order)
            for e in range(k):
                col = i * k + e
                key = (clients[i], e)
                limit = np.flatnonzero(truncated[:-1, col]) if final_obs is not None else np.zeros(0, np.int64)
                piece = Piece(unrolls[i], obs[:, col].copy(), action[:-1, col].copy(), reward[:-1, col].copy(),
                              cut[:-1, col].copy(), core[col].copy(), q[:-1, col].copy(),
                              [(int(r), final_obs[r, col].numpy().copy()) for r in limit]
                              if final_obs is not None else [])
                chain = self.chains.get(key)
                if chain is None or chain[-1].unroll + 1 != piece.unroll:
                    chain = self.chains[key] = deque(maxlen=self.units)
                chain.append(piece)
                if len(chain) == self.units:
                    out.append(list(chain))
        if not out:
            return None
        return self._stack(out)

    @staticmethod
    def _stack(seqs: list[list[Piece]]) -> dict[str, np.ndarray]:
        def rows(name: str, last=None) -> np.ndarray:
            parts = [[getattr(p, name) if name != "obs" else p.obs[:-1] for p in s] for s in seqs]
            x = np.stack([np.concatenate(ps) for ps in parts])  # [B, units*T, ...]
            if last is None:  # the bootstrap row: the last unroll's row T
                return np.concatenate([x, np.stack([s[-1].obs[-1:] for s in seqs])], axis=1)
            return np.concatenate([x, np.full((x.shape[0], 1, *x.shape[2:]), last, dtype=x.dtype)], axis=1)

        obs = rows("obs")
        action, reward, cut, q = rows("action", 0), rows("reward", 0), rows("cut", False), rows("q", 0.0)
        first = np.zeros_like(cut)
        first[:, 1:] = cut[:, :-1]  # (the rule the actors reset their states by)
        # A time limit's row and last observation: the last one in the sequence (the loss is taken on its end; one
        # is the most a sequence meets unless episodes are shorter than it: any earlier one then ends like a terminal)
        t = len(seqs[0][0].action)
        trunc_row = np.full(len(seqs), -1, dtype=np.int64)
        final_obs = np.zeros((len(seqs), *obs.shape[2:]), dtype=obs.dtype)
        for j, s in enumerate(seqs):
            limits = [(u * t + r, o) for u, p in enumerate(s) for r, o in p.limits]
            if limits:
                trunc_row[j], final_obs[j] = limits[-1]
        return {"obs": obs, "action": action, "reward": reward, "done": cut, "first": first, "q": q,
                "core": np.stack([s[0].core for s in seqs]), "trunc_row": trunc_row, "final_obs": final_obs}
