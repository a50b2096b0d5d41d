"""One R2D2 update on a batch of stored sequences (the algorithm; no processes, no replay)."""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass

import torch

from rlbalance.agents.nets import batch_to, clear_grads, clip_grads, make_adam
from rlbalance.agents.r2d2.algo import RESCALE_EPS, inverse_rescale, n_step_double_q_targets, sequence_priorities
from rlbalance.agents.r2d2.net import R2D2Net
from rlbalance.core.distributed import all_max
from rlbalance.core.errors import NonFiniteLossError


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


class R2D2Learner:
    """One R2D2 update on a batch of stored sequences: burn-in (online and target nets from the stored start
    state, no gradient), n-step double-Q targets with the value rescaling, a TD loss weighted by the replay's
    importance weights, new priorities for the sampled sequences, and the target net copied every
    ``target_update_every`` updates."""

    def __init__(self, net: R2D2Net, settings: R2D2Settings = R2D2Settings(), device: torch.device | str = "cpu",
                 step_lock=None, distributed: bool = False):
        self.s, self.device = settings, torch.device(device)
        # held around the optimizer step: an inference pass beside the learner never sees half-updated weights
        self.step_lock = step_lock or contextlib.nullcontext()
        self.net = net.to(self.device)
        # One learner process per device: the pass with gradients goes through DistributedDataParallel, whose backward
        # averages the gradients, so every rank takes the same step (the passes without gradients use the net itself)
        self.train_net: torch.nn.Module = self.net
        self.distributed = distributed
        if distributed:
            from torch.nn.parallel import DistributedDataParallel

            self.train_net = DistributedDataParallel(self.net, device_ids=[self.device] if self.device.type == "cuda"
                                                     else None, forward_sync_buffers=False)
        self.target = copy.deepcopy(self.net).requires_grad_(False)  # (after DDP gave every rank rank 0's weights)
        self.params = list(self.net.parameters())
        self.optimizer = make_adam(self.params, settings.learning_rate, settings.adam_eps, self.device)
        self.updates = 0

    def train(self, batch: dict[str, torch.Tensor], weights: torch.Tensor | None = None) -> dict:
        """``batch``: obs [T1, B, ...], action, reward, done, first [T1, B], core [B, 2H] (the state row 0 started
        from), and where the replay gives them trunc_row [B] and final_obs [B, ...] (a time limit's row, -1 for none,
        and the episode's last observation there). ``weights`` [B]: importance weights (None: 1). Returns the loss
        figures and ``priorities`` [B]."""
        s = self.s
        t0 = time.perf_counter()
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
        q, st_rows = self.train_net(rest["obs"], state_on, rest["first"])
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
        finite = bool(torch.isfinite(loss))
        if self.distributed and all_max(0.0 if finite else 1.0, self.device) > 0 and finite:
            raise NonFiniteLossError(f"the R2D2 loss is not finite on another learner rank at update {self.updates} "
                                     "(that rank's error names the cause); training stopped on every rank")
        if not finite:
            raise NonFiniteLossError(f"the R2D2 loss is {float(loss)} at update {self.updates}: the learning diverged "
                                     "or the env returned NaN rewards or observations; check the env, then lower "
                                     "learner.learning_rate or learner.max_grad_norm")
        clear_grads(self.params)
        loss.backward()
        grad_norm = clip_grads(self.params, s.max_grad_norm)
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
