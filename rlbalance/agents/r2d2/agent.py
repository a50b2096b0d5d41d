"""R2D2 as the runtime runs it: ``R2D2Agent`` (the learner side: batches of unrolls in, sequences of consecutive
unrolls per env into the replay, gradient steps at the asked replay ratio) and ``R2D2`` (the registry's entry: its net,
checks, exploration ladder, checkpoint identity and calibration)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from rlbalance.agents.base import Agent, LearnerBase, StepField, learning_rate, shape_rewards
from rlbalance.agents.nets import check_cnn_shape, load_optimizer, resolve_model
from rlbalance.agents.r2d2.algo import env_epsilons, initial_priorities
from rlbalance.agents.r2d2.learner import R2D2Learner, R2D2Settings
from rlbalance.agents.r2d2.net import R2D2Net
from rlbalance.agents.r2d2.replay import SequenceAssembler, SequenceReplay
from rlbalance.core.distributed import all_min
from rlbalance.core.distributed import rank as dist_rank
from rlbalance.core.distributed import world_size as dist_world_size
from rlbalance.core.errors import ConfigError
from rlbalance.telemetry.metrics import EpisodeStats

GREEDY_EPSILON = 0.01  # envs exploring at most this often count as the near-greedy ones (their returns apart)


class R2D2Agent(LearnerBase):
    """R2D2 behind the learners' interface (``LearnerBase``: ``train(batch)``, ``updates``, ``steps``, ``model``,
    ``state_dict``): each batch of unrolls becomes sequences in the replay; then gradient steps on prioritised
    samples until the replay ratio asked for (r2d2.replay_ratio sequences sampled per sequence inserted, counted
    from r2d2.learning_starts) is met. The learner takes its next batch of unrolls only after those steps, so where
    it is slower the actors run out of free buffers and wait: the ratio holds and what it costs shows up as a
    learner-bound run.

    With N learner processes (learner.devices > 1) each rank keeps a replay of its own actors' sequences (no sequence
    crosses processes: nothing but gradients and two counts per step do), of 1/N of r2d2.replay_size, learning from
    1/N of r2d2.learning_starts, sampling 1/N of r2d2.batch_size per step; all take as many gradient steps, the
    fewest any rank's replay ratio asks for, with the gradients averaged at each (DistributedDataParallel): one step
    is r2d2.batch_size sequences in all, as with one learner. The rank whose replay asks for the fewest steps holds
    the asked ratio; another (one whose actor restarted and broke its chains, say) may sample a little below it."""

    def __init__(self, model: R2D2Net, cfg, device: torch.device, obs_shape: tuple[int, ...], obs_dtype,
                 step_lock=None, distributed: bool = False):
        lc, r = cfg.learner, cfg.r2d2
        self.cfg, self.r = cfg, r
        settings = R2D2Settings(discount=lc.discount, n_step=r.n_step, burn_in=r.burn_in,
                                learning_rate=lc.learning_rate, adam_eps=lc.adam_eps, max_grad_norm=lc.max_grad_norm,
                                target_update_every=r.target_update_every, priority_eta=r.priority_eta,
                                rescale_eps=r.rescale_eps)
        self.world = dist_world_size() if distributed else 1
        self.algo = R2D2Learner(model, settings, device, step_lock, distributed=distributed)
        self.model, self.device, self.optimizer = self.algo.net, self.algo.device, self.algo.optimizer
        units = (r.burn_in + r.sequence_length) // lc.unroll_length
        self.assembler = SequenceAssembler(units)
        # Several learner processes share out the replay, its warm-up and each gradient step's batch evenly, so N of
        # them with 1/N of the actors each run the algorithm one learner runs (the same updates, batch and target
        # period per env step); one process: r2d2.replay_size, learning_starts and batch_size as they are
        n = self.world
        self.batch, self.learning_starts = r.batch_size // n, -(-r.learning_starts // n)
        self.replay = SequenceReplay(-(-r.replay_size // n), r.rows, obs_shape, obs_dtype,
                                     model.state_size, alpha=r.priority_exponent,
                                     seed=cfg.run.seed + 1_000_003 * dist_rank() if self.world > 1 else cfg.run.seed,
                                     field="r2d2.replay_size", num_actions=model.num_actions)
        self.steps = 0
        self.last: dict[str, float] = {}
        self.totals = {"insert_s": 0.0, "sample_s": 0.0, "priority_s": 0.0}
        # The episodes of the envs that explore least (epsilon <= GREEDY_EPSILON on the ladder): the reported return
        # mixes in envs acting at random up to r2d2.epsilon_base of the time, which understates the policy
        # (with several learner processes each rank's actors run the ladder over their own envs: rank_config's)
        self.env_epsilon = env_epsilons(cfg.rank_config(dist_rank()) if self.world > 1 else cfg)
        self.greedy_episodes = EpisodeStats()

    def relayout(self, cfg) -> None:
        self.env_epsilon = env_epsilons(cfg)

    @property
    def updates(self) -> int:  # type: ignore[override]  # (LearnerBase declares the attribute others assign)
        return self.algo.updates

    def lr_now(self) -> float:
        return learning_rate(self.cfg.learner, self.steps, self.cfg.run.total_steps, self.world)

    def _rewards(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        reward = shape_rewards(batch["reward"], self.cfg.learner)
        return batch if reward is batch["reward"] else {**batch, "reward": reward}

    def sample_sequences(self, batch_size: int | None = None) -> dict[str, torch.Tensor]:
        """A batch of sequences shaped as the replay gives them (zeros where the replay is still empty): what a
        profile times one gradient step on."""
        n = batch_size or self.batch
        rp = self.replay
        if rp.filled >= n:
            _, _, seq = rp.sample(n, self.r.importance_exponent)
            seq.pop("generation")
            return seq
        t1 = rp.seq_len
        return {"obs": torch.from_numpy(np.zeros((t1, n, *rp.obs.shape[2:]), dtype=rp.obs.dtype)),
                "action": torch.zeros(t1, n, dtype=torch.int64), "reward": torch.zeros(t1, n),
                "done": torch.zeros(t1, n, dtype=torch.bool), "first": torch.zeros(t1, n, dtype=torch.bool),
                "core": torch.zeros(n, rp.core.shape[1])}

    def timed_step(self, batch: dict[str, torch.Tensor] | None = None) -> None:
        """One gradient step as a run takes it (a prioritised sample from the replay, the update, the new
        priorities), the replay first given a batch of zero sequences where it holds fewer: what calibration and the
        learner-ceiling bench time."""
        rp, n = self.replay, self.batch
        if rp.filled < n:
            z = self.sample_sequences(n)
            rp.add({k: v.numpy() if k == "core" else np.swapaxes(v.numpy(), 0, 1) for k, v in z.items()})
        slots, weights, seq = rp.sample(n, self.r.importance_exponent)
        generation = seq.pop("generation")
        out = self.algo.train(seq, weights)
        rp.update_priorities(slots, out["priorities"].numpy(), generation.numpy())

    def new_priorities(self, seqs: dict[str, np.ndarray]) -> np.ndarray | None:
        """The priorities new sequences enter the replay with (r2d2.initial_priority; None: the replay's largest)."""
        if self.r.initial_priority != "actor":
            return None
        s = self.algo.s
        return initial_priorities(seqs, s.burn_in, s.n_step, s.discount, s.priority_eta, s.rescale_eps)

    def steps_due(self) -> int:
        """The gradient steps the replay ratio asks for now (each samples a batch); with several learner ranks the
        fewest any rank's replay asks for, so that every rank takes as many (their gradients are averaged at each)."""
        rp, r = self.replay, self.r
        n = 0
        if rp.filled >= self.learning_starts:
            target = r.replay_ratio * (rp.inserted - self.learning_starts)
            while rp.sampled + n * self.batch < target:  # (each step samples a batch)
                n += 1
        return int(all_min(n, self.device)) if self.world > 1 else n

    def train(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        t0 = time.perf_counter()
        seqs = self.assembler.add(self._rewards(batch))
        if seqs is not None:
            self.replay.add(seqs, self.new_priorities(seqs))
        t1 = time.perf_counter()
        self.steps += (batch["action"].shape[0] - 1) * batch["action"].shape[1] * self.world  # every rank as many
        self._note_greedy_episodes(batch)
        times = {"time_h2d": 0.0, "time_fwd_bwd": 0.0, "time_optim": 0.0, "time_replay_insert": t1 - t0,
                 "time_replay_sample": 0.0, "time_priority_update": 0.0}
        sums: dict[str, float] = {}
        n = 0
        for _ in range(self.steps_due()):
            ta = time.perf_counter()
            slots, weights, seq = self.replay.sample(self.batch, self.r.importance_exponent)
            generation = seq.pop("generation")
            tb = time.perf_counter()
            for g in self.optimizer.param_groups:
                g["lr"] = self.lr_now()
            out = self.algo.train(seq, weights)
            tc = time.perf_counter()
            self.replay.update_priorities(slots, out.pop("priorities").numpy(), generation.numpy())
            td = time.perf_counter()
            times["time_replay_sample"] += tb - ta
            times["time_priority_update"] += td - tc
            for key in ("time_h2d", "time_fwd_bwd", "time_optim"):
                times[key] += out.pop(key)
            for key, v in out.items():
                sums[key] = sums.get(key, 0.0) + v
            n += 1
        if n:
            self.last = {k: v / n for k, v in sums.items()}
        self.totals["insert_s"] += times["time_replay_insert"]
        self.totals["sample_s"] += times["time_replay_sample"]
        self.totals["priority_s"] += times["time_priority_update"]
        rp = self.replay
        return {**self.last, **times, "lr": self.lr_now(), "grad_steps": float(n),
                "replay_fill": rp.filled / rp.capacity, "replay_ratio": rp.replay_ratio(),
                "replay_sequences": float(rp.inserted)}

    def _note_greedy_episodes(self, batch: dict[str, torch.Tensor]) -> None:
        end = batch["ep_end"][:-1].numpy()
        if not end.any():
            return
        clients = batch["client"].numpy()
        eps = self.env_epsilon[clients].reshape(-1)  # [n_buf * K]: each of the batch's columns
        self.greedy_episodes.add_from_batch(batch["ep_return"][:-1].numpy(), batch["ep_length"][:-1].numpy(),
                                            end & (eps <= GREEDY_EPSILON)[None, :])

    def replay_figures(self) -> dict:
        """For telemetry.json and the summary: what the replay did this session."""
        rp, r = self.replay, self.r
        since = rp.inserted - self.learning_starts
        return {"ratio_asked": r.replay_ratio, "ratio_achieved": rp.replay_ratio(),
                "ratio_since_learning_starts": rp.sampled / since if since > 0 else None, "inserted": rp.inserted,
                "sampled": rp.sampled, "fill": rp.filled / rp.capacity, "capacity": rp.capacity,
                "sequence_rows": rp.seq_len, "bytes": rp.bytes, "learning_starts": self.learning_starts,
                "insert_s": self.totals["insert_s"], "sample_s": self.totals["sample_s"],
                "priority_update_s": self.totals["priority_s"],
                "greedy_return_last100": self.greedy_episodes.mean_return(),
                "greedy_episodes": self.greedy_episodes.count, "greedy_epsilon_max": GREEDY_EPSILON,
                "greedy_envs": int((self.env_epsilon <= GREEDY_EPSILON).sum()),
                "note": "sequences sampled per sequence inserted; the replay's contents are not checkpointed (a "
                        "resumed run refills it, learning_starts sequences before its next gradient step)"}

    def scalars(self) -> dict[str, float]:
        return {"episode_return_greedy": self.greedy_episodes.mean_return()}

    def figures(self) -> dict:
        return {"replay": self.replay_figures()}

    def annotate_verdict(self, verdict: dict) -> None:
        replay_verdict(verdict, self.replay_figures())

    def state_dict(self) -> dict:
        a = self.algo
        return {"model": a.net.state_dict(), "target": a.target.state_dict(), "optimizer": a.optimizer.state_dict(),
                "updates": a.updates, "steps": self.steps,
                "replay_counts": {"inserted": self.replay.inserted, "sampled": self.replay.sampled},
                "greedy_episodes": self.greedy_episodes.state()}

    def load_state_dict(self, state: dict) -> None:
        a = self.algo
        a.net.load_state_dict(state["model"])
        a.target.load_state_dict(state["target"])
        load_optimizer(a.optimizer, state["optimizer"])
        a.updates = int(state["updates"])
        self.steps = int(state["steps"])
        # (checkpoints from before it was kept start the near-greedy mean again)
        self.greedy_episodes.restore(state.get("greedy_episodes", {}))


def replay_verdict(verdict: dict, replay: dict) -> None:
    """R2D2: what the verdict means for the replay. The learner samples r2d2.replay_ratio sequences per sequence
    inserted and takes no new unrolls until it has, so it never falls behind the asked ratio: where it is the
    slower side the actors wait (learner-bound), where the actors are, the replay starves and the learner waits
    (actor-bound)."""
    asked, got = replay["ratio_asked"], replay.get("ratio_since_learning_starts")
    held = f"replay ratio {got:.2f} of the {asked:g} asked since learning started" if got is not None else \
        f"the replay has not reached r2d2.learning_starts={replay['learning_starts']} sequences yet"
    if verdict["verdict"] == "learner-bound":
        verdict["evidence"] += (f"; R2D2 holds the {held} by making the actors wait for the learner's gradient "
                                "steps")
        verdict["advice"] += ("; with R2D2, a lower r2d2.replay_ratio or r2d2.batch_size trades sample reuse for "
                              "throughput")
    elif verdict["verdict"] == "actor-bound":
        verdict["evidence"] += (f"; the actors starve the replay: the learner has taken its samples ({held}) and "
                                "waits for new sequences")
    else:
        verdict["evidence"] += f"; R2D2: {held}"
    verdict["figures"]["replay_ratio_asked"] = asked
    verdict["figures"]["replay_ratio_since_learning_starts"] = got


class R2D2(Agent):
    """R2D2 (Kapturowski et al. 2019) as SEED RL runs it: the registry's entry."""

    name = "r2d2"
    greedy_eval = True  # a Q-network: its greedy action (no exploration rate when evaluated)
    # its gradient step is set by r2d2.batch_size; learner.batch_size only has to hold K unrolls
    unused_fields = frozenset({("learner", "batch_size"), ("learner", "epochs"), ("learner", "minibatches")})
    workload_fields = (("r2d2", "batch_size"), ("r2d2", "sequence_length"), ("r2d2", "burn_in"), ("r2d2", "replay_ratio"))

    def check(self, cfg, spec) -> None:  # (a non-Discrete action space: build_net refuses it first)
        # a replay that would not fit fails here, before the run directory exists (several learner processes share it
        # out, see R2D2Agent: on one node it takes the same memory in all)
        r = cfg.r2d2
        SequenceReplay.check_fits(r.replay_size, r.rows, spec.obs_shape, spec.obs_dtype,
                                  self.state_size(cfg.learner, spec), "r2d2.replay_size", num_actions=spec.num_actions)

    def build_net(self, cfg, spec) -> R2D2Net:
        if spec.action.kind != "discrete":
            raise ConfigError(f"learner.agent=r2d2 needs a Discrete action space (Q-learning over actions); this env "
                              f"has {spec.action.describe()}: use learner.agent=vtrace")
        cnn = resolve_model(cfg, spec) == "nature_cnn"
        if cnn:
            check_cnn_shape(spec)
        return R2D2Net(spec.obs_shape, spec.num_actions, cfg.hidden_sizes, cfg.core_units, cnn=cnn)

    def make_learner(self, net, cfg, spec, device, step_lock=None, distributed: bool = False) -> R2D2Agent:
        return R2D2Agent(net, cfg, device, spec.obs_shape, spec.obs_dtype, step_lock=step_lock,
                         distributed=distributed)

    def step_record(self, cfg, spec) -> dict[str, StepField]:
        # the Q-values each action was chosen by: a sequence's first priority is taken from them (see replay)
        return {"q": StepField((spec.num_actions,))}

    def acting_values(self, cfg) -> np.ndarray:
        return env_epsilons(cfg)  # each env's exploration rate on the ladder

    def short_run(self, cfg) -> dict:
        b = cfg.r2d2.batch_size  # the learner trains from the first batch of sequences on, on a replay of one batch
        return {"r2d2": {"learning_starts": b, "replay_size": b}}

    def step_sizes(self, cfg, quick: bool) -> list[int]:
        return sorted({*([16, 32] if quick or cfg.env.is_atari else [16, 32, 64]), cfg.r2d2.batch_size})

    def sized(self, cfg, batch_size: int):
        # a replay of one batch of zero sequences: an Atari-sized replay would take GiBs before anything is timed
        b = batch_size
        return replace(cfg, r2d2=replace(cfg.r2d2, batch_size=b, replay_size=b, learning_starts=b))

    def learner_work(self, cfg) -> dict:
        b, rows = cfg.r2d2.batch_size, cfg.r2d2.rows
        # a gradient step on B sequences is due for every B x T / ratio env steps the actors deliver; forwards of
        # both nets over every row, a backward (about two forwards) over the rows after the burn-in
        return {"batch_size": b, "rows_per_sample": rows,
                "env_steps_per_train_step": b * cfg.learner.unroll_length / cfg.r2d2.replay_ratio,
                "row_forwards_per_sample": 2 * rows + 2 * (rows - cfg.r2d2.burn_in)}
