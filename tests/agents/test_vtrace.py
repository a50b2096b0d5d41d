"""V-trace against a slow reference written like the IMPALA paper's equations (Espeholt et al. 2018, eq. 1)."""

import numpy as np
import torch

from rlbalance.agents.vtrace.vtrace import vtrace


def reference_vtrace(log_rhos, discounts, rewards, values, bootstrap, clip_rho, clip_c, clip_pg_rho, lam=1.0):
    """v_s = V(x_s) + sum_{t=s}^{s+n-1} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t V, one s at a time."""
    T, N = rewards.shape
    rhos = np.exp(log_rhos)
    values_ext = np.concatenate([values, bootstrap[None]], axis=0)
    vs = np.zeros((T, N))
    for n in range(N):
        for s in range(T):
            total = values[s, n]
            for t in range(s, T):
                # gamma^{t-s} here is the product of per-step discounts, which encode episode ends.
                coef = 1.0
                for i in range(s, t):
                    coef *= discounts[i, n] * lam * min(clip_c, rhos[i, n])  # lam: IMPALA remark 2
                delta = min(clip_rho, rhos[t, n]) * (rewards[t, n] + discounts[t, n] * values_ext[t + 1, n]
                                                     - values_ext[t, n])
                total += coef * delta
            vs[s, n] = total
    vs_ext = np.concatenate([vs, bootstrap[None]], axis=0)
    adv = np.minimum(clip_pg_rho, rhos) * (rewards + discounts * vs_ext[1:] - values)
    return vs, adv


def _random_case(seed, T=7, N=5):
    rng = np.random.default_rng(seed)
    log_rhos = rng.normal(0, 0.8, (T, N))
    dones = rng.random((T, N)) < 0.2
    discounts = 0.9 * (1 - dones)
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    bootstrap = rng.normal(size=N)
    return log_rhos, discounts, rewards, values, bootstrap


def test_vtrace_matches_reference_with_clipping():
    for seed in range(4):
        case = _random_case(seed)
        for clips in [(1.0, 1.0, 1.0), (0.5, 2.0, 0.8), (3.0, 0.3, 10.0)]:
            ref_vs, ref_adv = reference_vtrace(*case, *clips)
            out = vtrace(*(torch.tensor(x, dtype=torch.float64) for x in case), *clips)
            np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(out.pg_advantages.numpy(), ref_adv, rtol=1e-10, atol=1e-10)


def test_on_policy_vtrace_is_n_step_bellman_target():
    # With rho = 1 everywhere and no episode end, v_s is the discounted n-step return bootstrapped on V(x_T).
    T, N, g = 6, 3, 0.95
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    bootstrap = rng.normal(size=N)
    out = vtrace(torch.zeros(T, N, dtype=torch.float64), torch.full((T, N), g, dtype=torch.float64),
                 torch.tensor(rewards), torch.tensor(values), torch.tensor(bootstrap))
    for s in range(T):
        expected = sum(g ** (t - s) * rewards[t] for t in range(s, T)) + g ** (T - s) * bootstrap
        np.testing.assert_allclose(out.vs[s].numpy(), expected, rtol=1e-10)


def test_episode_end_cuts_the_trace():
    T, N = 4, 1
    discounts = torch.tensor([[0.9], [0.0], [0.9], [0.9]], dtype=torch.float64)
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]], dtype=torch.float64)
    values = torch.zeros(T, N, dtype=torch.float64)
    out = vtrace(torch.zeros(T, N, dtype=torch.float64), discounts, rewards, values, torch.tensor([10.0],
                 dtype=torch.float64))
    # step 1 ends the episode: v_1 = r_1 and v_0 = r_0 + 0.9 r_1, nothing from after the end
    assert out.vs[1, 0].item() == 2.0
    assert abs(out.vs[0, 0].item() - (1.0 + 0.9 * 2.0)) < 1e-12



def test_vtrace_lambda_matches_reference():
    for seed in range(3):
        case = _random_case(seed)
        for lam in (1.0, 0.95, 0.5):
            ref_vs, _ = reference_vtrace(*case, 1.0, 1.0, 1.0, lam=lam)
            out = vtrace(*(torch.tensor(x, dtype=torch.float64) for x in case), lambda_=lam)
            np.testing.assert_allclose(out.vs.numpy(), ref_vs, rtol=1e-10, atol=1e-10)
