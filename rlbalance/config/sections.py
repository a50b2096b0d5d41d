"""The sections of the run configuration (env, actors, inference, learner, r2d2, telemetry, run; ray's is in
ray_section.py): frozen dataclasses whose fields carry their documentation in ``metadata["doc"]`` (the CLI help is
generated from it); each section checks its own values in ``__post_init__``, naming the field."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rlbalance.config.env_ids import is_atari
from rlbalance.core.errors import ConfigError


def _f(default: Any, doc: str, **kw: Any) -> Any:
    return field(default=default, metadata={"doc": doc, **kw})


def _require(cond: bool, name: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ConfigError(f"{name}={value!r} is invalid: {allowed}")


ENV_BACKENDS = ("gymnasium", "envpool")
INFERENCE_MODES = ("central", "actor")
MODELS = ("auto", "mlp", "nature_cnn")
DEVICES = ("auto", "cpu", "cuda")
MODES = ("parallel", "serial")
BALANCE_MODES = ("off", "auto", "ga3c")
AGENTS = ("vtrace", "r2d2")
WANDB_MODES = ("off", "offline", "online")


@dataclass(frozen=True)
class EnvConfig:
    """What the actors step."""

    id: str = _f("CartPole-v1", "Environment id: a gymnasium id (CartPole-v1), an ALE id (ALE/Pong-v5), "
                 "'synthetic' for the controlled CPU-cost environment, or your own env as 'module:EnvId' (the "
                 "module is imported first, in the learner and in every actor, and registers EnvId).")
    imports: tuple[str, ...] = _f((), "Modules to import before the env is made, in the learner and in every actor "
                                  "(where your gymnasium.register calls live), e.g. [myenvs,myenvs.extra].")
    kwargs: str = _f("{}", "Keyword arguments for gymnasium.make, as a JSON object (a table in a config file), "
                     "e.g. '{\"length\": 8}'; ignored by Atari, EnvPool and the synthetic env.", json_object=True)
    backend: str = _f("gymnasium", "Stepping backend: 'gymnasium' (one env object per env) or 'envpool' "
                      "(batched C++ envs, optional dependency).")
    # Atari preprocessing (DeepMind style); ignored by non-Atari envs.
    noop_max: int = _f(30, "Atari: maximum number of no-op actions at reset.")
    frameskip: int = _f(4, "Atari: frames repeated per action, max-pooled over the last two.")
    screen_size: int = _f(84, "Atari: square observation size after resizing.")
    frame_stack: int = _f(4, "Atari: number of stacked grayscale frames.")
    sticky_actions: float = _f(0.0, "Atari: probability of repeating the previous action (0.25 is v5's default; "
                               "0 gives the classic DeepMind setting).")
    episodic_life: bool = _f(False, "Atari: end an episode (for learning) at every life loss.")
    max_episode_steps: int = _f(0, "Truncate episodes after this many agent steps (0 keeps the env's own limit; "
                                "Atari uses 108000 frames / frameskip).")
    # Synthetic environment.
    synthetic_step_us: float = _f(50.0, "Synthetic: microseconds of real CPU work per env step.")
    synthetic_cost: str = _f("busy", "Synthetic: 'busy' burns the step cost on this core (real work); 'sleep' waits "
                             "it out without using a core, emulating envs whose work runs elsewhere (lets a small "
                             "machine sweep more actors than it has cores).")
    synthetic_obs_shape: tuple[int, ...] = _f((16,), "Synthetic: observation shape (e.g. [16] or [4,84,84]).")
    synthetic_obs_dtype: str = _f("float32", "Synthetic: observation dtype, 'float32' or 'uint8' (as Atari frames; "
                                  "what calibration's free env takes from a pixel workload).")
    synthetic_actions: int = _f(4, "Synthetic: number of discrete actions.")
    synthetic_episode_len: int = _f(200, "Synthetic: episode length in steps.")
    synthetic_fault: str = _f("", "Synthetic, for fault tests: 'raise:N', 'hang:N' or 'kill:N' (SIGKILL itself) after "
                              "N steps in actor 0's first life; 'nan:N' gives NaN rewards from step N on.")

    def __post_init__(self) -> None:
        _require(bool(self.id), "env.id", self.id, "give a gymnasium id, an ALE id or 'synthetic'")
        _require(self.backend in ENV_BACKENDS, "env.backend", self.backend, f"one of {ENV_BACKENDS}")
        try:
            kw = json.loads(self.kwargs)
        except json.JSONDecodeError:
            kw = None
        _require(isinstance(kw, dict), "env.kwargs", self.kwargs, "a JSON object of gymnasium.make's keyword "
                 "arguments, e.g. '{\"length\": 8}'")
        for m in self.imports:
            _require(bool(m) and all(part.isidentifier() for part in m.split(".")), "env.imports", self.imports,
                     "dotted module names, e.g. [myenvs]")
        _require(self.noop_max >= 0, "env.noop_max", self.noop_max, "must be >= 0")
        _require(not (self.backend == "envpool" and self.is_atari and self.noop_max == 0), "env.noop_max",
                 self.noop_max, "EnvPool's Atari envs crash the process at 0 (a segfault at reset, envpool 1.2.5): "
                 "give env.noop_max >= 1, or env.backend=gymnasium for resets without no-ops")
        _require(self.frameskip >= 1, "env.frameskip", self.frameskip, "must be >= 1")
        _require(self.screen_size >= 8, "env.screen_size", self.screen_size, "must be >= 8")
        _require(self.frame_stack >= 1, "env.frame_stack", self.frame_stack, "must be >= 1")
        _require(0.0 <= self.sticky_actions < 1.0, "env.sticky_actions", self.sticky_actions, "must be in [0, 1)")
        _require(self.max_episode_steps >= 0, "env.max_episode_steps", self.max_episode_steps, "must be >= 0")
        _require(self.synthetic_cost in ("busy", "sleep"), "env.synthetic_cost", self.synthetic_cost,
                 "'busy' or 'sleep'")
        _require(self.synthetic_step_us >= 0, "env.synthetic_step_us", self.synthetic_step_us, "must be >= 0")
        _require(len(self.synthetic_obs_shape) >= 1 and all(int(d) >= 1 for d in self.synthetic_obs_shape),
                 "env.synthetic_obs_shape", self.synthetic_obs_shape, "a non-empty list of positive sizes")
        _require(self.synthetic_actions >= 2, "env.synthetic_actions", self.synthetic_actions, "must be >= 2")
        _require(self.synthetic_obs_dtype in ("float32", "uint8"), "env.synthetic_obs_dtype", self.synthetic_obs_dtype,
                 "'float32' or 'uint8'")
        kind, _, n = self.synthetic_fault.partition(":")
        _require(not self.synthetic_fault or (kind in ("raise", "hang", "kill", "nan") and n.isdigit()),
                 "env.synthetic_fault", self.synthetic_fault, "'' or raise:N, hang:N, kill:N, nan:N")
        _require(self.synthetic_episode_len >= 1, "env.synthetic_episode_len", self.synthetic_episode_len,
                 "must be >= 1")

    @property
    def make_kwargs(self) -> dict:
        return json.loads(self.kwargs)

    @property
    def is_atari(self) -> bool:
        return is_atari(self.id)


@dataclass(frozen=True)
class ActorsConfig:
    """The CPU actors."""

    num_actors: int = _f(2, "Number of actor processes (each steps envs_per_actor environments).")
    envs_per_actor: int = _f(8, "Environments per env group (K): one message to the inference server carries K "
                             "observations, and one unroll buffer holds K trajectories.")
    env_groups: int = _f(2, "Env groups per actor process, stepped in turn: one group steps while the others "
                         "await their actions (double-buffered sampling); the process runs env_groups*K envs.")
    cpu_affinity: tuple[int, ...] = _f((), "CPU cores the actors are pinned to, round-robin (empty: no pinning).")
    heartbeat_timeout_s: float = _f(60.0, "An actor silent this long is taken as hung: killed and restarted.")
    max_restarts: int = _f(10, "Actor restarts allowed in a run (dead, crashed or hung); one more stops training "
                           "with an error.")
    buffers_per_actor: int = _f(0, "Shared-memory unroll buffers per env group (0: enough for two learner "
                                "batches plus one per group); more lets actors run further ahead, fewer bound the "
                                "policy lag of a learner-bound run (as few as one batch in all: then the actors "
                                "wait while the learner copies a batch out).")

    def __post_init__(self) -> None:
        _require(self.num_actors >= 1, "actors.num_actors", self.num_actors, "must be >= 1")
        _require(self.envs_per_actor >= 1, "actors.envs_per_actor", self.envs_per_actor, "must be >= 1")
        _require(self.env_groups >= 1, "actors.env_groups", self.env_groups, "must be >= 1")
        _require(self.heartbeat_timeout_s > 0, "actors.heartbeat_timeout_s", self.heartbeat_timeout_s, "must be > 0")
        _require(self.max_restarts >= 0, "actors.max_restarts", self.max_restarts, "must be >= 0")
        _require(self.buffers_per_actor >= 0, "actors.buffers_per_actor", self.buffers_per_actor,
                 "must be 0 (automatic) or >= 1")
        _require(all(c >= 0 for c in self.cpu_affinity), "actors.cpu_affinity", self.cpu_affinity,
                 "core ids must be >= 0")


@dataclass(frozen=True)
class InferenceConfig:
    """Where and how the policy is evaluated for the actors."""

    mode: str = _f("central", "'central': one server on the learner device batches all actors (SEED); "
                   "'actor': each actor runs the policy on its CPU (IMPALA).")
    max_batch: int = _f(0, "Central: most environments in one forward pass (0: all actors' envs).")
    max_wait_ms: float = _f(0.0, "Central: longest wait for a fuller batch once one request is in (0: serve "
                            "every request already there at once, the lowest latency).")
    sync_every: int = _f(1, "Actor mode: copy new weights when this many learner updates have passed.")

    def __post_init__(self) -> None:
        _require(self.mode in INFERENCE_MODES, "inference.mode", self.mode, f"one of {INFERENCE_MODES}")
        _require(self.max_batch >= 0, "inference.max_batch", self.max_batch, "must be >= 0 (0 means no cap)")
        _require(self.max_wait_ms >= 0, "inference.max_wait_ms", self.max_wait_ms, "must be >= 0")
        _require(self.sync_every >= 1, "inference.sync_every", self.sync_every, "must be >= 1")


@dataclass(frozen=True)
class LearnerConfig:
    """The V-trace actor-critic learner."""

    agent: str = _f("vtrace", "The learning algorithm: 'vtrace' (IMPALA's V-trace actor-critic, or APPO with "
                    "learner.ppo_clip) or 'r2d2' (recurrent replay distributed DQN, as SEED RL runs it on Atari; its "
                    "own settings are in the r2d2 section, and it takes learner.learning_rate, adam_eps, "
                    "max_grad_norm, discount, core_size, hidden_sizes and unroll_length (the replay period) from "
                    "here, with R2D2's values unless given); or 'module:Agent', an agent of your own (see "
                    "rlbalance.agents.base).")
    device: str = _f("auto", "Learner device: 'auto' (cuda when available, else cpu), 'cpu' or 'cuda'.")
    devices: int = _f(1, "Learner devices, data parallel (see learner.data_parallel): cuda:0..N-1, or N CPU learners.")
    data_parallel: str = _f("auto", "How N learner devices share the work: 'ddp' (or 'auto', the same), one learner "
                            "process per device on torch.distributed (gloo on CPUs, NCCL on GPUs), each with its own "
                            "share of the actors (local processes, Ray actors or serial), its own central inference "
                            "server and batches of learner.batch_size unrolls (B x N summed), gradients all-reduced "
                            "by DistributedDataParallel.")
    lr_scaling: str = _f("none", "With learner.devices=N, the learning rate used: 'none' "
                         "learner.learning_rate as given (the gradient is averaged over a batch N times larger), "
                         "'linear' times N (Goyal et al. 2017), 'sqrt' times sqrt(N).")
    model: str = _f("auto", "'mlp', 'nature_cnn', or 'auto' (CNN for image observations, else MLP).")
    hidden_sizes: tuple[int, ...] = _f((64, 64), "MLP hidden layer sizes.")
    core: str = _f("none", "'lstm': a recurrent core (an LSTM cell of learner.core_size) between the torso (MLP or "
                   "Nature CNN) and the heads, for partially observed tasks; each env's state lives with its "
                   "policy (the central inference server, or the actor), is reset at episode ends, and each unroll "
                   "records the state it started from, which the learner trains from. 'none': feed-forward (with "
                   "learner.agent=r2d2: a Q-network without the LSTM, the memory task's control).")
    core_size: int = _f(128, "Units of the LSTM core (learner.core=lstm).")
    unroll_length: int = _f(20, "Unroll length T (steps per trajectory).")
    batch_size: int = _f(16, "Unrolls (single-env trajectories) per learner batch, B; a multiple of "
                         "actors.envs_per_actor.")
    learning_rate: float = _f(1e-3, "Initial Adam learning rate.")
    lr_schedule: str = _f("linear", "'linear' decay to 0 over run.total_steps, or 'constant'.")
    adam_eps: float = _f(1e-5, "Adam epsilon.")
    discount: float = _f(0.99, "Discount factor gamma.")
    entropy_cost: float = _f(0.01, "Entropy bonus coefficient.")
    baseline_cost: float = _f(0.5, "Value loss coefficient.")
    max_grad_norm: float = _f(0.5, "Global gradient-norm clip (the loss is a mean over T x B steps, not a sum as in "
                                  "IMPALA, hence a clip far below its 40).")
    clip_rho: float = _f(1.0, "V-trace rho-bar (importance weight clip for the value targets).")
    clip_c: float = _f(1.0, "V-trace c-bar (trace cutting).")
    clip_pg_rho: float = _f(1.0, "V-trace clip of the importance weight in the policy gradient.")
    vtrace_lambda: float = _f(1.0, "V-trace lambda (IMPALA, remark 2): trace coefficients lambda * min(c-bar, rho); "
                              "below 1 it trades bias for variance as GAE's lambda does.")
    epochs: int = _f(1, "Passes over each batch (1: IMPALA's single pass; more reuse each frame, as APPO does, at "
                     "that many times the learner's compute). Targets come from the first pass.")
    minibatches: int = _f(1, "Optimizer steps per pass: the batch's unrolls split into this many equal parts "
                          "(shuffled after the first pass).")
    minibatch_split: str = _f("unrolls", "How a pass splits a batch into learner.minibatches parts: 'unrolls' (whole "
                              "unrolls; the first pass computes the targets part by part) or 'steps' (single steps "
                              "from across the batch, as PPO shuffles its rollout, after one forward pass without "
                              "gradients for the whole batch's targets); 'steps' needs learner.core=none.")
    ppo_clip: float = _f(0.0, "0: the V-trace policy gradient. > 0: PPO's clipped surrogate on the ratio to the "
                         "behaviour policy with V-trace advantages (APPO), clipped to 1 +/- this.")
    ppo_clip_reference: str = _f("behaviour", "With learner.ppo_clip: the policy the ratio is clipped around. "
                                 "'behaviour': the policy that acted (APPO, as in Sample Factory; a lagging actor "
                                 "starts some steps clipped). 'proximal': the learner's own at each unroll's first "
                                 "pass in this update, the surrogate weighted by it over the behaviour policy, capped "
                                 "at learner.clip_pg_rho (decoupled PPO, Hilton et al. 2021): ratios start at 1.")
    normalize_advantages: bool = _f(True, "Normalize the policy-gradient advantages over each minibatch (zero mean, "
                                    "unit std); makes the policy step independent of the reward scale.")
    reward_clip: float = _f(0.0, "Clip rewards to [-x, x] (0: no clipping; Atari uses 1).")
    reward_scale: float = _f(1.0, "Multiply rewards by this before clipping and learning (returns and reports stay "
                             "in the env's units); keeps the value loss of large-reward tasks in range.")
    normalize_observations: bool = _f(False, "Normalise vector observations by their running mean and variance "
                                      "(updated from each batch, clipped to +/-10, saved in checkpoints); MLP only.")
    torch_threads: int = _f(1, "torch intra-op threads in the learner process.")
    torso_precision: str = _f("fp32", "The torso's arithmetic, in the learner and in inference alike. 'bf16': the "
                              "torso (Nature CNN or MLP) under bfloat16 autocast, its features cast back to float32 "
                              "for the LSTM core and the heads, which stay float32 (the recurrent state and the "
                              "values keep full precision). 'auto': bf16 for an image torso where the device computes "
                              "bfloat16 natively (a CPU with AVX512-BF16 or AMX, a CUDA GPU that supports it), else "
                              "fp32; a run records what it chose, and why, in config.json ('resolved'). 'fp32': "
                              "float32 throughout. Images are channels-last either way. bfloat16 makes the Atari "
                              "learner ~2x faster on a CPU with AMX, but two Pong seeds took 1.04x and 1.37x the "
                              "frames to +18 (bench/results/pong-bf16*/), so no preset turns it on.")

    @property
    def core_units(self) -> int:
        """The recurrent core's units (0: feed-forward), the last size of every stored core state."""
        return self.core_size if self.core == "lstm" else 0

    def __post_init__(self) -> None:
        _require(self.agent in AGENTS or ":" in self.agent, "learner.agent", self.agent,
                 f"one of {AGENTS}, or 'module:Agent' for an agent of your own (rlbalance.agents.base.Agent)")
        _require(self.device in DEVICES, "learner.device", self.device, f"one of {DEVICES}")
        _require(self.model in MODELS, "learner.model", self.model, f"one of {MODELS}")
        _require(len(self.hidden_sizes) >= 1 and all(h >= 1 for h in self.hidden_sizes),
                 "learner.hidden_sizes", self.hidden_sizes, "a non-empty list of positive sizes")
        _require(self.unroll_length >= 1, "learner.unroll_length", self.unroll_length, "must be >= 1")
        _require(self.batch_size >= 1, "learner.batch_size", self.batch_size, "must be >= 1")
        _require(self.learning_rate > 0, "learner.learning_rate", self.learning_rate, "must be > 0")
        _require(self.torso_precision in ("auto", "fp32", "bf16"), "learner.torso_precision", self.torso_precision,
                 "'auto', 'fp32' or 'bf16'")
        _require(self.lr_schedule in ("linear", "constant"), "learner.lr_schedule", self.lr_schedule,
                 "'linear' or 'constant'")
        _require(self.adam_eps > 0, "learner.adam_eps", self.adam_eps, "must be > 0")
        _require(0.0 <= self.discount <= 1.0, "learner.discount", self.discount, "must be in [0, 1]")
        _require(self.entropy_cost >= 0, "learner.entropy_cost", self.entropy_cost, "must be >= 0")
        _require(self.baseline_cost >= 0, "learner.baseline_cost", self.baseline_cost, "must be >= 0")
        _require(self.max_grad_norm > 0, "learner.max_grad_norm", self.max_grad_norm, "must be > 0")
        for name in ("clip_rho", "clip_c", "clip_pg_rho"):
            _require(getattr(self, name) > 0, f"learner.{name}", getattr(self, name), "must be > 0")
        _require(self.reward_clip >= 0, "learner.reward_clip", self.reward_clip, "must be >= 0")
        _require(self.reward_scale > 0, "learner.reward_scale", self.reward_scale, "must be > 0")
        _require(self.torch_threads >= 1, "learner.torch_threads", self.torch_threads, "must be >= 1")
        _require(self.devices >= 1, "learner.devices", self.devices, "must be >= 1")
        _require(0.0 < self.vtrace_lambda <= 1.0, "learner.vtrace_lambda", self.vtrace_lambda, "must be in (0, 1]")
        _require(self.epochs >= 1, "learner.epochs", self.epochs, "must be >= 1")
        _require(1 <= self.minibatches <= self.batch_size, "learner.minibatches", self.minibatches,
                 f"must be in [1, learner.batch_size={self.batch_size}] (each part holds whole unrolls)")
        _require(self.batch_size % self.minibatches == 0, "learner.minibatches", self.minibatches,
                 f"must divide learner.batch_size={self.batch_size} (equal parts of whole unrolls)")
        _require(0.0 <= self.ppo_clip < 1.0, "learner.ppo_clip", self.ppo_clip, "must be in [0, 1) (0: off)")
        _require(self.minibatch_split in ("unrolls", "steps"), "learner.minibatch_split", self.minibatch_split,
                 "'unrolls' or 'steps'")
        _require(self.minibatch_split == "unrolls" or self.core == "none", "learner.minibatch_split",
                 self.minibatch_split, "'steps' needs a feed-forward model (learner.core=none): a recurrent core "
                 "runs over whole unrolls; use 'unrolls'")
        _require(self.ppo_clip_reference in ("behaviour", "proximal"), "learner.ppo_clip_reference",
                 self.ppo_clip_reference, "'behaviour' or 'proximal'")
        _require(self.core in ("none", "lstm"), "learner.core", self.core, "'none' or 'lstm'")
        _require(self.core_size >= 1, "learner.core_size", self.core_size, "must be >= 1")
        _require(self.data_parallel in ("auto", "ddp"), "learner.data_parallel", self.data_parallel,
                 "'auto' or 'ddp'" + (" (the single-process 'threads' learner was removed: one learner process per "
                                      "device does what it did)" if self.data_parallel == "threads" else ""))
        _require(self.lr_scaling in ("none", "linear", "sqrt"), "learner.lr_scaling", self.lr_scaling,
                 "'none', 'linear' or 'sqrt'")


@dataclass(frozen=True)
class R2D2Config:
    """R2D2's own settings (learner.agent=r2d2): Kapturowski et al. 2019 and SEED RL's Atari values by default."""

    sequence_length: int = _f(80, "Rows of each stored sequence the loss is taken on (after its burn-in); a multiple "
                              "of learner.unroll_length, the replay period (a new sequence every period per env, so "
                              "consecutive sequences overlap by sequence_length - period rows).")
    burn_in: int = _f(40, "Rows before each sequence that only warm the recurrent state up from the stored state (no "
                      "loss there); a multiple of learner.unroll_length (0: none).")
    n_step: int = _f(5, "n of the n-step double Q-learning targets.")
    batch_size: int = _f(64, "Sequences per gradient step, drawn from the replay.")
    replay_size: int = _f(10_000, "Sequences the replay holds (the oldest overwritten); refused before the run starts "
                          "when they would not fit in the free memory.")
    replay_ratio: float = _f(1.0, "Sequences sampled per sequence inserted (Acme's samples per insert): the learner "
                             "trains until it has sampled this many per sequence the actors delivered, and actors "
                             "wait for it where it is slower. Each env step is in sequence_length / period "
                             "sequences, so it is learned from about ratio x that many times.")
    learning_starts: int = _f(1_000, "Sequences in the replay before the first gradient step.")
    target_update_every: int = _f(2_500, "Gradient steps between copies of the online network into the target "
                                  "network.")
    priority_exponent: float = _f(0.9, "alpha: sampling probability proportional to priority ** alpha.")
    importance_exponent: float = _f(0.6, "beta: importance weights (N P(i)) ** -beta, normalised by their batch "
                                    "maximum.")
    priority_eta: float = _f(0.9, "Sequence priority eta max|td| + (1 - eta) mean|td|.")
    initial_priority: str = _f("actor", "A new sequence's priority: 'actor' from the TD errors of the Q-values the "
                               "actors acted by (Ape-X, R2D2, SEED RL: new sequences compete by their own surprise); "
                               "'max' the largest priority seen so far (each new sequence is sampled soon).")
    epsilon_base: float = _f(0.4, "Exploration ladder: env i of N acts epsilon-greedily with base ** (1 + alpha i / "
                             "(N - 1)) (Ape-X, R2D2).")
    epsilon_alpha: float = _f(7.0, "Exploration ladder exponent alpha (see r2d2.epsilon_base).")
    rescale_eps: float = _f(1e-3, "epsilon of the invertible value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + eps x.")

    @property
    def rows(self) -> int:
        """Rows of one stored sequence: burn-in, sequence and the row after it (its last bootstrap observation)."""
        return self.burn_in + self.sequence_length + 1

    def __post_init__(self) -> None:
        for name in ("sequence_length", "n_step", "batch_size", "replay_size", "target_update_every"):
            _require(getattr(self, name) >= 1, f"r2d2.{name}", getattr(self, name), "must be >= 1")
        _require(self.burn_in >= 0, "r2d2.burn_in", self.burn_in, "must be >= 0")
        _require(self.n_step < self.sequence_length, "r2d2.n_step", self.n_step,
                 f"must be below r2d2.sequence_length={self.sequence_length}")
        _require(self.replay_ratio > 0, "r2d2.replay_ratio", self.replay_ratio, "must be > 0")
        _require(self.batch_size <= self.learning_starts <= self.replay_size, "r2d2.learning_starts",
                 self.learning_starts, f"must be in [r2d2.batch_size={self.batch_size}, "
                 f"r2d2.replay_size={self.replay_size}]")
        _require(self.initial_priority in ("actor", "max"), "r2d2.initial_priority", self.initial_priority,
                 "'actor' or 'max'")
        for name in ("priority_exponent", "importance_exponent", "priority_eta"):
            _require(0.0 <= getattr(self, name) <= 1.0, f"r2d2.{name}", getattr(self, name), "must be in [0, 1]")
        _require(0.0 <= self.epsilon_base <= 1.0, "r2d2.epsilon_base", self.epsilon_base, "must be in [0, 1]")
        _require(self.epsilon_alpha >= 0, "r2d2.epsilon_alpha", self.epsilon_alpha, "must be >= 0")
        _require(self.rescale_eps > 0, "r2d2.rescale_eps", self.rescale_eps, "must be > 0")


@dataclass(frozen=True)
class TelemetryConfig:
    """What is logged and how often."""

    log_interval_s: float = _f(2.0, "Seconds between metric records (JSONL and TensorBoard).")
    tensorboard: bool = _f(True, "Write TensorBoard event files beside metrics.jsonl.")
    progress: bool = _f(True, "Show a progress bar with FPS and return.")
    warmup_s: float = _f(3.0, "Seconds excluded from the sustained FPS figure and the verdict at the start.")
    stage_timers: bool = _f(True, "Per-stage timers in every role (cheap; off only to measure their overhead).")
    hardware_interval_s: float = _f(1.0, "Seconds between hardware samples (CPU per core, RSS, GPU, power); "
                                    "0 turns the sampler off.")
    report: bool = _f(True, "Write report.html (plots, stage breakdown, verdict) at the end of the run.")
    wandb: str = _f("off", "Weights & Biases: the TensorBoard scalars, the config and the summary. 'off'; 'offline' "
                    "(a folder under the run directory's wandb/, uploaded later with `wandb sync`); 'online' "
                    "(after `wandb login`). Needs the wandb package: pip install wandb.")
    wandb_project: str = _f("rlbalance", "W&B project name.")
    cpu_watts_per_core: float = _f(10.0, "Power model: watts per fully busy CPU core (used where RAPL is unreadable).")
    cpu_idle_watts: float = _f(20.0, "Power model: CPU package idle watts.")
    gpu_idle_watts: float = _f(60.0, "Power model: GPU idle watts (used for planning; a GPU present is measured).")
    gpu_busy_watts: float = _f(300.0, "Power model: GPU watts at full load.")
    base_watts: float = _f(100.0, "Power model: the rest of the node (memory, disks, fans), always modeled.")

    def __post_init__(self) -> None:
        _require(self.log_interval_s > 0, "telemetry.log_interval_s", self.log_interval_s, "must be > 0")
        _require(self.wandb in WANDB_MODES, "telemetry.wandb", self.wandb, f"one of {WANDB_MODES}")
        if self.wandb != "off":
            import importlib.util

            _require(importlib.util.find_spec("wandb") is not None, "telemetry.wandb", self.wandb,
                     "the wandb package is not installed: pip install wandb (or: pip install -e '.[wandb]'), "
                     "or leave telemetry.wandb=off")
        _require(bool(self.wandb_project.strip()), "telemetry.wandb_project", self.wandb_project, "must not be empty")
        _require(self.warmup_s >= 0, "telemetry.warmup_s", self.warmup_s, "must be >= 0")
        _require(self.hardware_interval_s >= 0, "telemetry.hardware_interval_s", self.hardware_interval_s,
                 "must be >= 0 (0: off)")
        for name in ("cpu_watts_per_core", "cpu_idle_watts", "gpu_idle_watts", "gpu_busy_watts", "base_watts"):
            _require(getattr(self, name) >= 0, f"telemetry.{name}", getattr(self, name), "must be >= 0")


@dataclass(frozen=True)
class RunConfig:
    """The run as a whole."""

    total_steps: int = _f(500_000, "Environment steps to train for (counted where the learner consumes them).")
    seed: int = _f(0, "Seed for envs, model init and sampling.")
    mode: str = _f("parallel", "'parallel' (actor processes) or 'serial' (everything in one process).")
    out_dir: str = _f("runs", "Parent folder of run directories.")
    name: str = _f("", "Run directory name (empty: env id and a timestamp).")
    checkpoint_interval_s: float = _f(60.0, "Seconds between checkpoints (a final one is always written).")
    max_seconds: float = _f(0.0, "Stop after this many seconds of training, counted from the first "
                                 "update, so process start-up is not part of it (0: no limit).")
    preset: str = _f("auto", "Settings of an env family under the config file and command line: 'auto' picks "
                     "it from env.id ('atari' for ALE ids, 'toy' for rlbalance/ ids, 'synthetic', 'continuous' for "
                     "Box actions, 'classic' for the rest), "
                     "'none' uses the bare defaults; "
                     "config.json records the one used.")
    balance: str = _f("off", "'auto': while it trains, the run measures itself in windows and moves its layout "
                      "(actor processes, learner threads, the inference server's wait) toward the best throughput on "
                      "this machine, keeping a move only if it measures better (local actor processes, one learner; "
                      "summary.json's balance and the run directory's balanced.json say what it found); 'ga3c': "
                      "GA3C's method instead, as a baseline (every 20 s one knob moves one step at random, moved "
                      "back if throughput fell); 'off': the layout stays as configured.")
    balance_window_s: float = _f(5.0, "run.balance=auto: seconds in one measured window (each layout is measured "
                                 "over 3 windows, after one to settle).")
    balance_max_actors: int = _f(0, "run.balance=auto: most actor processes it may run (0: twice the cores the run "
                                 "may use, at least actors.num_actors).")
    balance_min_gain: float = _f(0.05, "run.balance=auto: the least measured gain a move must show to be kept "
                                 "(and beyond twice its windows' standard error).")

    def __post_init__(self) -> None:
        _require(self.balance in BALANCE_MODES, "run.balance", self.balance, f"one of {BALANCE_MODES}")
        _require(self.balance_window_s > 0, "run.balance_window_s", self.balance_window_s, "must be > 0")
        _require(self.balance_max_actors >= 0, "run.balance_max_actors", self.balance_max_actors,
                 "must be >= 0 (0: twice the cores)")
        _require(0 <= self.balance_min_gain < 1, "run.balance_min_gain", self.balance_min_gain,
                 "must be in [0, 1), e.g. 0.05")
        _require(self.total_steps >= 1, "run.total_steps", self.total_steps, "must be >= 1")
        _require(self.mode in MODES, "run.mode", self.mode, f"one of {MODES}")
        _require(self.checkpoint_interval_s > 0, "run.checkpoint_interval_s", self.checkpoint_interval_s,
                 "must be > 0")
        _require(self.max_seconds >= 0, "run.max_seconds", self.max_seconds, "must be >= 0")
        _require(self.name == "" or (self.name not in (".", "..") and "/" not in self.name and "\\" not in self.name
                                     and not self.name.startswith(".")), "run.name", self.name,
                 "a plain folder name inside run.out_dir (no '/', no leading '.')")
        from rlbalance.config.presets import PRESET_NAMES

        _require(self.preset in PRESET_NAMES, "run.preset", self.preset, f"one of {PRESET_NAMES}")
