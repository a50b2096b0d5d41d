"""Training: one entry point, ``train(cfg)``, and the two runners (parallel actors, serial).

The learner loop of each runner reads top to bottom: get a batch of unrolls, train on it, let the
session log, checkpoint and decide when to stop.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch

from .actor import ActorShared, DirectPolicy, LocalModel, Rollout, client_seed
from .actor_pool import ActorPool
from .buffers import RolloutBuffers, SharedWeights, StepSlots
from .config import Config
from .envs import EnvBatch, EnvSpec, probe_spec
from .inference import InferenceServer
from .learner import Learner
from .metrics import EpisodeStats
from .model import build_model, core_state_size, resolve_device
from .rundir import RunDir
from .session import Session, checkpoint_identity


def run_serial(cfg: Config, spec: EnvSpec, learner: Learner, session: Session) -> None:
    """Everything in one process: the same Rollout, model and Learner as the parallel runner."""
    k, g = cfg.actors.envs_per_actor, cfg.actors.env_groups
    device = learner.device
    if cfg.inference.mode == "central":
        gen = torch.Generator(device=device).manual_seed(cfg.run.seed)

        def act(obs):
            actions, logits = learner.model.act(torch.from_numpy(obs).to(device), gen)
            return actions.cpu().numpy(), logits.cpu().numpy()

        eps = exploration(cfg, device)

        def act_recurrent_of(c: int):
            extra = {} if eps is None else {"epsilon": eps[c]}

            def act_recurrent(obs, first, state):
                actions, logits, core_in, state = learner.model.act_recurrent(
                    torch.from_numpy(obs).to(device), state, torch.from_numpy(first).to(device), gen, **extra)
                return actions.cpu().numpy(), logits.cpu().numpy(), core_in, state
            return act_recurrent

        if learner.model.recurrent:
            policies = [DirectPolicy(act_recurrent_of(c), lambda: learner.updates,
                                     learner.model.initial_state(k, device)) for c in range(cfg.num_clients)]
        else:
            policies = [DirectPolicy(act, lambda: learner.updates) for _ in range(cfg.num_clients)]
    else:
        weights = SharedWeights.allocate(learner.model)
        policies = []
        for a in range(cfg.actors.num_actors):
            local = LocalModel(build_model(cfg.learner, spec), weights, cfg.inference.sync_every,
                               client_seed(cfg, a * g))
            policies += [local.policy(k) for _ in range(g)]
    rollouts = [Rollout(EnvBatch(cfg.env, k, client_seed(cfg, c)), policies[c], client=c)
                for c in range(cfg.num_clients)]
    nb = cfg.buffers_per_batch
    buffers = RolloutBuffers.allocate(nb, cfg.learner.unroll_length, k, spec, shared=False,
                                      core_size=core_state_size(cfg.learner, spec))
    turn = 0
    while not session.done():
        for j in range(nb):
            rollouts[turn % len(rollouts)].fill(buffers.view(j))
            turn += 1
        batch = buffers.gather(list(range(nb)))
        stats = learner.train(batch)
        if cfg.inference.mode == "actor":
            weights.publish(learner.model, learner.updates)
        session.after_update(batch, stats)
    for r in rollouts:
        r.envs.close()


def run_parallel(cfg: Config, spec: EnvSpec, learner: Learner, session: Session) -> None:
    """Actor processes over shared memory; central inference as a thread beside the learner loop."""
    ctx = mp.get_context("spawn")
    k, t, n_buf = cfg.actors.envs_per_actor, cfg.learner.unroll_length, cfg.num_buffers
    central = cfg.inference.mode == "central"
    sh = ActorShared(
        buffers=RolloutBuffers.allocate(n_buf, t, k, spec, shared=True, core_size=core_state_size(cfg.learner, spec)),
        stop=torch.zeros(1, dtype=torch.uint8).share_memory_(),
        heartbeat=torch.zeros(cfg.actors.num_actors, dtype=torch.float64).share_memory_(),
        slots=StepSlots.allocate(cfg.num_clients, k, spec, shared=True, core_size=core_state_size(cfg.learner, spec))
        if central else None,
        weights=None if central else SharedWeights.allocate(learner.model))
    on_start = (lambda i, pid: session.sampler.watch("actor", pid)) if session.sampler is not None else None
    pool = ActorPool(ctx, cfg, sh, on_start)
    pool.start_all()
    server = None
    if central:
        server = InferenceServer(learner.model, sh.slots, list(pool.parent_conns), learner.device, k,
                                 cfg.inference.max_batch, cfg.inference.max_wait_ms, session.model_lock,
                                 lambda: learner.updates, cfg.run.seed, cfg.telemetry.stage_timers)
        server.epsilon = exploration(cfg, learner.device)
        pool.server = server
        server.start()
    session.actor_pool = pool
    nb = cfg.buffers_per_batch
    last_check = time.perf_counter()
    try:
        while not session.done():
            with session.timer.stage("wait_data"):
                idx = pool.take_full(nb, lambda: _check_health(pool, server))
            batch = sh.buffers.gather(idx)
            pool.give_back(idx)
            stats = learner.train(batch)
            if sh.weights is not None:
                with session.timer.stage("weight_publish"):
                    sh.weights.publish(learner.model, learner.updates)
            if time.perf_counter() - last_check > 1.0:
                _check_health(pool, server)
                last_check = time.perf_counter()
            pool.receive(0)
            _drain_stats(pool, session, server)
            session.after_update(batch, stats)
    finally:
        pool.stop()
        _drain_stats(pool, session, server, final=True)


def exploration(cfg: Config, device: torch.device) -> torch.Tensor | None:
    """R2D2's exploration rate of every env [clients, K] (Ape-X's ladder over all the run's envs); None for V-trace,
    whose policy samples its own actions."""
    if cfg.learner.agent != "r2d2":
        return None
    from .agents.r2d2 import env_epsilons

    return torch.as_tensor(env_epsilons(cfg), dtype=torch.float32, device=device)


def take_full(session: Session, full_q, nb: int, while_waiting) -> list[int]:
    """The next ``nb`` full buffer indices from a queue in this process (the Ray runner's feeder thread
    fills it); ``while_waiting()`` runs every half second without one."""
    idx = []
    with session.timer.stage("wait_data"):
        while len(idx) < nb:
            try:
                idx.append(full_q.get(timeout=0.5))
            except queue.Empty:
                while_waiting()
    return idx


def _check_health(pool: ActorPool, server) -> None:
    if server is not None and server.error is not None:
        raise server.error
    pool.check()


def _drain_stats(pool: ActorPool, session: Session, server, final: bool = False) -> None:
    for role, _i, snap in pool.take_stats():
        session.role_snapshot(role, snap)
    if server is not None and (final or server.timer.elapsed() > 1.0):
        session.role_snapshot("inference", server.timer.snapshot(reset=True))
        if server.gpu_busy_s:
            session.gpu_timer.add("inference", server.gpu_busy_s)
            server.gpu_busy_s = 0.0
        sizes, server.batch_sizes = server.batch_sizes, []
        if sizes:
            session.extra_scalars["inference/batch_size"] = float(np.mean(sizes))
            if session.warm:
                session.batch_sizes.update(sizes)
    session.extra_scalars["queue/full"] = float(len(pool.full))
    session.extra_scalars["queue/at_actors"] = float(len(pool.at_actor))


def train(cfg: Config, resume: str | Path | None = None, after_run=None) -> dict:
    """Train with ``cfg`` (or continue the run directory ``resume``); returns the run summary.

    ``after_run(learner, spec)``, if given, runs after training and before the final checkpoint and
    report (``rlbalance profile`` captures its kernel view there)."""
    spec = probe_spec(cfg.env)  # a bad env id fails here, before any process starts
    if cfg.ray.enabled:
        from .ray_runner import import_ray, loopback_env

        loopback_env(cfg)
        import_ray()  # Ray missing fails here too
    device = resolve_device(cfg.learner.device)
    torch.manual_seed(cfg.run.seed)
    torch.set_num_threads(cfg.learner.torch_threads)
    model = build_model(cfg.learner, spec)  # an observation shape the model cannot take fails here
    if cfg.learner.agent == "r2d2":  # a replay that would not fit fails here, before the run directory exists
        from .agents.r2d2 import SequenceReplay

        r = cfg.r2d2
        SequenceReplay.check_fits(r.replay_size, r.rows, spec.obs_shape, spec.obs_dtype,
                                  model.state_size, "r2d2.replay_size", num_actions=model.num_actions)
    episodes = EpisodeStats()
    model_lock = threading.Lock()
    from .ddp_runner import launched_by_torchrun

    launched = launched_by_torchrun()
    if launched is not None:
        from .config import ConfigError

        rank, world, local_rank = launched
        if not cfg.ddp or cfg.learner.devices != world:
            raise ConfigError(f"learner.devices={cfg.learner.devices}: launched as one of {world} processes "
                              f"(WORLD_SIZE), set learner.devices={world}")
        if rank > 0:  # a learner rank of a torchrun launch: rank 0 keeps the run directory
            from .ddp_runner import rank_main

            rank_main(rank, cfg, spec, None, local_rank)
            return {"outcome": "completed", "rank": rank}
    if cfg.ddp and launched is None:  # all N ranks on this node: as many CUDA devices must be visible
        from .model import resolve_devices

        resolve_devices(cfg.learner.device, cfg.learner.devices)
    state = path = None
    if resume:
        run = RunDir(Path(resume))
        run.lock()  # a run still going is refused before anything is read or written
        try:
            path = run.latest_checkpoint()
            state = run.load_checkpoint(path)
            check_checkpoint_fits(state, cfg, spec, model, path)
        except BaseException:
            run.unlock()
            raise
    else:
        run = RunDir.create(cfg)
    ranks = None
    if cfg.ddp:  # learner ranks 1..N-1 start and join this process in one torch.distributed group
        from .ddp_runner import Ranks

        ranks = Ranks(cfg, spec, launched=launched is not None)
        try:
            ranks.start()
        except BaseException:
            ranks.stop()
            run.unlock()
            raise
    try:
        learner = make_learner(model, cfg, spec, device, step_lock=model_lock, distributed=ranks is not None)
        if state is not None:
            learner.load_state_dict(state)
            episodes.returns.extend(state.get("episodes_returns", []))
            episodes.lengths.extend(state.get("episodes_lengths", []))
            episodes.count = int(state.get("episodes_count", 0))
            episodes.best_mean = float(state.get("episodes_best_mean", float("nan")))
            torch.set_rng_state(state["torch_rng"])
            run.write_config(cfg)  # overrides given on resume are part of the config this session uses
        if ranks is not None:
            from .ddp_runner import share_start_state

            share_start_state(learner, state)  # (the checkpoint as read, on the CPU)
        session_index = run.write_meta({"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resumed_from_steps": learner.steps,
                        "env_spec": {"obs_shape": list(spec.obs_shape), "obs_dtype": str(spec.obs_dtype),
                                     "num_actions": spec.num_actions, "action_space": spec.action.describe(),
                                     "frames_per_step": spec.frames_per_step}})
        session = Session(cfg, run, learner, spec, episodes, model_lock, session_index)
    except BaseException:
        if ranks is not None:  # they wait in a collective for this process: stop them
            ranks.stop(timeout_s=5.0)
        run.unlock()
        raise
    outcome = "completed"
    restore = _sigterm_as_interrupt()
    try:
        if ranks is not None:  # learner rank 0 (its share of the actors: local, Ray or serial)
            from .ddp_runner import run_rank0

            run_rank0(cfg, spec, learner, session, ranks)
        elif cfg.ray.enabled:
            from .ray_runner import run_ray

            run_ray(cfg, spec, learner, session)
        else:
            (run_serial if cfg.run.mode == "serial" else run_parallel)(cfg, spec, learner, session)
        if after_run is not None:
            after_run(learner, spec)
    except KeyboardInterrupt:
        outcome = "interrupted"
    except BaseException as e:
        restore()
        session.fail(e)  # summary.json says what stopped training; the last good checkpoint stays as it is
        run.unlock()
        raise
    # A second Ctrl-C or SIGTERM must not cut the final checkpoint and report short.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        summary = session.finish(outcome)
    finally:
        restore()
        run.unlock()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return summary


def make_learner(model: torch.nn.Module, cfg: Config, spec: EnvSpec, device: torch.device, step_lock=None,
                 distributed: bool = False):
    """The learner of ``cfg.learner.agent``: the V-trace ``Learner`` or the R2D2 agent (one interface)."""
    if cfg.learner.agent == "r2d2":
        from .agents.r2d2 import R2D2Agent

        return R2D2Agent(model, cfg, device, spec.obs_shape, spec.obs_dtype, step_lock=step_lock)
    return Learner(model, cfg.learner, device, cfg.run.total_steps, step_lock=step_lock, distributed=distributed)


def check_checkpoint_fits(state: dict, cfg: Config, spec: EnvSpec, model: torch.nn.Module, path) -> None:
    """Refuse, naming the difference, a checkpoint of another env, observation or action space, or model."""
    from .config import ConfigError

    have = state.get("identity")
    want = checkpoint_identity(cfg, spec)
    if have is not None:
        # (checkpoints from before action spaces were recorded are Discrete ones: num_actions says enough)
        diff = [f"{k}: checkpoint {have.get(k)!r}, this run {v!r}" for k, v in want.items()
                if have.get(k) != v and not (k == "action_space" and k not in have)]
        if diff:
            raise ConfigError(f"checkpoint {path} belongs to another run ({'; '.join(diff)}); resume it with its "
                              "own config, or start a new run")
    own = model.state_dict()
    theirs = state.get("model", {})
    bad = [f"{k}: checkpoint {list(theirs[k].shape) if k in theirs else 'missing'}, model {list(v.shape)}"
           for k, v in own.items() if k not in theirs or tuple(theirs[k].shape) != tuple(v.shape)]
    bad += [f"{k}: not in this model" for k in theirs if k not in own]
    if bad:
        raise ConfigError(f"checkpoint {path} does not fit this run's model ({'; '.join(bad[:3])}"
                          f"{'; ...' if len(bad) > 3 else ''}); resume it with its own config, or start a new run")


def _sigterm_as_interrupt():
    """SIGTERM stops training like Ctrl-C: every process stopped, a final checkpoint written."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the shutdown in progress finishes
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)
