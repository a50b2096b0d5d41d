"""Presets: the settings that make each environment family learn, one source of truth.

A run's values come from, lowest to highest: the dataclass defaults, the preset of its env family
(``run.preset=auto`` picks it from ``env.id``), a config file, the command line. The preset a run used
is recorded in its ``config.json`` (``run.preset``) and its summary. ``run.preset=none`` turns presets off.

Each preset names where its numbers come from and the measured runs that justified any change.
"""

from __future__ import annotations

import functools
from typing import Any

from rlbalance.config.env_ids import is_atari

PRESETS: dict[str, dict[str, Any]] = {
    # CartPole and the other gymnasium classic-control tasks: APPO with CleanRL's PPO CartPole settings where they
    # carry over (4 epochs of 4 minibatches per batch, clip 0.2, lambda 0.95, the learning rate decayed linearly)
    # on the default V-trace learner, with batches of 512 steps (16 unrolls of 32) in minibatches of 128 rows as
    # CleanRL's, and Adam at 1e-3. Justification: bench/results/seeds/, 8 seeds each with central and actor-side
    # inference, 500k steps: all 16 end at a last-100 mean of 500 and reach 475 at a median ~128k steps; and
    # bench/results/cartpole-race/ (time to 475 against the PPO peer). The preset before it (unrolls of 20, so
    # minibatches of 80 rows and 1.6x the optimizer steps per env step, in a learner-bound run; Adam 2.5e-4) also
    # held 16 of 16 but took ~236k steps to 475 (bench/results/seeds-t20-lr2.5e-4/). One V-trace pass per batch
    # (the bare defaults, bench/results/seeds-vtrace/) ended at a median 487 (central) and 310 (actor) after late
    # collapses.
    "classic": {"learner": {"epochs": 4, "minibatches": 4, "learning_rate": 1e-3, "unroll_length": 32,
                            "ppo_clip": 0.2, "vtrace_lambda": 0.95}},
    # rlbalance's own small pixel task (rlbalance/Catch-v0, the CI-sized proof that the CNN path learns): the
    # defaults, one V-trace pass per batch, which learn it in 150k steps (tests/learning/test_learning.py). With the
    # classic preset (16 optimizer steps per batch) that test failed its bar in the same budget (one serial run)
    # and took over 6 minutes here (the machine was shared with a Pong run).
    "toy": {},
    # Continuous control (Box actions: gymnasium's MuJoCo tasks, Pendulum): a diagonal Gaussian policy on the MLP,
    # observations normalised by running statistics. APPO as in the classic preset, with the settings of
    # CleanRL's PPO for continuous control where they carry over (Adam 3e-4, clip 0.2, lambda 0.95, 10 epochs,
    # entropy 0, grad norm 0.5, observation normalisation); rewards scaled by 0.1 in place of its running
    # return normalisation. Justification: tests/test_continuous.py (Pendulum), bench/results/mujoco/.
    "continuous": {"learner": {"epochs": 10, "minibatches": 4, "learning_rate": 3e-4, "ppo_clip": 0.2,
                               "vtrace_lambda": 0.95, "entropy_cost": 0.0, "normalize_observations": True,
                               "reward_scale": 0.1}},
    # The controlled synthetic environment: the dataclass defaults.
    "synthetic": {},
    # Atari (ALE, DeepMind preprocessing, Nature CNN). V-trace advantages in PPO's clipped surrogate with
    # four passes over each batch (APPO, as in Sample Factory and RLlib), with CleanRL's PPO Atari
    # hyperparameters: Adam 2.5e-4 (eps 1e-5), clip 0.1, entropy 0.01, value 0.5, grad norm 0.5,
    # lambda 0.95, advantages normalised per minibatch, rewards clipped to [-1, 1]. A batch of 32 unrolls
    # of 20 steps in 4 minibatches over 4 epochs: CleanRL's 4 passes in 4 minibatches, on batches of 640
    # steps where it takes 1024, so 1.6x its optimizer steps per frame. The learning rate is constant, so a
    # short run learns as fast as the start of a long one. Justification (10M-frame Pong runs, mean of the
    # last 100 games): with 2 passes, seeds 1, 2, 3 passed -15 at 4.79M, 6.22M, 4.99M frames and ended at
    # +19.0, +16.6, -2.5 (bench/results/pong-curve*/); with 4 passes, seeds 1 and 2 passed -15 at 3.47M and
    # 3.71M frames and seed 2 reached +18 at 6.05M (bench/results/pong-epochs4-seed*/). Four passes cost
    # learner time per frame (bench/results/trainer.md), and win back more in frames to score. The torso at
    # float32 (learner.torso_precision=fp32). 'auto' (bfloat16 where the CPU or GPU computes it natively,
    # rlbalance.agents.precision) makes the learner faster: on a 2-vCPU Xeon with AMX its ceiling was 2.1x the
    # float32 learner's before these changes, end to end 1.26x (bench/results/precision/, precision-e2e/). But it
    # did not show that it learns the same: at seed 2 it reached +18 at 8.30M frames against 6.05M for float32
    # (bench/results/pong-bf16/); at seed 1 at 5.49M against 5.26M (bench/results/pong-bf16-seed1/): a mean of 1.22x
    # the frames over two seeds, about what its end-to-end speed-up (1.16-1.26x) wins back, so no gain in time to
    # +18 shown. The default stays float32.
    "atari": {
        "env": {"backend": "envpool", "sticky_actions": 0.0, "noop_max": 30, "episodic_life": False},
        "actors": {"num_actors": 2, "envs_per_actor": 16, "env_groups": 1, "buffers_per_actor": 2},
        "learner": {"batch_size": 32, "unroll_length": 20, "learning_rate": 2.5e-4, "lr_schedule": "constant",
                    "adam_eps": 1e-5, "epochs": 4, "minibatches": 4, "ppo_clip": 0.1, "vtrace_lambda": 0.95,
                    "normalize_advantages": True, "entropy_cost": 0.01, "baseline_cost": 0.5,
                    "max_grad_norm": 0.5, "reward_clip": 1.0, "discount": 0.99, "torch_threads": 2,
                    "torso_precision": "fp32"},
    },
}

PRESET_NAMES = ("auto", "none", *PRESETS)


def family(env_id: str, imports: tuple[str, ...] = ()) -> str:
    """The env family of an id: 'atari', 'synthetic', 'toy' (rlbalance's own), 'continuous' (a gymnasium env with
    Box actions: MuJoCo, Pendulum, ...) or 'classic' (any other gymnasium id)."""
    if is_atari(env_id):
        return "atari"
    if env_id == "synthetic":
        return "synthetic"
    if env_id.startswith("rlbalance/"):
        return "toy"
    return "continuous" if _box_actions(env_id, tuple(imports)) else "classic"


@functools.lru_cache(maxsize=64)
def _box_actions(env_id: str, imports: tuple[str, ...]) -> bool:
    """Whether a gymnasium id's env takes Box actions (one throw-away env; False where it cannot be made: the
    env checks that follow name the problem)."""
    from types import SimpleNamespace

    import gymnasium as gym

    from rlbalance.config.user_modules import import_user_modules

    try:
        env = gym.make(import_user_modules(SimpleNamespace(id=env_id, imports=imports)))
    except Exception:
        return False
    try:
        return isinstance(env.action_space, gym.spaces.Box)
    finally:
        env.close()


def resolve(name: str, env_id: str, imports: tuple[str, ...] = ()) -> str:
    return family(env_id, imports) if name == "auto" else name


# Per-env settings on top of a family preset (as RL Baselines3 Zoo keeps per-env hyperparameters), each with its
# measured justification.
ENV_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # Pendulum's horizon is short and its reward dense: discount 0.95 (the Zoo uses 0.9) and lr 6e-4. Serial
    # runs, 300k steps, seed 0: -228 (this), -370 (the preset's 0.99 and 3e-4); 0.95 with 3e-4: -285 at 200k
    # (bench/results/pendulum/). Seeds 0-4 on a 2-vCPU AMD EPYC: -354, -183, -215, -175, -297
    # (bench/results/pendulum-seeds/).
    "Pendulum-v1": {"learner": {"discount": 0.95, "learning_rate": 6e-4}},
    # CartPole without velocities (rlbalance's memory task): the classic preset's APPO settings with Adam 1e-3.
    # Serial runs, 150k steps, LSTM 64: the LSTM learns and feed-forward stays near 50 (`rlbalance bench memory`,
    # bench/results/recurrent/); with the toy preset's one pass per batch the LSTM reached a best of 62 (seed 1).
    "rlbalance/CartPoleNoVelocity-v1": {"learner": {"epochs": 4, "minibatches": 4, "learning_rate": 1e-3,
                                                    "ppo_clip": 0.2, "vtrace_lambda": 0.95}},
}


# R2D2 (learner.agent=r2d2) on top of a family preset: the learner fields it shares with V-trace take R2D2's values
# (Kapturowski et al. 2019, Table 2, as SEED RL runs it: Adam 1e-4, eps 1e-3, discount 0.997, LSTM 512 on Atari,
# value rescaling in place of reward clipping, a replay period of 40 steps; the r2d2 section's defaults hold the rest).
AGENT_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "r2d2": {"learner": {"core": "lstm", "core_size": 512, "learning_rate": 1e-4, "adam_eps": 1e-3,
                         "lr_schedule": "constant", "max_grad_norm": 80.0, "discount": 0.997, "unroll_length": 40,
                         "reward_clip": 0.0, "reward_scale": 1.0, "normalize_observations": False, "epochs": 1,
                         "minibatches": 1}},
}

# R2D2 per env family, on top of AGENT_PRESETS["r2d2"]: small tasks get a small core, short sequences, a quick target
# net and a replay ratio that makes up for the few sequences a short run delivers, and Adam's eps at 1e-4: the
# gradients of these small nets are so small that Atari's 1e-3 damped every step (CartPole without velocities,
# LSTM, serial, 150k steps, seed 2: best last-100 mean 42 with 1e-3, 341 with 1e-4, 285 with 1e-5; seed 1: 99 and
# 259). Justification: tests/agents/test_r2d2.py, tests/agents/test_recurrent.py, bench/results/recurrent-r2d2/,
# bench/results/seeds-r2d2/.
AGENT_FAMILY_PRESETS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("r2d2", "classic"): {
        "learner": {"core_size": 64, "learning_rate": 1e-3, "adam_eps": 1e-4, "discount": 0.99, "unroll_length": 10},
        "r2d2": {"sequence_length": 20, "burn_in": 10, "n_step": 3, "batch_size": 32, "replay_size": 2_000,
                 "learning_starts": 100, "target_update_every": 100, "replay_ratio": 4.0},
    },
}
AGENT_FAMILY_PRESETS[("r2d2", "toy")] = AGENT_FAMILY_PRESETS[("r2d2", "classic")]  # (CartPoleNoVelocity, Catch)
# Atari on a few CPU cores. The paper's sequences (80 after a burn-in of 40, batch 64) cost 12-15 s per update on
# the 2-CPU development machine: ~1k updates in 10M frames. Sequences of 20 after a burn-in of 10 (the replay period
# one 10-step unroll), 16 per batch, at replay ratio 2, cost 0.21-0.30 s per update (bf16 torso / float32:
# bench/results/r2d2-precision/) and give ~31k updates in 10M
# frames (the run: 20.9k at 6.75M); Adam at 2.5e-4 with eps 1e-5 (the run's gradient norm was 0.02-0.04 over ~3M
# weights, so the paper's 1e-3 would dwarf Adam's second-moment root and shrink every step), the target net
# copied every 200 updates. The replay holds 10,000 such sequences (31 stacked 84x84x4 frames each: 8.7 GB; the
# paper's million would not fit in memory in this layout), filled to a fifth before learning starts. Pong, seed 1,
# with learner.torso_precision=bf16: +18 at 7.75M frames (its near-greedy envs), bench/results/pong-r2d2/. At replay
# ratio 1 a run was still at -20.8 after 1.85M frames (bench/results/pong-r2d2/first-run/stopped-rr1/).
AGENT_FAMILY_PRESETS[("r2d2", "atari")] = {
    "learner": {"learning_rate": 2.5e-4, "adam_eps": 1e-5, "unroll_length": 10},
    "r2d2": {"sequence_length": 20, "burn_in": 10, "batch_size": 16, "replay_size": 10_000, "learning_starts": 2_000,
             "replay_ratio": 2.0, "target_update_every": 200},
}


def layer_parts(name: str, env_id: str = "", agent: str = "vtrace") -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """The parts of preset ``name``'s layer, lowest first, each named as ``rlbalance config show`` names it: the
    family's settings, the env's own, the agent's own, the agent's on this family (one Atari setting for every game:
    a game tuned apart is an example config file, examples/). None under run.preset=none."""
    if name not in PRESETS:  # run.preset=none: no layer at all, the agent's included (the bare field defaults)
        return []
    env_key = env_id.partition(":")[2] if ":" in env_id else env_id
    parts = [(f"{name} preset", PRESETS[name]), (f"{name} preset: {env_key}'s own", ENV_PRESETS.get(env_key, {})),
             (f"{name} preset: {agent}'s own", AGENT_PRESETS.get(agent, {})),
             (f"{name} preset: {agent} on {name}", AGENT_FAMILY_PRESETS.get((agent, name), {}))]
    return [(label, vals) for label, vals in parts if vals]


def layer(name: str, env_id: str = "", agent: str = "vtrace") -> dict[str, Any]:
    """The overrides of preset ``name`` ('none': no overrides): its parts (``layer_parts``) merged, the later over
    the earlier."""
    out: dict[str, Any] = {}
    for _, part in layer_parts(name, env_id, agent):
        for sec, vals in part.items():
            out.setdefault(sec, {}).update(vals)
    return out
