"""Recurrent policies (learner.core=lstm, issue 13): the state the actors stepped with is the state the learner
trains from, and an LSTM learns a task that needs memory where a feed-forward policy does not."""

import json

import numpy as np
import pytest
import torch

from rlbalance import config as C
from rlbalance.agents.registry import build_model
from rlbalance.envs.batch import EnvSpec

MEMORY_ENV = "rlbalance/CartPoleNoVelocity-v1"


def _metrics(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


def test_a_sequence_pass_equals_the_steps_the_policy_took_with_resets():
    """forward_sequence over an unroll (from a recorded start state, resetting where an episode starts) gives the
    policy parameters act_recurrent gave step by step, for the MLP (a value core of its own) and the CNN."""
    for spec, cfg in ((EnvSpec((3,), np.dtype(np.float32), 2, 1), C.LearnerConfig(core="lstm", core_size=8)),
                      (EnvSpec((4, 44, 44), np.dtype(np.uint8), 3, 4),
                       C.LearnerConfig(core="lstm", core_size=8, model="nature_cnn"))):
        torch.manual_seed(0)
        model = build_model(cfg, spec)
        with torch.no_grad():
            model.policy.weight.mul_(100.0)  # logits that depend strongly on the state
        t1, n = 7, 3
        obs = (torch.randint(0, 255, (t1, n, *spec.obs_shape), dtype=torch.uint8) if spec.obs_dtype == np.uint8
               else torch.randn(t1, n, *spec.obs_shape))
        first = torch.zeros(t1, n, dtype=torch.bool)
        first[3, 0] = first[5, 2] = True
        state = torch.randn(n, model.state_size)  # a state carried over from the previous unroll
        stepped, start = [], None
        for t in range(t1):
            _, out, state_in, state = model.act_recurrent(obs[t], state, first[t] if t else torch.zeros(n, dtype=bool))
            start = state_in if t == 0 else start
            stepped.append(out["logits"])
        start = start.clone()  # (a normal tensor, as the learner's batch holds)
        params, values, states = model(obs, start, first)
        assert torch.allclose(params, torch.stack(stepped), atol=1e-4)
        assert values.shape == (t1, n) and states.shape == (t1, n, model.state_size)
        assert torch.allclose(states[-1], state.clone(), atol=1e-5)
        broken = model(obs, start, torch.zeros_like(first))[0]  # without the resets the parameters differ
        assert not torch.allclose(broken[3, 0], params[3, 0], atol=1e-2)


@pytest.mark.parametrize("agent", ["vtrace", "r2d2"])
def test_a_bf16_torso_runs_in_bfloat16_and_hands_float32_features_to_the_core(agent):
    """learner.torso_precision=bf16: the CNN runs under bfloat16 autocast (its outputs differ from float32's at
    bfloat16's precision, not more), the LSTM state and the heads' outputs stay float32; a precision it does not know
    is refused naming the field."""
    import copy

    spec = EnvSpec((4, 44, 44), np.dtype(np.uint8), 3, 4)
    torch.manual_seed(0)
    fp32 = build_model(C.LearnerConfig(agent=agent, core="lstm", core_size=16, model="nature_cnn"), spec)
    bf16 = copy.deepcopy(fp32)
    bf16.torso_precision = "bf16"
    assert build_model(C.LearnerConfig(agent=agent, core="lstm", core_size=16, model="nature_cnn",
                                       torso_precision="bf16"), spec).torso_precision == "bf16"
    t1, n = 5, 3
    obs = torch.randint(0, 255, (t1, n, *spec.obs_shape), dtype=torch.uint8)
    first = torch.zeros(t1, n, dtype=torch.bool)
    state0 = torch.zeros(n, fp32.state_size)
    with torch.no_grad():
        a, b = fp32(obs, state0, first), bf16(obs, state0, first)
    out_a, out_b = a[0], b[0]
    assert out_b.dtype == torch.float32 and b[-1].dtype == torch.float32
    err = (out_a - out_b).abs().max() / out_a.abs().max()
    assert 0 < err < 0.05  # it did run in bfloat16 (8-bit mantissa), and close to float32
    with pytest.raises(C.ConfigError, match="learner.torso_precision"):
        C.LearnerConfig(torso_precision="fp16")


@pytest.mark.parametrize("mode,inference,devices", [("serial", "central", 1), ("parallel", "central", 1),
                                                    ("parallel", "actor", 1), ("parallel", "central", 2)])
def test_the_learner_trains_from_the_states_the_actors_stepped_with(cfg_factory, monkeypatch, mode, inference,
                                                                    devices):
    """With the weights held still (a learning rate of 1e-12), the learner's recomputed log-probabilities equal the
    behaviour policy's: |log pi/mu| stays at float noise over every update, with episodes ending inside unrolls.
    The core state lives on the inference server (central), in the actor (actor-side) or beside the learner
    (serial); with two learner processes each rank's server keeps its own actors' states and DistributedDataParallel
    runs the sequence pass. A missed reset or a state recorded off by one step shows up here as |log pi/mu| of
    1e-2 or more."""
    import rlbalance.agents.registry as R
    import rlbalance.runtime.train as T

    build = R.build_model

    def sharp(cfg, spec):  # policy logits that depend strongly on the core state
        m = build(cfg, spec)
        with torch.no_grad():
            m.policy.weight.mul_(300.0)
        return m

    monkeypatch.setattr(R, "build_model", sharp)
    s = T.train(cfg_factory(env={"id": MEMORY_ENV}, inference={"mode": inference},
                            learner={"core": "lstm", "core_size": 32, "learning_rate": 1e-12, "minibatches": 2,
                                     "devices": devices}, actors={"num_actors": 2},
                            run={"mode": mode, "total_steps": 8_000, "name": f"still-{mode}-{inference}-{devices}"},
                            telemetry={"tensorboard": False, "log_interval_s": 0.1}))
    assert s["outcome"] == "completed" and s["episodes"] > 50  # (about 20 steps each: many unrolls cross one)
    rho = [r["loss/log_rho_abs"] for r in _metrics(s["run_dir"]) if "loss/log_rho_abs" in r]
    assert rho and max(rho) < 1e-5, rho
    if mode == "serial":  # and evaluation plays the recurrent policy with its own states
        from rlbalance.runtime.evaluate import evaluate

        ev = evaluate(s["run_dir"], episodes=4, num_envs=2, progress=False)
        assert len(ev["returns"]) >= 4


def test_a_recurrent_model_is_calibrated_and_asks_for_its_state():
    from rlbalance.analysis.calibrate import model_flops

    model = build_model(C.LearnerConfig(core="lstm", core_size=8), EnvSpec((3,), np.dtype(np.float32), 2, 1))
    ff = build_model(C.LearnerConfig(), EnvSpec((3,), np.dtype(np.float32), 2, 1))
    assert model_flops(model, torch.zeros(4, 3)) > model_flops(ff, torch.zeros(4, 3)) / 2 > 0
    with pytest.raises(TypeError, match="recurrent model runs over unrolls"):
        model(torch.zeros(4, 3))


def test_recurrent_policies_are_allowed_with_ray_actors_and_an_unknown_core_is_refused():
    assert C.build({"learner": {"core": "lstm"}, "ray": {"address": "local"}}).learner.core == "lstm"
    with pytest.raises(C.ConfigError, match="learner.core="):
        C.build({"learner": {"core": "gru"}})


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["vtrace", "r2d2"])
def test_an_lstm_learns_cartpole_without_velocities_where_feed_forward_does_not(cfg_factory, agent):
    """CartPole with the velocities hidden, 150k steps, serial runner, seed 1, the same learner settings (the
    env's preset: 4 epochs of 4 minibatches, Adam 1e-3; R2D2: its classic-control preset): a feed-forward policy
    cannot tell which way the pole moves and stays near 50; the LSTM infers it from the history. Measured here:
    V-trace LSTM best last-100 mean 200 and 231 (seeds 1, 2), feed-forward 53 and 56 (bench/results/recurrent/);
    R2D2 (its classic-control preset, LSTM 64): 259 and 340, feed-forward Q-network 44 and 44
    (bench/results/recurrent-r2d2/)."""
    from rlbalance.runtime.train import train

    best = {}
    for core in ("lstm", "none"):
        s = train(cfg_factory(env={"id": MEMORY_ENV}, learner={"agent": agent, "core": core, "core_size": 64},
                              run={"mode": "serial", "total_steps": 150_000, "name": f"memory-{core}", "seed": 1,
                                   "preset": "auto"},
                              telemetry={"tensorboard": False}))
        best[core] = s["episode_return_best100"]
    assert best["lstm"] >= 120 and best["none"] < 90, best
