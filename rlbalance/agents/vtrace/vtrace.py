"""V-trace off-policy targets (Espeholt et al. 2018, "IMPALA", section 4.1), batched in torch.

All tensors are time-major, shaped [T, N]. ``discounts[t]`` is gamma * (1 - done[t]) for the
transition x_t -> x_{t+1}; ``bootstrap_value`` is V(x_T), shaped [N]. ``lambda_`` is the paper's
remark 2 (section 4.1): the trace coefficients c_s become lambda * min(c-bar, rho_s), which trades
bias for variance as GAE's lambda does (lambda = 1 is plain V-trace).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class VTraceReturns(NamedTuple):
    vs: torch.Tensor  # v_s targets for the value function, [T, N]
    pg_advantages: torch.Tensor  # rho_s (r_s + gamma v_{s+1} - V(x_s)), [T, N]
    advantages: torch.Tensor  # the same without the rho_s weight, for a clipped-ratio (PPO) surrogate


@torch.no_grad()
def vtrace(log_rhos: torch.Tensor, discounts: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
           bootstrap_value: torch.Tensor, clip_rho: float = 1.0, clip_c: float = 1.0,
           clip_pg_rho: float = 1.0, lambda_: float = 1.0) -> VTraceReturns:
    rhos = torch.exp(log_rhos)
    clipped_rhos = torch.clamp(rhos, max=clip_rho)
    cs = lambda_ * torch.clamp(rhos, max=clip_c)
    values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)
    # v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1})), computed backwards.
    acc = torch.zeros_like(bootstrap_value)
    out = []
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        out.append(acc)
    vs_minus_v = torch.stack(out[::-1], dim=0)
    vs = vs_minus_v + values
    vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    advantages = rewards + discounts * vs_tp1 - values
    pg_rhos = torch.clamp(rhos, max=clip_pg_rho)
    return VTraceReturns(vs, pg_rhos * advantages, advantages)
