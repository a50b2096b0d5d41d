"""What both runners share: metrics, telemetry, checkpoints, progress, stop conditions, the summary."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlbalance.agents import registry
from rlbalance.agents.base import LearnerBase
from rlbalance.agents.nets import resolve_model
from rlbalance.config import Config
from rlbalance.core.jsonio import atomic_write_json
from rlbalance.core.thinned import Thinned
from rlbalance.core.timing import StageTimer
from rlbalance.envs.batch import EnvSpec
from rlbalance.runtime.role_figures import (
    VERDICT_CAP,
    RoleShares,
    _timed,
    straggling_rank,
    update_figures,
)
from rlbalance.runtime.roles import NO_FAULTS, ActorSet, NodeFigures
from rlbalance.runtime.rundir import RunDir
from rlbalance.telemetry.hardware import HardwareSampler, PowerModel
from rlbalance.telemetry.metrics import EpisodeStats, MetricsLogger, Progress
from rlbalance.telemetry.verdict import decide


def checkpoint_identity(cfg: Config, spec: EnvSpec) -> dict:
    """What a checkpoint belongs to: written into every checkpoint, checked before one is loaded."""
    ident = {"env": cfg.env.id, "obs_shape": list(spec.obs_shape), "obs_dtype": str(spec.obs_dtype),
             "num_actions": spec.num_actions, "action_space": spec.action.describe(),
             "model": resolve_model(cfg.learner, spec)}
    return {**ident, **registry.get(cfg.learner.agent).identity(cfg)}


class Session:
    def __init__(self, cfg: Config, run: RunDir, learner: LearnerBase, spec: EnvSpec, episodes: EpisodeStats,
                 model_lock: threading.Lock, session_index: int = 0):
        self.cfg, self.run, self.learner, self.spec, self.episodes = cfg, run, learner, spec, episodes
        self.model_lock = model_lock
        tc = cfg.telemetry
        wandb = None
        if tc.wandb != "off":
            wandb = {"mode": tc.wandb, "project": tc.wandb_project, "config": cfg.to_dict()}
        self.logger = MetricsLogger(run.path, tc.tensorboard, spec.frames_per_step, tc.warmup_s,
                                    start_steps=learner.steps, session=session_index, wandb=wandb)
        self.progress = Progress(cfg.run.total_steps, tc.progress, start=learner.steps)
        self.timer = StageTimer(tc.stage_timers)  # the learner role's own stages
        self.gpu_timer = StageTimer()  # device busy time (CUDA events) of training and inference
        self.start_steps = learner.steps
        self.t_start = time.perf_counter()
        self.last_log = self.last_ckpt = self.t_start
        # A short run still gets a curve: a record every 1% of run.total_steps too (at most ~100 more records).
        self.last_log_steps, self.log_every_steps = learner.steps, cfg.run.total_steps / 100
        self.last_train: dict[str, float] = {}
        self.policy_lag: list[float] = []
        self.lag_total, self.lag_count = 0.0, 0
        self.window: dict[str, dict] = {}  # the latest stage snapshot of each role
        self.cumulative = RoleShares()  # after warm-up
        self.cumulative_all = RoleShares()  # the whole run, for runs shorter than the warm-up
        self.batch_sizes: Counter = Counter()
        self.extra_scalars: dict[str, float] = {}
        self.verdicts: Thinned[dict] = Thinned(VERDICT_CAP)  # a verdict per record: bounded for any run length
        self._shown_fps, self._shown_steps = 0.0, learner.steps  # what the progress bar shows
        self.actors: ActorSet | None = None  # the runner's actor set (attach_actors): restarts, lost actor-seconds
        self.nodes: NodeFigures | None = None  # per-node CPU figures the Ray actors report (node_figures)
        self.extra_info: dict[str, object] = {}  # runner facts for telemetry.json and the summary
        self.ranks: Any = None  # learner ranks 1..N-1 (ddp_runner.Ranks, attach_ranks) where learner.devices > 1
        self.rank_shares: dict[int, RoleShares] = {}  # each learner rank's roles, after warm-up
        self.rank_shares_all: dict[int, RoleShares] = {}  # ... and over the whole run (for runs shorter than it)
        self.rank_batch_sizes: dict[int, Counter] = {}  # ranks 1..N-1's inference batch sizes
        self.rank_actor_faults: dict[int, dict] = {}  # ranks 1..N-1's actor restarts and lost actor-seconds
        self.balancer: Any = None  # run.balance=auto: the runner's balance.Balancer (attach_balancer)
        self._moves_logged = 0  # the balancer's moves already in metrics.jsonl
        self.sampler = None
        if tc.hardware_interval_s > 0:
            self.sampler = HardwareSampler(tc.hardware_interval_s, PowerModel(
                tc.cpu_watts_per_core, tc.cpu_idle_watts, tc.gpu_idle_watts, tc.gpu_busy_watts, tc.base_watts))
            self.sampler.start()

    # what the runners tell the session (roles.RunSession): nothing is set on it from outside
    def attach_actors(self, actors: ActorSet) -> None:
        """The runner's actor set, whose fault ledger the metrics and the summary report."""
        self.actors = actors

    def node_figures(self, make: Callable[[], NodeFigures]) -> NodeFigures:
        """The per-node figures the actors report into (made by ``make`` at the first call)."""
        if self.nodes is None:
            self.nodes = make()
        return self.nodes

    def watch_process(self, role: str, pid: int) -> None:
        """A process of ``role`` (an actor) for the hardware sampler to count."""
        if self.sampler is not None:
            self.sampler.watch(role, pid)

    def set_scalars(self, scalars: dict[str, float]) -> None:
        """Figures of the runner (queue depths, the inference batch) for the next metrics record."""
        self.extra_scalars.update(scalars)

    def add_batch_sizes(self, sizes: Iterable[int]) -> None:
        """Inference batch sizes served (counted after warm-up)."""
        if self.warm:
            self.batch_sizes.update(sizes)

    def note_info(self, key: str, value: Any) -> None:
        """A runtime's own facts (a Ray placement, a process group) for telemetry.json and the summary."""
        self.extra_info[key] = value

    def attach_balancer(self, balancer: Any) -> None:
        """run.balance=auto: the runner's balancer, fed the roles' stage times; its layout goes into every metrics
        record, each move into the record after it, and what it found into summary.json and balanced.json."""
        self.balancer = balancer

    def attach_ranks(self, ranks: Any, info: dict) -> None:
        """Learner ranks 1..N-1 (ddp_runner.Ranks): stops are agreed with them and their reports merged."""
        self.ranks = ranks
        self.note_info("data_parallel", info)

    def merge_rank_report(self, msg: dict, world: int) -> None:
        """One learner rank's report (ddp_runner.RankSession.take_report): its episodes, policy lag, actor faults,
        node reports, each role's stage times (into the run's roles, for the verdict, and into the rank's own) and
        its inference batch sizes."""
        r = msg["rank"]
        self.rank_actor_faults[r] = {"actor_restarts": msg["actor_restarts"],
                                     "actor_seconds_lost": msg["actor_seconds_lost"]}
        if msg["episodes"]:
            rets, lens = zip(*msg["episodes"])
            self.episodes.add_from_batch(np.array(rets), np.array(lens), np.ones(len(rets), dtype=bool))
        for lag in msg["lags"]:
            self.note_lag(lag)
        if self.nodes is not None:  # (a rank's actors are numbered from 0: the run's numbers follow on)
            share = self.cfg.actors.num_actors // world
            for rep in msg.get("node_reports", []):
                self.nodes.add({**rep, "actor": r * share + rep["actor"]})
        for role, snaps in msg["roles"].items():
            for snap in snaps:
                self.role_snapshot(role, snap, rank=r)
        if msg["warm"]:  # (rank 0 counts its own after warm-up too)
            sizes = {int(k): v for k, v in msg["batch_sizes"].items()}
            self.rank_batch_sizes.setdefault(r, Counter()).update(sizes)
            self.batch_sizes.update(sizes)

    @property
    def warm(self) -> bool:
        """Past warm-up, counted from the first update (actor start-up is not steady state)."""
        first = self.logger.first_t
        return first is not None and time.perf_counter() - first >= self.cfg.telemetry.warmup_s

    def done(self) -> bool:
        if self.ranks is None:
            return self._done()
        return self.ranks.done(self, self._done())  # every learner rank stops at the same update

    def _done(self) -> bool:
        if self.learner.steps >= self.cfg.run.total_steps:
            return True
        first = self.logger.first_t  # run.max_seconds counts training time, from the first update
        return bool(self.cfg.run.max_seconds) and first is not None and \
            time.perf_counter() - first >= self.cfg.run.max_seconds

    def role_snapshot(self, role: str, snap: dict, rank: int = 0) -> None:
        """Stage times reported by a role (actors, inference server) since its last report; ``rank``: the learner
        rank whose role it is (learner.data_parallel=ddp; its figures are kept apart as well)."""
        if self.ranks is not None and self.warm:
            self.rank_shares.setdefault(rank, RoleShares()).add(role, snap)
        if self.ranks is not None:
            self.rank_shares_all.setdefault(rank, RoleShares()).add(role, snap)
        if role in self.window and self.window[role] is not snap:
            prev = self.window[role]
            merged = {"wall_s": prev["wall_s"] + snap["wall_s"],
                      "seconds": dict(Counter(prev["seconds"]) + Counter(snap["seconds"])),
                      "count": dict(Counter(prev.get("count", {})) + Counter(snap.get("count", {})))}
            self.window[role] = merged
        else:
            self.window[role] = snap
        self.cumulative_all.add(role, snap)
        if self.warm:
            self.cumulative.add(role, snap)
        if self.balancer is not None:
            self.balancer.feed(role, snap)

    def after_update(self, batch: dict[str, torch.Tensor], train_stats: dict[str, float]) -> None:
        rets, lens, lag = update_figures(batch, train_stats, self.learner.updates, self.timer, self.gpu_timer)
        self.episodes.add_from_batch(rets, lens, np.ones(len(rets), dtype=bool))
        self.note_lag(lag)
        self.last_train = train_stats
        self.logger.note_steps(self.learner.steps)
        now = time.perf_counter()
        if now - self.last_log >= self.cfg.telemetry.log_interval_s or (
                self.learner.steps - self.last_log_steps >= self.log_every_steps):
            self.log(now)
        if now - self.last_ckpt >= self.cfg.run.checkpoint_interval_s:
            self.checkpoint()

    def note_lag(self, lag: float) -> None:
        """The policy lag of one batch (updates between the behaviour policy and the one trained)."""
        self.policy_lag.append(lag)
        if self.warm:
            self.lag_total += lag
            self.lag_count += 1

    def log(self, now: float | None = None, final: bool = False) -> dict:
        now = now or time.perf_counter()
        steps = self.learner.steps
        scalars = {f"loss/{k}": v for k, v in self.last_train.items() if not k.startswith("time_")}
        scalars.update({
            "episode_return": self.episodes.mean_return(), "episode_length": self.episodes.mean_length(),
            "episodes": self.episodes.count, "updates": self.learner.updates,
            "policy_lag": float(np.mean(self.policy_lag)) if self.policy_lag else math.nan,
        })
        scalars.update(self.learner.scalars())
        self.role_snapshot("learner", self.timer.snapshot(reset=True))
        if self.gpu_timer.total:  # shares of the GPU: its busy fraction for training and for inference
            self.role_snapshot("gpu", self.gpu_timer.snapshot(reset=True))
        window_shares = {role: StageTimer.shares(snap) for role, snap in self.window.items()}
        for role, sh in window_shares.items():
            scalars.update({f"{role}/share_{k}": v for k, v in sh.items()})
        self.window.clear()
        scalars.update(self.extra_scalars)
        if self.nodes is not None:
            scalars.update(self.nodes.scalars())
        if self.actors is not None:
            scalars["actors/restarts"] = self.actors.ledger.restarts
            scalars["actors/lost_seconds"] = self.actors.ledger.pending_lost_seconds()
        if self.sampler is not None and self.sampler.last is not None:
            s = self.sampler.last
            scalars["hw/cpu_util"] = float(np.mean(s.cpu_per_core))
            scalars.update({f"hw/cpu_cores_{role}": v for role, v in s.proc_cpu.items()})
            scalars["hw/cpu_power_w"] = s.cpu_power_w
            if s.gpus:  # no GPU series on a machine without one
                scalars["hw/gpu_power_w"] = s.gpu_power_w
            for i, g in enumerate(s.gpus):
                scalars[f"hw/gpu{i}_util"] = g["util"]
        if self.balancer is not None:
            scalars.update(self.balancer.scalars())
            new = self.balancer.moves[self._moves_logged:]
            if new:  # (metrics.jsonl only: TensorBoard takes the numbers above)
                scalars["balance_moves"] = new
                self._moves_logged += len(new)
        v = decide(window_shares, self.cfg.inference.mode == "central")
        scalars["verdict"] = v["verdict"]
        self.verdicts.append({"steps": steps, "verdict": v["verdict"]})
        self.policy_lag.clear()
        rec = self.logger.log(steps, scalars, final=final)
        if steps > self._shown_steps:  # a record with no new steps (the final one) keeps the FPS shown
            self._shown_fps, self._shown_steps = rec["fps"], steps
        self.progress.update(steps, self._shown_fps, scalars["episode_return"])
        self.last_log, self.last_log_steps = now, steps
        return rec

    def checkpoint(self) -> Path:
        self.last_ckpt = time.perf_counter()
        state = self.learner.state_dict()
        state.update({f"episodes_{k}": v for k, v in self.episodes.state().items()})
        state.update(torch_rng=torch.get_rng_state(), identity=checkpoint_identity(self.cfg, self.spec))
        return self.run.save_checkpoint(state)

    def telemetry(self) -> dict:
        hw = self.sampler.summary() if self.sampler is not None else {}
        cum, warm = _timed(self.cumulative, self.cumulative_all)
        shares = cum.shares()
        machine = {"gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                   "learner_device": str(self.learner.device)}
        verdict = decide(shares, self.cfg.inference.mode == "central", hw, machine)
        verdict["window"] = "after warm-up" if warm else "whole run (shorter than telemetry.warmup_s)"
        sps = self.logger.sustained_sps(self.learner.steps)
        latencies = {"actor_request_latency_ms": cum.mean_ms("actor", "wait_action"),
                     "inference_forward_ms": cum.mean_ms("inference", "forward"),
                     "learner_update_ms": (cum.mean_ms("learner", "fwd_bwd") or 0) + (cum.mean_ms("learner", "optim") or 0)}
        per_step = self.transport_bytes_per_step()
        transport = {"bytes_per_step": per_step, "source": "derived from buffer sizes and counted steps",
                     "bytes_per_s": per_step * sps}
        if self.ranks is not None:
            ranks = self.rank_figures()
            self.extra_info["learner_ranks"] = ranks
            straggler = straggling_rank(ranks)
            if straggler:
                verdict["straggler"] = straggler
                verdict["evidence"] += "; " + straggler["evidence"]
        self.extra_info.update(self.learner.figures())  # the agent's own figures (a replay's, ...)
        self.learner.annotate_verdict(verdict)  # and what the verdict means for it
        return {"stage_shares": shares, "hardware": hw, "verdict": verdict, "latency_ms": latencies,
                "transport": transport,
                "verdict_timeline": self.verdicts.items(),
                "nodes": self.nodes.summary() if self.nodes is not None else {},
                **self.extra_info,
                "inference_batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "hardware_timeline": self.sampler.timeline() if self.sampler is not None else []}

    def rank_figures(self) -> dict[str, dict]:
        """Each learner rank's stage shares and inference batch sizes (learner.data_parallel=ddp)."""
        others: Counter = Counter()
        for c in self.rank_batch_sizes.values():
            others.update(c)
        sizes = {0: self.batch_sizes - others, **self.rank_batch_sizes}
        out = {}
        for r in range(self.cfg.learner.devices):
            b = sizes.get(r, Counter())
            n = sum(b.values())
            faults = self.rank_actor_faults.get(r) or (
                self.actors.ledger.figures() if r == 0 and self.actors is not None else {})
            shares, _ = _timed(self.rank_shares.get(r), self.rank_shares_all.get(r))
            out[str(r)] = {"stage_shares": shares.shares(),
                           "inference_batch_mean": sum(k * v for k, v in b.items()) / n if n else None,
                           "inference_batch_sizes": {str(k): v for k, v in sorted(b.items())}, **faults}
        return out

    def transport_bytes_per_step(self) -> int:
        """Bytes moved through shared memory per env step: the actor's unroll-buffer row, the learner's
        copy of it into a batch (with the row's final_obs, which the batch carries whole) and, with central inference,
        the step slot's obs, action and the agent's record of the step."""
        obs = self.spec.obs_bytes
        record = sum(f.nbytes for f in registry.step_record(self.cfg, self.spec).values())
        row = obs + 8 + record + 4 + 1 + 1 + 1 + 4 + 8  # obs, action, record, reward, flags, return, length
        slot = obs + 8 + record + 8 if self.cfg.inference.mode == "central" else 0
        return 2 * row + obs + slot

    def write_balanced_config(self, found: dict[str, Any]) -> Path:
        """balanced.json in the run directory: this run's config at the layout the balancer found (``found``: its
        summary's ``final``), for ``rlbalance train --config`` (a new run directory: run.name is left empty)."""
        cfg = self.cfg.to_dict()
        cfg["actors"]["num_actors"] = found["actors"]
        cfg["actors"]["envs_per_actor"] = found["envs"] or cfg["actors"]["envs_per_actor"]
        cfg["learner"]["torch_threads"] = found["threads"]
        cfg["inference"]["max_wait_ms"] = found["wait_ms"]
        cfg["run"]["name"] = ""
        path = self.run.path / "balanced.json"
        atomic_write_json(path, cfg)
        return path

    def fail(self, error: BaseException) -> None:
        """Training stopped on an error: close up and write summary.json (outcome 'failed', the error, the last
        good checkpoint) without writing a new checkpoint."""
        self.progress.close()
        if self.sampler is not None:
            self.sampler.stop()
        try:
            last = self.run.latest_checkpoint()
            summary = {"outcome": "failed", "error": f"{type(error).__name__}: {error}", "env": self.cfg.env.id,
                       "preset": self.cfg.run.preset, "steps": self.learner.steps,
                       "frames": self.learner.steps * self.spec.frames_per_step, "updates": self.learner.updates,
                       "episode_return_last100": self.episodes.mean_return(), "episodes": self.episodes.count,
                       "last_good_checkpoint": str(last) if last else None, "run_dir": str(self.run.path),
                       "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            atomic_write_json(self.run.path / "summary.json", summary)
            self.logger.close(summary)
        except Exception:  # a full disk must not hide the error that stopped training
            pass

    def finish(self, outcome: str) -> dict:
        self.log(final=True)
        ckpt = self.checkpoint()
        steps = self.learner.steps
        sps = self.logger.sustained_sps(steps)
        # the bar's last word is the summary's figure: sustained FPS (since warm-up), not the last window's rate
        self.progress.finish(steps, sps * self.spec.frames_per_step, self.episodes.mean_return())
        self.progress.close()
        if self.sampler is not None:
            self.sampler.stop()
        tel = self.telemetry()
        atomic_write_json(self.run.path / "telemetry.json", tel)
        wall = time.perf_counter() - self.t_start
        hw = tel["hardware"]
        summary = {
            "outcome": outcome, "env": self.cfg.env.id, "preset": self.cfg.run.preset, "mode": self.cfg.run.mode,
            "inference": self.cfg.inference.mode, "model": resolve_model(self.cfg.learner, self.spec),
            "action_space": self.spec.action.describe(), "device": str(self.learner.device), "steps": steps, "frames": steps * self.spec.frames_per_step,
            "updates": self.learner.updates, "wall_s": wall,
            "sps_sustained": sps, "fps_sustained": sps * self.spec.frames_per_step,
            "sps_overall": (steps - self.start_steps) / max(wall, 1e-9),
            "episode_return_last100": self.episodes.mean_return(), "episodes": self.episodes.count,
            "episode_return_best100": self.episodes.best_mean,
            "policy_lag_mean": self.lag_total / self.lag_count if self.lag_count else None,
            **(self.actors.ledger.figures() if self.actors is not None else NO_FAULTS),
            "actor_faults": self.actors.ledger.events if self.actors is not None else [],
            "verdict": tel["verdict"]["verdict"], "verdict_evidence": tel["verdict"]["evidence"],
            "verdict_advice": tel["verdict"]["advice"], "stage_shares": tel["stage_shares"],
            "node_power_w": hw.get("node_power_w"), "cpu_util_mean": hw.get("cpu_util_mean"),
            "checkpoint": str(ckpt), "run_dir": str(self.run.path),
            "actors_on": "ray" if self.cfg.ray.enabled else "local processes", "agent": self.cfg.learner.agent,
            **{k: tel[k] for k in self.learner.figures()},  # the agent's own figures
            "nodes": tel["nodes"],
            **({"learner_ranks": {r: {"inference_batch_mean": v["inference_batch_mean"],
                                      "stage_shares": v["stage_shares"]} for r, v in tel["learner_ranks"].items()}}
               if "learner_ranks" in tel else {}),
            "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if self.balancer is not None:
            summary["balance"] = self.balancer.summary()
            summary["balance"]["config_file"] = str(self.write_balanced_config(summary["balance"]["final"]))
        if summary["node_power_w"]:
            p = summary["node_power_w"]
            summary["fps_per_watt"] = {"value": summary["fps_sustained"] / max(p["value"], 1e-9), "source": p["source"]}
        atomic_write_json(self.run.path / "summary.json", summary)
        self.logger.close(summary)
        if self.cfg.telemetry.report:
            from rlbalance.telemetry.report import write_report

            write_report(self.run.path)
        return summary
