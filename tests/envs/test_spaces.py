"""Action spaces: Discrete, MultiDiscrete, MultiBinary and Box (a diagonal Gaussian) each learn a small task that
needs the space; anything else is refused before any process starts, naming the space; the distribution code
matches torch.distributions."""

import json

import custom_envs  # noqa: F401  (registers the test envs in this process too)
import gymnasium as gym
import numpy as np
import pytest
import torch

from rlbalance import config as C
from rlbalance.cli import main
from rlbalance.envs.batch import probe_spec
from rlbalance.envs.spaces import ActionSpec

QUIET = ["--telemetry.progress", "false", "--telemetry.tensorboard", "false", "--telemetry.report", "false"]


def test_specs_of_each_space():
    assert ActionSpec.from_space(gym.spaces.Discrete(4)).param_size == 4
    md = ActionSpec.from_space(gym.spaces.MultiDiscrete([2, 3]))
    assert (md.kind, md.dim, md.param_size, md.store_shape) == ("multi_discrete", 2, 5, (2,))
    mb = ActionSpec.from_space(gym.spaces.MultiBinary(3))
    assert (mb.nvec, mb.describe()) == ((2, 2, 2), "MultiBinary(3)")
    box = ActionSpec.from_space(gym.spaces.Box(-2.0, 2.0, (2, 3), np.float32))
    assert (box.dim, box.head_size, box.param_size, box.store_shape) == (6, 6, 12, (6,))
    a = box.to_env(np.array([-5, 0, 1, 3, 1.5, -1.9], np.float32))
    assert a.shape == (2, 3) and a.min() == -2.0 and a.max() == 2.0  # clipped to the bounds, in the env's shape
    assert mb.to_env(np.array([1, 0, 1])).dtype == np.int8
    rng = np.random.default_rng(0)
    assert gym.spaces.MultiDiscrete([2, 3]).contains(md.random(rng, 5)[0])
    assert box.random(rng, 5).shape == (5, 6)


def test_distributions_match_torch():
    torch.manual_seed(0)
    logits = torch.randn(7, 5)
    cat = torch.distributions.Categorical(logits=logits)
    d = ActionSpec.discrete(5)
    a = cat.sample()
    assert torch.allclose(d.log_prob(logits, a), cat.log_prob(a), atol=1e-6)
    assert torch.allclose(d.entropy(logits), cat.entropy(), atol=1e-6)
    md = ActionSpec("multi_discrete", (2, 3))
    a = torch.stack([torch.distributions.Categorical(logits=logits[:, :2]).sample(),
                     torch.distributions.Categorical(logits=logits[:, 2:]).sample()], -1)
    ref = (torch.distributions.Categorical(logits=logits[:, :2]).log_prob(a[:, 0])
           + torch.distributions.Categorical(logits=logits[:, 2:]).log_prob(a[:, 1]))
    assert torch.allclose(md.log_prob(logits, a), ref, atol=1e-6)
    box = ActionSpec("box", shape=(3,), low=(-1.0,) * 3, high=(1.0,) * 3)
    params = torch.cat([torch.randn(7, 3), 0.3 * torch.randn(7, 3)], -1)
    normal = torch.distributions.Normal(params[:, :3], params[:, 3:].exp())
    a = normal.sample()
    assert torch.allclose(box.log_prob(params, a), normal.log_prob(a).sum(-1), atol=1e-5)
    assert torch.allclose(box.entropy(params), normal.entropy().sum(-1), atol=1e-5)
    draws = box.sample(params[:1].expand(20000, 6).contiguous(), torch.Generator().manual_seed(1))
    assert torch.allclose(draws.mean(0), params[0, :3], atol=0.05)
    assert torch.allclose(draws.std(0), params[0, 3:].exp(), rtol=0.05)


def _train(tmp_path, env_id, name, steps, *extra):
    rc = main(["train", "--env.id", env_id, "--run.total_steps", str(steps), "--run.out_dir", str(tmp_path),
               "--run.name", name, *QUIET, *extra])
    assert rc == 0
    return json.load(open(tmp_path / name / "summary.json"))


@pytest.mark.slow
def test_multi_discrete_learns_with_central_inference(tmp_path):
    """Three independent bits to copy: a random policy scores 5 per episode, the best 10."""
    s = _train(tmp_path, "custom_envs:Switches-v0", "switches", 60_000, "--actors.num_actors", "2")
    assert s["outcome"] == "completed" and s["action_space"] == "MultiDiscrete([2, 2, 2])"
    assert s["episode_return_last100"] >= 7.5, s


@pytest.mark.slow
def test_multi_binary_learns_with_actor_side_inference(tmp_path):
    s = _train(tmp_path, "custom_envs:Bits-v0", "bits", 60_000, "--inference.mode", "actor")
    assert s["action_space"] == "MultiBinary(3)"
    assert s["episode_return_last100"] >= 7.5, s


@pytest.mark.slow
def test_box_actions_learn(tmp_path):
    """A 2-d target to hit with Box(-1, 1) actions (a random policy scores about -13, the best 0); the
    continuous preset is picked from the action space."""
    s = _train(tmp_path, "custom_envs:Target-v0", "target", 40_000, "--actors.num_actors", "2")
    assert s["preset"] == "continuous" and s["action_space"] == "Box([2])"
    assert s["episode_return_last100"] >= -6.0, s  # measured: -4.0 (the Gaussian's own noise costs 2 sigma^2 a step)
    # (the run names its env's module: the user's own run, so they confirm it)
    ev = main(["eval", str(tmp_path / "target"), "--episodes", "8", "--greedy", "--into-run", "--trust-modules"])
    assert ev == 0
    assert json.load(open(tmp_path / "target" / "eval.json"))["return_mean"] >= -2.5  # measured: -1.7


def test_unsupported_action_space_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(C.ConfigError) as e:
        probe_spec(C.build({"env": {"id": "custom_envs:IntBox-v0"}}).env)
    assert str(e.value) == ("env.id='custom_envs:IntBox-v0': its action space Box(0, 4, (2,), int64) is not supported; "
                            "supported: Discrete, MultiDiscrete, MultiBinary and Box of floats (a diagonal "
                            "Gaussian policy)")
    assert main(["train", "--env.id", "custom_envs:IntBox-v0", "--run.out_dir", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())  # nothing left behind


@pytest.mark.slow
def test_pendulum_learns_with_the_continuous_preset(tmp_path):
    """Pendulum-v1 (Box(-2, 2) torque) with the continuous preset and no other flag, in serial mode
    (deterministic for a seed on one CPU, but not across CPUs: the same seed ended at -228 on the machine the
    preset's entry was tuned on and at -354 on a 2-vCPU AMD EPYC, after a best of -236 at 214k steps). A random
    policy scores about -1200 per episode. Seeds 0-4 on that EPYC at 300k steps: last-100 means -354, -183, -215,
    -175, -297; the bar, -450, is what a policy that swings the pole up in most episodes clears and a single
    trajectory's late wobble does not break. The preset's per-env entry gives Pendulum discount 0.95 and lr 6e-4
    (rlbalance/config/presets.py: with the family's 0.99 and 3e-4 it ended near -370 at 300k)."""
    s = _train(tmp_path, "Pendulum-v1", "pendulum", 300_000, "--run.mode", "serial", "--run.seed", "0")
    assert s["preset"] == "continuous" and s["action_space"] == "Box([1])"
    cfg = json.load(open(tmp_path / "pendulum" / "config.json"))
    assert cfg["learner"]["discount"] == 0.95 and cfg["learner"]["epochs"] == 10
    assert s["episode_return_last100"] >= -450, s
