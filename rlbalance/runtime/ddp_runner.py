"""One learner process per device (``learner.data_parallel=ddp``): process code only.

Rank 0 is the process that called ``train``: it keeps the run directory, the metrics, the checkpoints and the
summary. Ranks 1..N-1 are processes it starts. Every rank runs the runner of the config (``runner_for``: local actor
processes, Ray actors on a cluster, or serial) on its own share of the actors, with its own unroll buffers and
central inference server on its own device, and trains
through DistributedDataParallel, so all ranks step in lockstep from the same weights. Each iteration the ranks
agree whether to stop (one small all-reduce: rank 0 decides); about once a second, at an update they agree on, ranks
1.. send rank 0 their finished episodes, stage times, inference batch sizes and policy lag over the process group
(so it works between nodes too), and the summary holds every rank's figures. Launched by torchrun instead (one
process per device, on one node or several), rank 0 starts no processes and the others join it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as tdist

from rlbalance.config import Config
from rlbalance.core import distributed
from rlbalance.core.timing import StageTimer
from rlbalance.envs.batch import EnvSpec
from rlbalance.runtime.actor_pool import UNGUARDED_MAIN_EXIT, unguarded_main_error
from rlbalance.runtime.roles import NO_FAULTS, ActorSet, NodeFigures

REPORT_EVERY_S = 1.0


def collective_timeout_s(cfg: Config) -> float:
    """How long a rank waits at a collective for the others: past the time a rank's hung actor takes to be found
    (actors.heartbeat_timeout_s) and replaced, so an actor restart on one rank does not time the others out."""
    return 4 * cfg.actors.heartbeat_timeout_s + 60.0


def runner_for(cfg: Config):
    """The runner every learner rank runs on its share of the actors: Ray actors (``ray.address``), actors in
    the learner's own process (``run.mode=serial``) or local actor processes."""
    if cfg.ray.enabled:
        from rlbalance.runtime.ray_runner import run_ray

        return run_ray
    from rlbalance.runtime.local import run_parallel, run_serial

    return run_serial if cfg.run.mode == "serial" else run_parallel


class RankDiedError(RuntimeError):
    """A learner rank stopped while the others were training. ``killed``: whether each rank that died was killed by
    a signal (not by an error of its own, which it printed)."""

    killed: bool = False


def device_of(cfg: Config, local_rank: int) -> torch.device:
    """The device of the learner rank that is ``local_rank`` on its node: cuda:<local_rank>, or the CPU."""
    from rlbalance.runtime.devices import resolve_device

    first = resolve_device(cfg.learner.device)
    return torch.device("cuda", local_rank) if first.type == "cuda" else first


def launched_by_torchrun() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) where torchrun started this process as one of several; None otherwise.
    torchrun's own mark (TORCHELASTIC_RUN_ID) is required: WORLD_SIZE and RANK alone, left in a shell by something
    else, do not make a plain ``train`` wait for ranks that never come."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or "RANK" not in os.environ or "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    return int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))


def sync(stop: bool, report: bool) -> tuple[bool, bool]:
    """One all-reduce per update: every rank learns whether any rank says stop, and whether rank 0 asks for
    reports now (so all ranks take the same branch at the same update)."""
    flags = torch.tensor([float(stop), float(report)])
    if tdist.get_backend() == "nccl":
        flags = flags.cuda()
    tdist.all_reduce(flags, op=tdist.ReduceOp.MAX)
    return bool(flags[0].item() > 0), bool(flags[1].item() > 0)


def gather_reports(msg: dict | None) -> list[dict | None] | None:
    """Every rank's report, on rank 0 (None elsewhere). Runs over the process group itself, so it works between
    nodes as well as on one."""
    out: list[dict | None] | None = [None] * tdist.get_world_size() if tdist.get_rank() == 0 else None
    tdist.gather_object(msg, out, dst=0)
    return out


def share_start_state(learner, state: dict | None) -> None:
    """Every rank starts from rank 0's counters and optimizer state (on resume, those of the checkpoint rank 0
    read; DDP already gave every rank rank 0's weights)."""
    box = [state if tdist.get_rank() == 0 else None]
    tdist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        learner.load_state_dict(box[0])


class RankSession:
    """What ``run_parallel`` needs of a session, on ranks 1..N-1: the collective stop decision, the learner's
    stage timer, and reports of figures to rank 0 instead of a run directory."""

    def __init__(self, cfg: Config, rank: int, learner, model_lock):
        self.cfg, self.rank, self.learner = cfg, rank, learner
        self.model_lock = model_lock
        self.timer = StageTimer(cfg.telemetry.stage_timers)
        self.gpu_timer = StageTimer()
        self.actors: ActorSet | None = None
        self.nodes: Any = None  # (Ray actors: their node reports, passed on to rank 0)
        self.batch_sizes: Counter = Counter()
        self.first_t: float | None = None
        self._roles: dict[str, list[dict]] = {}
        self._episodes: list[tuple[float, int]] = []
        self._lags: list[float] = []
        self.stopping = False

    @property
    def warm(self) -> bool:
        return self.first_t is not None and time.perf_counter() - self.first_t >= self.cfg.telemetry.warmup_s

    def done(self) -> bool:
        self.stopping, report = sync(False, False)
        if report or self.stopping:
            gather_reports(self.take_report())
        return self.stopping

    def role_snapshot(self, role: str, snap: dict) -> None:
        self._roles.setdefault(role, []).append(snap)

    # what the runners tell a session (roles.RunSession); what rank 0 alone keeps is not kept here
    def attach_actors(self, actors: ActorSet) -> None:
        self.actors = actors

    def node_figures(self, make: Callable[[], NodeFigures]) -> NodeFigures:
        """A rank's actors' node reports go to rank 0 (NodeReports), whatever rank 0 keeps them in."""
        if self.nodes is None:
            from rlbalance.runtime.ray_workers import NodeReports

            self.nodes = NodeReports()
        return self.nodes

    def watch_process(self, role: str, pid: int) -> None:
        pass  # (rank 0's hardware sampler counts the machine)

    def set_scalars(self, scalars: dict[str, float]) -> None:
        pass  # (rank 0 logs its own)

    def add_batch_sizes(self, sizes: Iterable[int]) -> None:
        if self.warm:
            self.batch_sizes.update(sizes)

    def note_info(self, key: str, value: Any) -> None:
        pass  # (rank 0 records its own runtime's facts)

    def attach_balancer(self, balancer: Any) -> None:
        pass  # (run.balance=auto runs one learner: refused with learner.devices > 1 until ranks balance)

    def after_update(self, batch: dict, stats: dict) -> None:
        from rlbalance.runtime.role_figures import update_figures

        if self.first_t is None:
            self.first_t = time.perf_counter()
        rets, lens, lag = update_figures(batch, stats, self.learner.updates, self.timer, self.gpu_timer)
        self._episodes += list(zip(rets.tolist(), lens.tolist()))
        self._lags.append(lag)

    def take_report(self) -> dict:
        self.role_snapshot("learner", self.timer.snapshot(reset=True))
        if self.gpu_timer.total:  # this rank's GPU busy time (training here; inference from its server)
            self.role_snapshot("gpu", self.gpu_timer.snapshot(reset=True))
        msg = {"rank": self.rank, "roles": self._roles, "episodes": self._episodes, "lags": self._lags,
               "warm": self.warm, "batch_sizes": dict(self.batch_sizes),
               "node_reports": self.nodes.take() if self.nodes is not None else [],
               **(self.actors.ledger.figures() if self.actors is not None else NO_FAULTS)}
        self._roles, self._episodes, self._lags = {}, [], []
        self.batch_sizes = Counter()
        return msg


def rank_main(rank: int, cfg: Config, spec: EnvSpec, rendezvous: str | None, local_rank: int | None = None,
              started=None) -> None:
    """Learner rank ``rank`` >= 1: join the group, build the same learner (rank 0's weights, counters and optimizer
    state), run its share of the actors until the ranks agree to stop. ``started``: an Event set once this process
    is past its start-up (a spawned process imports the main script first), for rank 0 to wait on."""
    import gc
    import signal
    import threading

    from rlbalance.agents import registry

    if started is not None:
        started.set()
    # Ctrl-C reaches every process of the terminal: rank 0 alone decides, and the ranks stop at the update it
    # names (as actors ignore it too).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    device = device_of(cfg, rank if local_rank is None else local_rank)
    torch.manual_seed(cfg.run.seed)
    torch.set_num_threads(cfg.learner.torch_threads)
    learner: Any = None
    session: RankSession | None = None
    try:
        distributed.init(rank, cfg.learner.devices, device, rendezvous, timeout_s=collective_timeout_s(cfg))
        model_lock = threading.Lock()
        learner = registry.make_learner(registry.build_model(cfg.learner, spec), cfg, spec, device,
                                        step_lock=model_lock, distributed=True)
        share_start_state(learner, None)
        session = RankSession(cfg, rank, learner, model_lock)
        runner_for(cfg)(cfg.rank_config(rank), spec, learner, session)
        # The runner drained its actors' and server's last figures on its way out, after the last agreed report:
        # one more report carries them (rank 0 gathers it after its own runner returns).
        gather_reports(session.take_report())
    finally:
        # The DDP replica (its reducer holds the process group and gloo's work objects) goes before the group does,
        # while the interpreter is whole: freed at interpreter exit instead, a rank once aborted there ("terminate
        # called without an active exception", SIGABRT) after a completed run.
        learner = session = None
        gc.collect()
        distributed.close()


class Ranks:
    """Rank 0's handle on ranks 1..N-1: start them (unless a launcher such as torchrun did), join the group,
    merge their reports into the session, tell which rank died, stop them."""

    def __init__(self, cfg: Config, spec: EnvSpec, launched: bool = False):
        self.cfg, self.world, self.launched = cfg, cfg.learner.devices, launched
        self.ctx = mp.get_context("spawn")
        self.rendezvous = None if launched else distributed.private_rendezvous()
        self.started = [] if launched else [self.ctx.Event() for _ in range(1, self.world)]
        self.procs = [] if launched else [
            self.ctx.Process(target=rank_main, name=f"rlbalance-learner-rank{r}",
                             args=(r, cfg, spec, self.rendezvous, None, self.started[r - 1]))
            for r in range(1, self.world)]
        self.last_report = time.perf_counter()
        self.interrupted = False  # Ctrl-C or SIGTERM on rank 0: every rank stops at the next update

    def start(self) -> None:
        for p in self.procs:
            p.start()
        self._await_start(collective_timeout_s(self.cfg))
        distributed.init(0, self.world, device_of(self.cfg, 0), self.rendezvous,
                         timeout_s=collective_timeout_s(self.cfg))

    def _await_start(self, timeout_s: float) -> None:
        """Wait until every rank process is past its start-up, so that one that died there (a script calling
        train() without the __main__ guard, an import that fails) stops the run with its cause at once instead of
        leaving rank 0 waiting for it to join the group until the collective timeout."""
        deadline = time.perf_counter() + timeout_s
        while not all(e.is_set() for e in self.started):
            for r, (p, e) in enumerate(zip(self.procs, self.started), start=1):
                if not e.is_set() and p.exitcode is not None:
                    if p.exitcode == UNGUARDED_MAIN_EXIT:
                        raise unguarded_main_error(f"learner rank {r}'s process")
                    raise RankDiedError(f"learner rank {r} stopped as it started (exit code {p.exitcode}; its "
                                        "error is printed above)")
            if time.perf_counter() > deadline:
                raise RankDiedError(f"learner ranks did not start within {timeout_s:g} s")
            time.sleep(0.05)

    def done(self, session, local: bool) -> bool:
        """Rank 0's side of the per-update agreement: stop when rank 0 or any rank says so; every second (and at
        the stop) gather the other ranks' reports into ``session``."""
        now = time.perf_counter()
        stop, report = sync(local or self.interrupted, now - self.last_report >= REPORT_EVERY_S)
        if report or stop:
            self.last_report = now
            self.merge(session, gather_reports(None))
        return stop

    @staticmethod
    def merge(session, reports: list[dict | None] | None) -> None:
        """Fold the ranks' reports into rank 0's session (``Session.merge_rank_report``)."""
        for msg in (reports or [])[1:]:
            if msg:
                session.merge_rank_report(msg, len(reports or []))

    def failure(self, error: BaseException | None = None) -> RankDiedError | None:
        """A RankDiedError naming the learner ranks this process started that have died, or None. ``killed``:
        whether each of them died by a signal (not by an error of its own, which it printed)."""
        deadline = time.perf_counter() + 5.0
        while time.perf_counter() < deadline and not any(p.exitcode not in (None, 0) for p in self.procs):
            time.sleep(0.1)
        problems = []
        for r, p in enumerate(self.procs, start=1):
            if p.exitcode not in (None, 0):
                how = f"killed by signal {-p.exitcode}" if p.exitcode < 0 else f"exit code {p.exitcode}"
                problems.append(f"learner rank {r} stopped ({how})")
        if not problems:
            return None
        err = RankDiedError("; ".join(problems) + (f" (rank 0 saw: {type(error).__name__}: {error})" if error else "")
                            + "; the run stopped, its checkpoint resumes it (rlbalance train --resume RUN_DIR)")
        err.killed = all(p.exitcode is None or p.exitcode <= 0 for p in self.procs)
        return err

    def stop(self, timeout_s: float = 30.0) -> None:
        """Join ranks 1..N-1 (they leave their loops at the update the ranks agreed to stop at), terminating any
        that do not, and leave the process group."""
        deadline = time.perf_counter() + timeout_s
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.perf_counter()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        distributed.close()
        distributed.close_rendezvous(self.rendezvous)


def run_rank0(cfg: Config, spec: EnvSpec, learner, session, ranks: Ranks) -> None:
    """Rank 0's share of the actors and its learner loop. Ctrl-C or SIGTERM here stops every rank at the next
    update (then the usual final checkpoint and report). A rank killed by a signal stops the run with its name,
    after a checkpoint of the weights of the last update every rank finished; a non-finite loss on any rank stops
    every rank without one (the last good checkpoint stays the latest)."""
    import signal
    import threading

    from rlbalance.core.errors import NonFiniteLossError

    session.attach_ranks(ranks, {
        "kind": "ddp", "ranks": ranks.world, "backend": distributed.backend_for(learner.device),
        "launcher": "torchrun" if ranks.launched else "rlbalance", "learning_rate": learner.lr_now(),
        "lr_scaling": cfg.learner.lr_scaling, "summed_batch_unrolls": cfg.learner.batch_size * ranks.world,
        "collective_timeout_s": collective_timeout_s(cfg)})
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def interrupt(signum, frame):
            ranks.interrupted = True

        previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        runner_for(cfg)(cfg.rank_config(0), spec, learner, session)
    except NonFiniteLossError:
        ranks.stop(timeout_s=10.0)
        raise
    except BaseException as e:
        died = ranks.failure(e)
        ranks.stop(timeout_s=5.0)
        if died is not None:
            if died.killed:
                session.checkpoint()
            raise died from e
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    try:
        ranks.merge(session, gather_reports(None))  # the ranks' last figures, drained after the agreed stop
    except RuntimeError:  # a rank that failed on its way out: its last figures are lost, the training is done
        pass
    ranks.stop()
    if ranks.interrupted:
        raise KeyboardInterrupt
