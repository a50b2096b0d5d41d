"""R2D2's algorithm pieces (Kapturowski et al., "Recurrent Experience Replay in Distributed Reinforcement
Learning", ICLR 2019; the defaults are the paper's and SEED RL's Atari settings).

- ``rescale`` / ``inverse_rescale``: h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x and its exact inverse (Pohlen et al.
  2018), so Q-learning sees values of a bounded scale without reward clipping.
- ``n_step_double_q_targets``: y_t = h(sum_{k<n} gamma^k r_{t+k} + gamma^n h^-1(Q_target(s_{t+n}, argmax_a
  Q_online(s_{t+n}, a)))), the sum cut where the episode ends within the n steps: with no bootstrap at a terminal
  state, and at a time limit with the discounted double-Q value of the episode's last observation.
- ``sequence_priorities``: eta max_t |delta_t| + (1 - eta) mean_t |delta_t| per sequence (eta 0.9).
- ``PrioritySampler``: proportional prioritised sampling (priority ** alpha) over a sum tree, with importance
  weights (N P(i)) ** -beta normalised by their maximum over the batch.
- ``epsilon_ladder``: the per-actor exploration rates of Ape-X/R2D2, eps_i = 0.4 ** (1 + 7 i / (N - 1)).
- ``R2D2Net`` (torso, LSTM, dueling head; epsilon-greedy ``act``) and ``R2D2Learner`` (burn-in, targets, the
  importance-weighted TD loss, new priorities, the target net's copies).
- ``SequenceAssembler`` and ``R2D2Agent``: what the runners call (the V-trace ``Learner``'s interface): batches of
  unrolls in, sequences of consecutive unrolls per env into the replay, gradient steps at the asked replay ratio.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rlbalance.metrics import EpisodeStats
from rlbalance.model import lstm_sequence, lstm_step, run_torso, scaled_input

RESCALE_EPS = 1e-3
GREEDY_EPSILON = 0.01  # envs exploring at most this often count as the near-greedy ones (their returns apart)


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
            ret = ret + alive * truncated[k:k + t].to(ret.dtype) * (discount ** (k + 1)) * final_value[k:k + t]
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


def env_epsilons(cfg) -> np.ndarray:
    """Each env's exploration rate in a run [clients, K]: the ladder over all the run's envs, in client order."""
    k = cfg.actors.envs_per_actor
    return epsilon_ladder(cfg.num_clients * k, cfg.r2d2.epsilon_base, cfg.r2d2.epsilon_alpha).reshape(-1, k)


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

    recurrent = True  # (the runners' test for a policy that carries a state per env)

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, hidden_sizes: tuple[int, ...] = (64, 64),
                 core_size: int = 128, cnn: bool | None = None):
        super().__init__()
        from rlbalance.distributions import ActionSpec
        from rlbalance.model import _mlp, _nature_cnn

        self.cnn = len(obs_shape) == 3 if cnn is None else cnn
        if self.cnn:
            self.torso, out = _nature_cnn(obs_shape[0], obs_shape[1])
        else:
            self.torso, out = _mlp(int(np.prod(obs_shape)), hidden_sizes), hidden_sizes[-1]
        # core_size 0: no LSTM (a feed-forward Q-network on the same sequence replay: the memory task's control)
        self.core = nn.LSTMCell(out, core_size) if core_size else None
        self.torso_precision = "fp32"  # learner.torso_precision (build_model sets it): see run_torso
        head_in = core_size or out
        self.core_size, self.num_actions = core_size, num_actions
        self.state_size = 2 * core_size
        # What the buffers' "logits" rows hold for this agent: the Q-values of the step (a Discrete space's
        # parameters, so evaluation's greedy action, the mode, is argmax Q).
        self.action = ActionSpec.discrete(num_actions)
        self.value = nn.Linear(head_in, 1)
        self.advantage = nn.Linear(head_in, num_actions)

    def initial_state(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(n, 2 * self.core_size, device=device)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        return run_torso(self.torso, scaled_input(obs), self.torso_precision)

    def _step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.core is None:
            h, state = x, state
        else:
            h, state = lstm_step(self.core, x, state)
        return self._head(h), state

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(dim=-1, keepdim=True)

    def forward(self, obs: torch.Tensor, state0: torch.Tensor, first: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-values [T1, B, A] and the state after each row [T1, B, 2H]; row 0's ``first`` is ignored (``state0``
        is the state row 0 starts from, as recorded)."""
        t1, b = obs.shape[:2]
        x = self._features(obs.reshape(t1 * b, *obs.shape[2:])).reshape(t1, b, -1)
        keep = (~first).to(state0.dtype)
        if self.core is None:
            return self._head(x), state0.expand(t1, *state0.shape)
        h, states = lstm_sequence(self.core, x, state0, keep)
        return self._head(h), states

    @torch.inference_mode()
    def act_recurrent(self, obs: torch.Tensor, state: torch.Tensor, first: torch.Tensor,
                      generator: torch.Generator | None = None, epsilon: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Epsilon-greedy actions for N envs (``epsilon`` [N], each env's own rate; None: greedy), as the runners
        call a recurrent policy. Returns (actions, Q-values, the state the step started from (reset where
        ``first``), the state after it)."""
        state_in = state * (~first).to(state.dtype).view(-1, 1)
        q, state_out = self._step(self._features(obs), state_in)
        actions = q.argmax(dim=-1)
        if epsilon is not None:
            explore = torch.rand(q.shape[0], generator=generator, device=q.device) < epsilon
            random = torch.randint(0, self.num_actions, (q.shape[0],), generator=generator, device=q.device)
            actions = torch.where(explore, random, actions)
        return actions, q, state_in, state_out

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy actions from an episode's start state (what a profile or calibration times: one step's forward)."""
        first = torch.ones(obs.shape[0], dtype=torch.bool, device=obs.device)
        actions, q, _, _ = self.act_recurrent(obs, self.initial_state(obs.shape[0], obs.device), first, generator)
        return actions, q


class R2D2Learner:
    """One R2D2 update on a batch of stored sequences: burn-in (online and target nets from the stored start
    state, no gradient), n-step double-Q targets with the value rescaling, a TD loss weighted by the replay's
    importance weights, new priorities for the sampled sequences, and the target net copied every
    ``target_update_every`` updates."""

    def __init__(self, net: R2D2Net, settings: R2D2Settings = R2D2Settings(), device: torch.device | str = "cpu",
                 step_lock=None):
        import contextlib
        import copy

        self.s, self.device = settings, torch.device(device)
        # held around the optimizer step: an inference pass beside the learner never sees half-updated weights
        self.step_lock = step_lock or contextlib.nullcontext()
        self.net = net.to(self.device)
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=settings.learning_rate, eps=settings.adam_eps)
        self.updates = 0

    def train(self, batch: dict[str, torch.Tensor], weights: torch.Tensor | None = None) -> dict:
        """``batch``: obs [T1, B, ...], action, reward, done, first [T1, B], core [B, 2H] (the state row 0 started
        from), and where the replay gives them trunc_row [B] and final_obs [B, ...] (a time limit's row, -1 for none,
        and the episode's last observation there). ``weights`` [B]: importance weights (None: 1). Returns the loss
        figures and ``priorities`` [B]."""
        s = self.s
        t0 = time.perf_counter()
        from rlbalance.learner import batch_to

        b = batch_to(batch, self.device)
        t1 = time.perf_counter()
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
        q, st_rows = self.net(rest["obs"], state_on, rest["first"])
        with torch.no_grad():
            q_tg, st_tg_rows = self.target(rest["obs"], state_tg, rest["first"])
            truncated, final_value = self._time_limits(b, burn, st_rows.detach(), st_tg_rows)
            y = n_step_double_q_targets(q.detach(), q_tg, rest["reward"].float(), rest["done"], s.discount,
                                        s.n_step, s.rescale_eps, truncated, final_value)
        t = y.shape[0]
        q_taken = q[:t].gather(-1, rest["action"][:t].long().unsqueeze(-1)).squeeze(-1)
        td = y - q_taken
        per_seq = 0.5 * (td ** 2).mean(dim=0)
        w = torch.ones_like(per_seq) if weights is None else weights.to(self.device, per_seq.dtype)
        loss = (w * per_seq).mean()
        if not torch.isfinite(loss):
            from rlbalance.learner import NonFiniteLossError

            raise NonFiniteLossError(f"the R2D2 loss is {float(loss)} at update {self.updates}: the learning diverged "
                                     "or the env returned NaN rewards or observations; check the env, then lower "
                                     "learner.learning_rate or learner.max_grad_norm")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), s.max_grad_norm)
        t2 = time.perf_counter()
        with self.step_lock:
            self.optimizer.step()
        self.updates += 1
        if self.updates % s.target_update_every == 0:
            self.target.load_state_dict(self.net.state_dict())
        td = td.detach()
        out = {"loss": float(loss.detach()), "grad_norm": float(grad_norm), "q_mean": float(q_taken.detach().mean()),
               "td_abs": float(td.abs().mean()), "priorities": sequence_priorities(td, s.priority_eta).cpu()}
        if "q" in b:  # |Q learner - Q the actors acted by| over the learned rows: float noise at still weights
            out["q_gap"] = float((q[:-1].detach() - b["q"][burn:-1]).abs().mean())
        out.update(time_h2d=t1 - t0, time_fwd_bwd=t2 - t1, time_optim=time.perf_counter() - t2)
        return out


    def _time_limits(self, b: dict[str, torch.Tensor], burn: int, st_on: torch.Tensor, st_tg: torch.Tensor
                     ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Where a sequence's episode was cut by a time limit after the burn-in (its ``trunc_row``; -1: none), the
        double-Q value of its last observation (``final_obs``), from the state the nets had after that row: the
        (unrescaled) value the n-step return bootstraps from there. (None, None) where no sampled sequence has one."""
        rows = b.get("trunc_row")
        if rows is None:
            return None, None
        rows = rows.long() - burn
        sel = (rows >= 0).nonzero().squeeze(-1)
        if sel.numel() == 0:
            return None, None
        r = rows[sel]
        obs = b["final_obs"][sel]
        q_on, _ = self.net._step(self.net._features(obs), st_on[r, sel])
        q_tg, _ = self.target._step(self.target._features(obs), st_tg[r, sel])
        value = inverse_rescale(q_tg.gather(-1, q_on.argmax(dim=-1, keepdim=True)).squeeze(-1), self.s.rescale_eps)
        t_rest, n_seq = st_on.shape[:2]
        truncated = torch.zeros(t_rest, n_seq, dtype=torch.bool, device=st_on.device)
        final_value = torch.zeros(t_rest, n_seq, dtype=value.dtype, device=st_on.device)
        truncated[r, sel] = True
        final_value[r, sel] = value
        return truncated, final_value


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

        from rlbalance.config import ConfigError

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


# -- what the runners call --------------------------------------------------------------------------------------

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
        q = batch["logits"].numpy()  # the Q-values each action was chosen by
        clients, unrolls = batch["client"].tolist(), batch["unroll"].tolist()
        n_buf = len(clients)
        k = action.shape[1] // n_buf
        out: list[list] = []
        for i in range(n_buf):  # (in the order they were filled: the runners deliver each group's unrolls in order)
            for e in range(k):
                col = i * k + e
                key = (clients[i], e)
                limit = np.flatnonzero(truncated[:-1, col]) if final_obs is not None else np.zeros(0, np.int64)
                piece = (unrolls[i], obs[:, col].copy(), action[:-1, col].copy(), reward[:-1, col].copy(),
                         cut[:-1, col].copy(), core[col].copy(), q[:-1, col].copy(),
                         [(int(r), final_obs[r, col].numpy().copy()) for r in limit])
                chain = self.chains.get(key)
                if chain is None or chain[-1][0] + 1 != piece[0]:
                    chain = self.chains[key] = deque(maxlen=self.units)
                chain.append(piece)
                if len(chain) == self.units:
                    out.append(list(chain))
        if not out:
            return None
        return self._stack(out)

    @staticmethod
    def _stack(seqs: list[list]) -> dict[str, np.ndarray]:
        def rows(j: int, last=None) -> np.ndarray:
            parts = [[p[j] if j != 1 else p[1][:-1] for p in s] for s in seqs]
            x = np.stack([np.concatenate(ps) for ps in parts])  # [B, units*T, ...]
            if last is None:  # the bootstrap row: the last unroll's row T
                return np.concatenate([x, np.stack([s[-1][1][-1:] for s in seqs])], axis=1)
            return np.concatenate([x, np.full((x.shape[0], 1, *x.shape[2:]), last, dtype=x.dtype)], axis=1)

        obs = rows(1)
        action, reward, cut, q = rows(2, 0), rows(3, 0), rows(4, False), rows(6, 0.0)
        first = np.zeros_like(cut)
        first[:, 1:] = cut[:, :-1]  # (the rule the actors reset their states by)
        # A time limit's row and last observation: the last one in the sequence (the loss is taken on its end; one
        # is the most a sequence meets unless episodes are shorter than it: any earlier one then ends like a terminal)
        t = len(seqs[0][0][2])
        trunc_row = np.full(len(seqs), -1, dtype=np.int64)
        final_obs = np.zeros((len(seqs), *obs.shape[2:]), dtype=obs.dtype)
        for j, s in enumerate(seqs):
            limits = [(u * t + r, o) for u, p in enumerate(s) for r, o in p[7]]
            if limits:
                trunc_row[j], final_obs[j] = limits[-1]
        return {"obs": obs, "action": action, "reward": reward, "done": cut, "first": first, "q": q,
                "core": np.stack([s[0][5] for s in seqs]), "trunc_row": trunc_row, "final_obs": final_obs}


class R2D2Agent:
    """R2D2 behind the V-trace ``Learner``'s interface (``train(batch)``, ``updates``, ``steps``, ``model``,
    ``state_dict``): each batch of unrolls becomes sequences in the replay; then gradient steps on prioritised
    samples until the replay ratio asked for (r2d2.replay_ratio sequences sampled per sequence inserted, counted
    from r2d2.learning_starts) is met. The learner takes its next batch of unrolls only after those steps, so where
    it is slower the actors run out of free buffers and wait: the ratio holds and what it costs shows up as a
    learner-bound run."""

    def __init__(self, model: R2D2Net, cfg, device: torch.device, obs_shape: tuple[int, ...], obs_dtype,
                 step_lock=None):
        lc, r = cfg.learner, cfg.r2d2
        self.cfg, self.r = cfg, r
        settings = R2D2Settings(discount=lc.discount, n_step=r.n_step, burn_in=r.burn_in,
                                learning_rate=lc.learning_rate, adam_eps=lc.adam_eps, max_grad_norm=lc.max_grad_norm,
                                target_update_every=r.target_update_every, priority_eta=r.priority_eta,
                                rescale_eps=r.rescale_eps)
        self.algo = R2D2Learner(model, settings, device, step_lock)
        self.model, self.device, self.optimizer = self.algo.net, self.algo.device, self.algo.optimizer
        units = (r.burn_in + r.sequence_length) // lc.unroll_length
        self.assembler = SequenceAssembler(units)
        self.replay = SequenceReplay(r.replay_size, r.rows, obs_shape, obs_dtype,
                                     model.state_size, alpha=r.priority_exponent, seed=cfg.run.seed,
                                     field="r2d2.replay_size", num_actions=model.num_actions)
        self.steps = 0
        self.last: dict[str, float] = {}
        self.totals = {"insert_s": 0.0, "sample_s": 0.0, "priority_s": 0.0}
        # The episodes of the envs that explore least (epsilon <= GREEDY_EPSILON on the ladder): the reported return
        # mixes in envs acting at random up to r2d2.epsilon_base of the time, which understates the policy
        self.env_epsilon = env_epsilons(cfg)
        self.greedy_episodes = EpisodeStats()

    @property
    def updates(self) -> int:
        return self.algo.updates

    def lr_now(self) -> float:
        lr = self.algo.s.learning_rate
        if self.cfg.learner.lr_schedule == "constant":
            return lr
        return lr * max(0.0, 1.0 - self.steps / self.cfg.run.total_steps)

    def _rewards(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        lc = self.cfg.learner
        if lc.reward_scale == 1.0 and not lc.reward_clip:
            return batch
        r = batch["reward"] * lc.reward_scale
        if lc.reward_clip:
            r = r.clamp(-lc.reward_clip, lc.reward_clip)
        return {**batch, "reward": r}

    def sample_sequences(self, batch_size: int | None = None) -> dict[str, torch.Tensor]:
        """A batch of sequences shaped as the replay gives them (zeros where the replay is still empty): what a
        profile times one gradient step on."""
        n = batch_size or self.r.batch_size
        rp = self.replay
        if rp.filled >= n:
            _, _, seq = rp.sample(n, self.r.importance_exponent)
            seq.pop("generation")
            return seq
        t1 = rp.seq_len
        return {"obs": torch.from_numpy(np.zeros((t1, n, *rp.obs.shape[2:]), dtype=rp.obs.dtype)),
                "action": torch.zeros(t1, n, dtype=torch.int64), "reward": torch.zeros(t1, n),
                "done": torch.zeros(t1, n, dtype=torch.bool), "first": torch.zeros(t1, n, dtype=torch.bool),
                "core": torch.zeros(n, rp.core.shape[1])}

    def timed_step(self) -> None:
        """One gradient step as a run takes it (a prioritised sample from the replay, the update, the new
        priorities), the replay first given a batch of zero sequences where it holds fewer: what calibration and the
        learner-ceiling bench time."""
        rp, n = self.replay, self.r.batch_size
        if rp.filled < n:
            z = self.sample_sequences(n)
            rp.add({k: v.numpy() if k == "core" else np.swapaxes(v.numpy(), 0, 1) for k, v in z.items()})
        slots, weights, seq = rp.sample(n, self.r.importance_exponent)
        generation = seq.pop("generation")
        out = self.algo.train(seq, weights)
        rp.update_priorities(slots, out["priorities"].numpy(), generation.numpy())

    def due(self) -> bool:
        """Whether the replay ratio asks for another gradient step now."""
        rp, r = self.replay, self.r
        return rp.filled >= r.learning_starts and rp.sampled < r.replay_ratio * (rp.inserted - r.learning_starts)

    def train(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        t0 = time.perf_counter()
        seqs = self.assembler.add(self._rewards(batch))
        if seqs is not None:
            self.replay.add(seqs)
        t1 = time.perf_counter()
        self.steps += (batch["action"].shape[0] - 1) * batch["action"].shape[1]
        self._note_greedy_episodes(batch)
        times = {"time_h2d": 0.0, "time_fwd_bwd": 0.0, "time_optim": 0.0, "time_replay_insert": t1 - t0,
                 "time_replay_sample": 0.0, "time_priority_update": 0.0}
        sums: dict[str, float] = {}
        n = 0
        while self.due():
            ta = time.perf_counter()
            slots, weights, seq = self.replay.sample(self.r.batch_size, self.r.importance_exponent)
            generation = seq.pop("generation")
            tb = time.perf_counter()
            for g in self.optimizer.param_groups:
                g["lr"] = self.lr_now()
            out = self.algo.train(seq, weights)
            tc = time.perf_counter()
            self.replay.update_priorities(slots, out.pop("priorities").numpy(), generation.numpy())
            td = time.perf_counter()
            times["time_replay_sample"] += tb - ta
            times["time_priority_update"] += td - tc
            for key in ("time_h2d", "time_fwd_bwd", "time_optim"):
                times[key] += out.pop(key)
            for key, v in out.items():
                sums[key] = sums.get(key, 0.0) + v
            n += 1
        if n:
            self.last = {k: v / n for k, v in sums.items()}
        self.totals["insert_s"] += times["time_replay_insert"]
        self.totals["sample_s"] += times["time_replay_sample"]
        self.totals["priority_s"] += times["time_priority_update"]
        rp = self.replay
        return {**self.last, **times, "lr": self.lr_now(), "grad_steps": float(n),
                "replay_fill": rp.filled / rp.capacity, "replay_ratio": rp.replay_ratio(),
                "replay_sequences": float(rp.inserted)}

    def _note_greedy_episodes(self, batch: dict[str, torch.Tensor]) -> None:
        end = batch["ep_end"][:-1].numpy()
        if not end.any():
            return
        clients = batch["client"].numpy()
        eps = self.env_epsilon[clients].reshape(-1)  # [n_buf * K]: each of the batch's columns
        self.greedy_episodes.add_from_batch(batch["ep_return"][:-1].numpy(), batch["ep_length"][:-1].numpy(),
                                            end & (eps <= GREEDY_EPSILON)[None, :])

    def replay_figures(self) -> dict:
        """For telemetry.json and the summary: what the replay did this session."""
        rp, r = self.replay, self.r
        since = rp.inserted - r.learning_starts
        return {"ratio_asked": r.replay_ratio, "ratio_achieved": rp.replay_ratio(),
                "ratio_since_learning_starts": rp.sampled / since if since > 0 else None, "inserted": rp.inserted,
                "sampled": rp.sampled, "fill": rp.filled / rp.capacity, "capacity": rp.capacity,
                "sequence_rows": rp.seq_len, "bytes": rp.bytes, "learning_starts": r.learning_starts,
                "insert_s": self.totals["insert_s"], "sample_s": self.totals["sample_s"],
                "priority_update_s": self.totals["priority_s"],
                "greedy_return_last100": self.greedy_episodes.mean_return(),
                "greedy_episodes": self.greedy_episodes.count, "greedy_epsilon_max": GREEDY_EPSILON,
                "greedy_envs": int((self.env_epsilon <= GREEDY_EPSILON).sum()),
                "note": "sequences sampled per sequence inserted; the replay's contents are not checkpointed (a "
                        "resumed run refills it, learning_starts sequences before its next gradient step)"}

    def state_dict(self) -> dict:
        a = self.algo
        return {"model": a.net.state_dict(), "target": a.target.state_dict(), "optimizer": a.optimizer.state_dict(),
                "updates": a.updates, "steps": self.steps,
                "replay_counts": {"inserted": self.replay.inserted, "sampled": self.replay.sampled}}

    def load_state_dict(self, state: dict) -> None:
        a = self.algo
        a.net.load_state_dict(state["model"])
        a.target.load_state_dict(state["target"])
        a.optimizer.load_state_dict(state["optimizer"])
        a.updates = int(state["updates"])
        self.steps = int(state["steps"])
