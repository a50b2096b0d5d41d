import json

import custom_envs  # noqa: E402  (tests/ is on sys.path; the module registers the test envs)
import numpy as np
import pytest

from rlbalance import config as C
from rlbalance.envs.batch import EnvBatch, probe_spec


def test_cartpole_batch_same_step_autoreset():
    envs = EnvBatch(C.EnvConfig(id="CartPole-v1"), 4, seed=0)
    obs = envs.reset().copy()
    assert obs.shape == (4, 4)
    ended = 0
    for _ in range(300):
        r = envs.step(np.zeros(4, dtype=np.int64))  # always push left
        obs, rew, done, ret, length = r.obs, r.reward, r.done, r.ep_return, r.ep_length
        assert (rew == 1).all()
        assert not r.truncated.any()  # pushing left falls over long before the 500-step limit
        if done.any():
            # the returned obs is the first of the next episode: near the reset state
            assert np.abs(obs[done]).max() < 0.06
            assert (ret[done] == length[done]).all() and (length[done] > 0).all()
            ended += int(done.sum())
    assert ended > 0
    envs.close()


def test_synthetic_env_costs_cpu_and_rewards_the_argmax_action():
    cfg = C.EnvConfig(id="synthetic", synthetic_step_us=200.0, synthetic_obs_shape=(6,), synthetic_actions=3,
                      synthetic_episode_len=5)
    envs = EnvBatch(cfg, 4, seed=0)
    obs = envs.reset().copy()
    import time

    t = time.thread_time()
    best = obs[:, :3].argmax(axis=1)
    r = envs.step(best)
    assert time.thread_time() - t >= 4 * 200e-6 * 0.9  # real CPU work, K x step_us
    assert (r.reward == 1).all()
    for _ in range(4):
        r = envs.step(np.zeros(4, dtype=np.int64))
    assert r.done.all() and r.game_over.all()


def test_atari_preprocessing_shapes():
    spec = probe_spec(C.EnvConfig(id="ALE/Pong-v5"))
    assert spec.obs_shape == (4, 84, 84) and spec.obs_dtype == np.uint8
    assert spec.num_actions == 6 and spec.frames_per_step == 4


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
def test_episodic_life_keeps_game_return(backend):
    cfg = C.EnvConfig(id="ALE/Breakout-v5", episodic_life=True, noop_max=0 if backend == "gymnasium" else 1,
                      backend=backend)
    envs = EnvBatch(cfg, 1, seed=0)
    envs.reset()
    lives_lost = games = 0
    for _ in range(3000):
        r = envs.step(np.array([np.random.randint(4)]))
        if r.done[0] and not r.game_over[0]:
            lives_lost += 1
        if r.game_over[0]:
            games += 1
            break
    assert lives_lost >= 1  # learning episodes ended at life losses before the game was over
    assert games == 1
    envs.close()


def test_envpool_atari_without_no_ops_is_refused_before_it_can_crash():
    with pytest.raises(C.ConfigError, match="env.noop_max=0 .*env.backend=gymnasium"):
        C.EnvConfig(id="ALE/Breakout-v5", noop_max=0, backend="envpool")
    assert C.EnvConfig(id="ALE/Breakout-v5", noop_max=0).noop_max == 0  # the gymnasium backend takes it


def test_unknown_env_id_is_a_clear_error():
    with pytest.raises(C.ConfigError, match="not a registered environment"):
        EnvBatch(C.EnvConfig(id="NoSuchEnv-v0"), 1, 0)


def _needs_a_missing_package(**kwargs):
    import gymnasium as gym

    raise gym.error.DependencyNotInstalled("Box2D is not installed, you can install it by ...")


def test_an_env_whose_package_is_missing_is_a_clear_error():
    import gymnasium as gym

    if "rlbalance-test/NeedsBox2D-v0" not in gym.registry:
        gym.register("rlbalance-test/NeedsBox2D-v0", entry_point=_needs_a_missing_package)
    with pytest.raises(C.ConfigError, match="env.id='rlbalance-test/NeedsBox2D-v0' needs a package that is not "
                                            "installed: Box2D is not installed"):
        probe_spec(C.EnvConfig(id="rlbalance-test/NeedsBox2D-v0"))


def test_time_limit_is_a_truncation_with_the_final_observation():
    envs = EnvBatch(C.EnvConfig(id="CartPole-v1", max_episode_steps=5), 2, seed=0)
    envs.reset()
    for i in range(5):
        r = envs.step(np.array([i % 2, (i + 1) % 2]))
    assert r.done.all() and r.truncated.all()
    assert not np.array_equal(envs.final_obs, r.obs)  # final obs kept apart from the reset obs
    envs.close()


def test_envpool_takes_the_seeds_of_large_run_seeds_and_learner_ranks():
    """EnvPool asserts int32 seeds; rank 1 of learner.devices=2 (run.seed + 7919) made an env group seed of
    7.9e9, which killed every actor of that rank. Seeds are folded into range, and distinct seeds stay distinct."""
    pytest.importorskip("envpool", reason="optional backend: pip install -e '.[envpool]'")
    cfg = C.EnvConfig(id="CartPole-v1", backend="envpool")
    batches = [EnvBatch(cfg, 2, seed=s) for s in (7_919_023_757, 7_919_023_758)]
    first = [b.reset().copy() for b in batches]
    for b in batches:
        b.close()
    assert not np.array_equal(first[0], first[1])


def test_envpool_backend_same_step_autoreset():
    pytest.importorskip("envpool", reason="optional backend: pip install -e '.[envpool]'")
    cfg = C.EnvConfig(id="CartPole-v1", backend="envpool")
    envs = EnvBatch(cfg, 4, seed=0)
    envs.reset()
    ends = 0
    for _ in range(100):
        r = envs.step(np.zeros(4, dtype=np.int64))
        assert (r.reward == 1).all()  # no zero-reward reset steps leak into the trajectory
        if r.done.any():
            assert np.abs(r.obs[r.done]).max() < 0.06  # already the next episode's first obs
            ends += int(r.done.sum())
    assert ends > 0
    envs.close()


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
def test_pong_unrolls_line_up(backend):
    """What the learner sees on Pong: in each unroll, the frame stack moves on by exactly one frame per step
    (no episode ends this early), and the next unroll starts where the last one stopped."""
    from rlbalance.envs.batch import EnvBatch
    from rlbalance.runtime.actor import Rollout
    from rlbalance.runtime.buffers import RolloutBuffers
    from rlbalance.agents.base import StepField

    cfg = C.build({"env": {"id": "ALE/Pong-v5", "backend": backend}})
    envs = EnvBatch(cfg.env, 2, 0)
    rng = np.random.default_rng(0)
    class RandomPolicy:  # (the Policy protocol: random actions at once)
        core_in = None

        def request(self, obs, first):
            self.answer = (rng.integers(0, 6, len(obs)), {"logits": np.zeros((len(obs), 6), np.float32)}, 0)

        def receive(self):
            return self.answer

    rollout = Rollout(envs, RandomPolicy())
    bufs = RolloutBuffers.allocate(2, 30, 2, envs.spec, shared=False, record={"logits": StepField((6,))})
    for j in range(2):
        rollout.fill(bufs.view(j))
    envs.close()
    obs = bufs.obs.numpy()
    assert not bufs.done.any()
    for j in range(2):
        for t in range(30):
            assert np.array_equal(obs[j, t + 1, :, :3], obs[j, t, :, 1:])  # [K, stack, H, W]
    assert np.array_equal(obs[0, 30], obs[1, 0])
    assert obs.std(axis=(0, 1, 2)).max() > 0  # frames change


@pytest.mark.slow
def test_custom_env_from_the_cli_learns_in_actor_processes(tmp_path):
    """`--env.id module:EnvId`: the module is imported in the learner and in every actor; its Discrete
    observations arrive one-hot; a corridor walk is learned."""
    from rlbalance.cli import main

    rc = main(["train", "--env.id", "custom_envs:Corridor-v0", "--run.total_steps", "40000", "--run.out_dir",
               str(tmp_path), "--run.name", "corridor", "--telemetry.progress", "false", "--telemetry.tensorboard",
               "false", "--telemetry.report", "false"])
    assert rc == 0
    s = json.load(open(tmp_path / "corridor" / "summary.json"))
    assert s["outcome"] == "completed" and s["preset"] == "classic"
    assert s["episode_return_last100"] >= 0.9, s  # each episode ends at the goal, not the 20-step limit
    last = json.loads((tmp_path / "corridor" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["episode_length"] <= 8, last  # 4 steps is the shortest walk


def test_env_imports_and_flattened_spaces(tmp_path):
    """env.imports registers a plain id; Tuple observations (Blackjack) are flattened to one float vector;
    a space with no numeric form is refused before anything starts, naming it."""
    from rlbalance.cli import main
    from rlbalance.envs.batch import probe_spec

    spec = probe_spec(C.build({"env": {"id": "Corridor-v0", "imports": ["custom_envs"]}}).env)
    assert spec.obs_shape == (5,) and spec.obs_dtype == np.float32 and spec.num_actions == 2
    spec = probe_spec(C.build({"env": {"id": "Blackjack-v1"}}).env)
    assert spec.obs_shape == (45,) and spec.obs_dtype == np.float32  # one-hots of 32, 11 and 2
    envs = EnvBatch(C.EnvConfig(id="Blackjack-v1"), 2, seed=0)
    obs = envs.reset()
    assert obs.shape == (2, 45) and set(np.unique(obs)) <= {0.0, 1.0} and (obs.sum(axis=1) >= 2).all()
    envs.close()
    with pytest.raises(C.ConfigError, match=r"Sequence.*supported: Box of any rank"):
        probe_spec(C.build({"env": {"id": "custom_envs:Varying-v0"}}).env)
    assert main(["train", "--env.id", "custom_envs:Varying-v0", "--run.out_dir", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())  # refused before a run directory was made
    with pytest.raises(C.ConfigError, match=r"env.imports: cannot import module 'no_such_module'"):
        probe_spec(C.build({"env": {"id": "CartPole-v1", "imports": ["no_such_module"]}}).env)


def test_env_kwargs_reach_gymnasium_make(tmp_path):
    """env.kwargs (a JSON object on the command line, a table in a file) is passed to gymnasium.make; keyword
    arguments the env does not take are refused before anything starts, naming the field."""
    from rlbalance.cli import main
    from rlbalance.envs.batch import probe_spec

    cfg = C.build({"env": {"id": "custom_envs:Corridor-v0", "kwargs": '{"length": 8}'}})
    assert probe_spec(cfg.env).obs_shape == (8,)
    assert C.build({"env": {"id": "custom_envs:Corridor-v0", "kwargs": {"length": 3}}}).env.make_kwargs == {"length": 3}
    with pytest.raises(C.ConfigError, match=r"env.kwargs=.*is invalid: a JSON object"):
        C.build({"env": {"kwargs": "[1, 2]"}})
    assert main(["train", "--env.id", "custom_envs:Corridor-v0", "--env.kwargs", '{"size": 3}', "--run.out_dir",
                 str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())


def test_env_class_or_function_as_env_id(tmp_path):
    """From Python, env.id may be an env class or an env-creating function (named by module and name, so actor
    processes can import it); from the CLI 'module:Name' does the same for an unregistered class. Lambdas,
    local functions and the running script's own definitions are refused with the reason."""
    from rlbalance.envs.batch import probe_spec
    from rlbalance.runtime.train import train

    cfg = C.build({"env": {"id": custom_envs.Target}, "run": {"total_steps": 2_000, "out_dir": str(tmp_path)},
                   "telemetry": {"progress": False, "tensorboard": False, "report": False}})
    assert cfg.env.id == "custom_envs:Target" and cfg.run.preset == "continuous"
    s = train(cfg)  # two actor processes import custom_envs and register Target themselves
    assert s["outcome"] == "completed" and s["action_space"] == "Box([2])"
    assert probe_spec(C.build({"env": {"id": custom_envs.make_corridor}}).env).obs_shape == (7,)
    with pytest.raises(C.ConfigError, match="lambda or a function defined inside another"):
        C.build({"env": {"id": lambda: custom_envs.Corridor()}})
    main_fn = type(custom_envs.make_corridor)(custom_envs.make_corridor.__code__, {})
    main_fn.__module__ = "__main__"
    with pytest.raises(C.ConfigError, match="move make_corridor into a module on PYTHONPATH"):
        C.build({"env": {"id": main_fn}})
