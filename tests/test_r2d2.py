"""R2D2's algorithm pieces (rlbalance.agents.r2d2) against slow references written from the paper."""

import math

import numpy as np
import pytest
import torch

from rlbalance.agents.r2d2 import (PrioritySampler, epsilon_ladder, inverse_rescale, n_step_double_q_targets, rescale,
                                   sequence_priorities)


def _h(x, eps=1e-3):
    return math.copysign(math.sqrt(abs(x) + 1) - 1, x) + eps * x


def _h_inv(y, eps=1e-3):  # by bisection on the monotone h: independent of the closed form under test
    lo, hi = -1e7, 1e7
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _h(mid, eps) < y else (lo, mid)
    return (lo + hi) / 2


def test_rescaling_is_the_papers_function_and_its_inverse():
    x = torch.tensor([-1e4, -37.5, -1.0, -1e-3, 0.0, 2e-3, 0.7, 21.0, 5e3], dtype=torch.float64)
    assert torch.allclose(rescale(x), torch.tensor([_h(v) for v in x.tolist()], dtype=torch.float64))
    y = rescale(x)
    assert torch.allclose(inverse_rescale(y), x, rtol=1e-9, atol=1e-9)
    assert torch.allclose(inverse_rescale(y), torch.tensor([_h_inv(v) for v in y.tolist()], dtype=torch.float64),
                          rtol=1e-6, atol=1e-6)


def _slow_targets(q_on, q_tg, r, d, gamma, n):
    t1, b, _ = q_on.shape
    out = np.zeros((t1 - n, b))
    for bi in range(b):
        for t in range(t1 - n):
            g, ended = 0.0, False
            for k in range(n):
                g += gamma ** k * r[t + k, bi]
                if d[t + k, bi]:
                    ended = True
                    break
            if not ended:
                a_star = int(np.argmax(q_on[t + n, bi]))
                g += gamma ** n * _h_inv(q_tg[t + n, bi, a_star])
            out[t, bi] = _h(g)
    return out


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_double_q_targets_match_a_slow_reference(n):
    rng = np.random.default_rng(n)
    t1, b, a = 12, 4, 3
    q_on, q_tg = rng.normal(0, 3, (t1, b, a)), rng.normal(0, 3, (t1, b, a))
    r = rng.normal(0, 1, (t1, b))
    d = rng.random((t1, b)) < 0.15
    d[2, 0] = True  # an episode end inside the first sequence's first n steps
    got = n_step_double_q_targets(torch.tensor(q_on), torch.tensor(q_tg), torch.tensor(r), torch.tensor(d), 0.997, n)
    assert got.shape == (t1 - n, b)
    assert np.allclose(got.numpy(), _slow_targets(q_on, q_tg, r, d, 0.997, n), atol=1e-6)
    with pytest.raises(ValueError, match="no row"):
        n_step_double_q_targets(torch.tensor(q_on[:n]), torch.tensor(q_tg[:n]), torch.tensor(r[:n]),
                                torch.tensor(d[:n]), 0.99, n)


def test_double_q_takes_the_online_nets_action_and_the_target_nets_value():
    q_on = torch.zeros(2, 1, 2)
    q_tg = torch.zeros(2, 1, 2)
    q_on[1, 0] = torch.tensor([0.0, 1.0])  # online prefers action 1
    q_tg[1, 0] = torch.tensor([rescale(torch.tensor(50.0)).item(), rescale(torch.tensor(2.0)).item()])
    y = n_step_double_q_targets(q_on, q_tg, torch.zeros(2, 1), torch.zeros(2, 1, dtype=torch.bool), 0.5, 1)
    assert y.item() == pytest.approx(rescale(torch.tensor(1.0)).item(), rel=1e-5)  # 0.5 x 2, not 0.5 x 50


def test_sequence_priorities_mix_max_and_mean():
    td = torch.tensor([[1.0, -2.0], [-3.0, 0.0], [2.0, 2.0]])
    assert torch.allclose(sequence_priorities(td, 0.9), torch.tensor([0.9 * 3 + 0.1 * 2, 0.9 * 2 + 0.1 * 4 / 3]))


def test_priority_sampler_draws_in_proportion_and_weights_by_importance():
    s = PrioritySampler(10, alpha=0.5, seed=0)
    s.update(np.arange(5), np.array([1.0, 4.0, 9.0, 0.0, 16.0]))  # p^0.5: 1, 2, 3, 0, 4 of 10
    s.update(np.array([0]), np.array([1.0]))  # an update in place
    draws = np.concatenate([s.sample(64)[0] for _ in range(400)])
    freq = np.bincount(draws, minlength=10) / draws.size
    assert np.allclose(freq[[0, 1, 2, 4]], [0.1, 0.2, 0.3, 0.4], atol=0.02)
    assert freq[3] == 0 and freq[5:].sum() == 0  # empty slots and priority 0 are never drawn
    slots, w = s.sample(8, beta=1.0)
    expected = 1.0 / (4 * s.probability(slots))  # (N P)^-1 with 4 filled slots, normalised by the max
    assert np.allclose(w, expected / expected.max())
    s.update(np.arange(5), np.zeros(5))
    with pytest.raises(ValueError, match="nothing to sample"):
        s.sample(1)
    with pytest.raises(IndexError):
        s.update(np.array([10]), np.array([1.0]))


def test_epsilon_ladder_runs_from_0_4_to_0_4_to_the_8th():
    e = epsilon_ladder(8)
    assert e[0] == pytest.approx(0.4) and e[-1] == pytest.approx(0.4 ** 8)
    assert np.all(np.diff(e) < 0) and epsilon_ladder(1).tolist() == [0.4]
