"""CartPole learns, with a fixed budget of environment steps (no wall-clock assertion).

Must show (issue 2): mean return over the last 100 episodes >= 400 within 500k steps, with central
inference and with actor-side inference; serial and parallel modes give the same curve shape.

The 400 test runs the serial runner (the same Rollout, policies, model and Learner as the parallel one,
in one process), so it is deterministic for a seed; the parallel runner's learning, whose timing makes
every run differ, is held to the serial curve's shape below.
"""

import statistics

import pytest

from rlbalance.bench.seeds import learning_curve
from rlbalance.runtime.train import train

BUDGET = 500_000


def _first_crossing(curve, level):
    return next((s for s, r in curve if r >= level), None)


# Actor-side inference gains nothing from double-buffered env groups (the policy runs in the actor),
# and a short buffer queue keeps its policy lag low: one group, two buffers per actor.
MODES = {"central": {}, "actor": {"actors": {"env_groups": 1, "buffers_per_actor": 2}}}


@pytest.mark.slow
@pytest.mark.parametrize("inference", list(MODES))
def test_cartpole_reaches_400_within_500k_steps(cfg_factory, inference):
    cfg = cfg_factory(inference={"mode": inference}, run={"total_steps": BUDGET, "name": inference, "mode": "serial"},
                      telemetry={"tensorboard": False}, **MODES[inference])
    s = train(cfg)
    curve = learning_curve(s["run_dir"])
    best = max(r for _, r in curve)
    assert s["steps"] <= BUDGET + cfg.learner.batch_size * cfg.learner.unroll_length  # rounded up to one batch
    assert best >= 400, f"{inference}: best mean return (last 100 episodes) {best:.1f} < 400; curve {curve}"


@pytest.mark.slow
def test_serial_and_parallel_learn_alike(cfg_factory):
    curves = {}
    for mode in ("serial", "parallel"):
        s = train(cfg_factory(run={"total_steps": 300_000, "name": f"shape-{mode}", "mode": mode, "seed": 3},
                              telemetry={"tensorboard": False, "log_interval_s": 0.2}))
        curves[mode] = learning_curve(s["run_dir"])
    for mode, c in curves.items():
        early = [r for st, r in c if st <= 5_000] or [c[0][1]]  # the first few updates: near random play
        late = [r for st, r in c if st >= 250_000]
        # the same shape: low at first, then up by a large factor
        assert max(early) < 100, (mode, c)
        assert statistics.mean(late) > 3 * statistics.mean(early), (mode, c)
    # and at a similar pace: the steps each takes to reach a return of 100, 150, ..., 450, on average, within 2x of
    # each other. One level alone is brittle: a parallel run once reached 148 at 31k steps, dipped to 130 and crossed
    # 150 only at 56k (2.3x the serial run's 25k), though it reached 250 and 400 as soon as the serial run did.
    levels = range(100, 451, 50)
    cross = {m: [_first_crossing(c, level) for level in levels] for m, c in curves.items()}
    assert all(None not in xs for xs in cross.values()), cross
    pace = {m: statistics.mean(xs) for m, xs in cross.items()}
    assert max(pace.values()) <= 2 * min(pace.values()), (pace, cross)


@pytest.mark.slow
def test_cnn_policy_learns_from_pixels(cfg_factory):
    """The Nature CNN learns rlbalance/Catch-v0 from 40x40 images (random play: about -0.6, perfect: +1) in
    150k steps, serial (deterministic for a seed). Beside the Pong smoke test, this is the CI-sized proof
    that the whole pixel path learns: uint8 frames, the CNN, V-trace over unrolls."""
    s = train(cfg_factory(env={"id": "rlbalance/Catch-v0"}, run={"total_steps": 150_000, "mode": "serial",
                                                                  "name": "catch"},
                          telemetry={"tensorboard": False}))
    assert s["model"] == "nature_cnn"
    curve = learning_curve(s["run_dir"])
    early = [r for st, r in curve if st <= 20_000]
    assert early and max(early) < 0.0, curve  # it starts near random play
    assert s["episode_return_best100"] >= 0.8, curve
    assert s["episode_return_last100"] >= 0.6, curve


def test_serial_runs_are_bit_identical_for_a_seed(cfg_factory):
    """The reproducibility the README promises: serial mode with a seed gives the same weights, the same
    episodes and the same returns, run after run (parallel runs differ with the processes' timing)."""
    from pathlib import Path

    import torch

    runs = []
    for name in ("a", "b"):
        s = train(cfg_factory(run={"total_steps": 20_000, "mode": "serial", "seed": 5, "name": name},
                              telemetry={"tensorboard": False}))
        last = sorted((Path(s["run_dir"]) / "checkpoints").glob("ckpt-*.pt"))[-1]
        runs.append((s, torch.load(last, map_location="cpu", weights_only=True)))
    (sa, ca), (sb, cb) = runs
    assert (sa["steps"], sa["episodes"], sa["episode_return_last100"]) == \
        (sb["steps"], sb["episodes"], sb["episode_return_last100"])
    model_a, model_b = ca["model"], cb["model"]
    assert model_a.keys() == model_b.keys()
    assert all(torch.equal(model_a[k], model_b[k]) for k in model_a)
