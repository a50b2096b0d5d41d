"""Training: one entry point, ``train(cfg)``. It checks what can be refused, opens the run directory, starts the
learner (and its ranks), hands them to the runner the config names (``local``, ``ray_runner``, ``ddp_runner``) and
writes the final checkpoint and report."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from pathlib import Path

import torch

from rlbalance.agents import registry
from rlbalance.agents.precision import choice as precision_choice
from rlbalance.config import Config
from rlbalance.core.errors import ConfigError
from rlbalance.envs.batch import EnvSpec, probe_spec
from rlbalance.runtime.ddp_runner import (
    Ranks,
    launched_by_torchrun,
    rank_main,
    run_rank0,
    runner_for,
    share_start_state,
)
from rlbalance.runtime.actor_pool import ActorStartFailure, UnguardedMainError, refuse_train_in_spawned_child
from rlbalance.runtime.devices import resolve_device, resolve_devices
from rlbalance.runtime.ray_workers import import_ray, loopback_env
from rlbalance.runtime.rundir import RunDir
from rlbalance.runtime.session import Session, checkpoint_identity
from rlbalance.telemetry.metrics import EpisodeStats


def train(cfg: Config, resume: str | Path | None = None, after_run=None, allow_other_owner: bool = False) -> dict:
    """Train with ``cfg`` (or continue the run directory ``resume``, refused where another user owns it unless
    ``allow_other_owner``); returns the run summary.

    ``after_run(learner, spec)``, if given, runs after training and before the final checkpoint and
    report (``rlbalance profile`` captures its kernel view there)."""
    refuse_train_in_spawned_child()  # a script calling train() without the __main__ guard, in its actor processes
    if resume:
        RunDir(Path(resume)).check_owner(allow_other_owner)
    spec, model, device = _prepare(cfg)  # everything that can be refused is, before any process or file
    launched = launched_by_torchrun()
    if launched is not None and launched[0] > 0:  # a learner rank of a torchrun launch: rank 0 keeps the run dir
        rank, _, local_rank = launched
        rank_main(rank, cfg, spec, None, local_rank)
        return {"outcome": "completed", "rank": rank}
    run, state = _open_run(cfg, resume, spec, model, resolved_choices(cfg, spec, device))
    try:
        ranks = _start_ranks(cfg, spec, launched, run)
    except UnguardedMainError as e:  # (a learner rank's process, as train() refuses it in actor processes)
        _not_started(e, run, resume, trained=False)
        raise
    learner, session = _start_session(cfg, run, state, spec, model, device, ranks)
    outcome = "completed"
    restore = _sigterm_as_interrupt()
    try:
        if ranks is not None:  # learner rank 0 (its share of the actors: local, Ray or serial)
            run_rank0(cfg, spec, learner, session, ranks)
        else:
            runner_for(cfg)(cfg, spec, learner, session)
        if after_run is not None:
            after_run(learner, spec)
    except KeyboardInterrupt:
        outcome = "interrupted"
    except BaseException as e:
        restore()
        session.fail(e)  # summary.json says what stopped training; the last good checkpoint stays as it is
        run.unlock()
        _not_started(e, run, resume, trained=learner.steps > 0)
        raise
    return _finish(session, run, outcome, restore)


def _not_started(e: BaseException, run: RunDir, resume, trained: bool) -> None:
    """After ``e`` stopped the run: where it is a process that could not start (an actor, a learner rank), a new
    run that never trained leaves no directory; a script without the __main__ guard ends in one line (SystemExit),
    since the traceback would only point at its train() call."""
    if isinstance(e, ActorStartFailure) and resume is None and not trained:
        shutil.rmtree(run.path, ignore_errors=True)  # a new run that never started: nothing to keep
    if isinstance(e, UnguardedMainError):
        raise SystemExit(f"rlbalance: {e}") from None


def _prepare(cfg: Config) -> tuple[EnvSpec, torch.nn.Module, torch.device]:
    """The checks that need the env, the agent and the device, in the order a user fixes them: the env id, Ray,
    the device, the net for this env, the agent's own (a replay that would not fit, ...), a torchrun launch."""
    spec = probe_spec(cfg.env)  # a bad env id fails here, before any process starts
    if cfg.ray.enabled:
        loopback_env(cfg)
        import_ray()  # Ray missing fails here too
    device = resolve_device(cfg.learner.device)
    torch.manual_seed(cfg.run.seed)
    torch.set_num_threads(cfg.learner.torch_threads)
    agent = registry.get(cfg.learner.agent)
    model = registry.build_model(cfg.learner, spec)  # an observation shape the model cannot take fails here
    agent.check(cfg, spec)
    registry.step_record(cfg, spec)  # (an agent whose record cannot be carried is refused here too)
    launched = launched_by_torchrun()
    if launched is not None and (not cfg.ddp or cfg.learner.devices != launched[1]):
        raise ConfigError(f"learner.devices={cfg.learner.devices}: launched as one of {launched[1]} processes "
                          f"(WORLD_SIZE), set learner.devices={launched[1]}")
    if cfg.ddp and launched is None:  # all N ranks on this node: as many CUDA devices must be visible
        resolve_devices(cfg.learner.device, cfg.learner.devices)
    return spec, model, device


def resolved_choices(cfg: Config, spec: EnvSpec, device: torch.device) -> dict:
    """What this run decides from the machine, for config.json's "resolved": the torso's precision and image layout
    on the learner device (learner.torso_precision=auto), and on the actors' CPUs where they run the policy."""
    image = len(spec.obs_shape) == 3
    out = {"learner": precision_choice(cfg.learner.torso_precision, device, image)}
    if cfg.inference.mode == "actor":
        out["actors"] = precision_choice(cfg.learner.torso_precision, "cpu", image)
    return out


def _open_run(cfg: Config, resume, spec: EnvSpec, model: torch.nn.Module, resolved: dict | None = None
              ) -> tuple[RunDir, dict | None]:
    """A new run directory, or ``resume``'s, locked, with its latest checkpoint (checked to fit this run)."""
    if not resume:
        return RunDir.create(cfg, resolved), None
    run = RunDir(Path(resume))
    run.resolved = resolved
    run.lock()  # a run still going is refused before anything is read or written
    try:
        path = run.latest_checkpoint()
        state = run.load_checkpoint(path)
        check_checkpoint_fits(state, cfg, spec, model, path)
    except BaseException:
        run.unlock()
        raise
    return run, state


def _start_ranks(cfg: Config, spec: EnvSpec, launched, run: RunDir) -> Ranks | None:
    """Learner ranks 1..N-1, started and joined with this process in one torch.distributed group (learner.devices>1)."""
    if not cfg.ddp:
        return None
    ranks = Ranks(cfg, spec, launched=launched is not None)
    try:
        ranks.start()
    except BaseException:
        ranks.stop()
        run.unlock()
        raise
    return ranks


def _start_session(cfg: Config, run: RunDir, state: dict | None, spec: EnvSpec, model, device, ranks):
    """The learner (from the checkpoint where one was read) and the session around it."""
    model_lock = threading.Lock()
    episodes = EpisodeStats()
    try:
        learner = registry.make_learner(model, cfg, spec, device, step_lock=model_lock, distributed=ranks is not None)
        if state is not None:
            learner.load_state_dict(state)
            episodes.restore({k.removeprefix("episodes_"): v for k, v in state.items() if k.startswith("episodes_")})
            torch.set_rng_state(state["torch_rng"])
            run.write_config(cfg)  # overrides given on resume are part of the config this session uses
        if ranks is not None:
            share_start_state(learner, state)  # (the checkpoint as read, on the CPU)
        session_index = run.write_meta({
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resumed_from_steps": learner.steps,
            "env_spec": {"obs_shape": list(spec.obs_shape), "obs_dtype": str(spec.obs_dtype),
                         "num_actions": spec.num_actions, "action_space": spec.action.describe(),
                         "frames_per_step": spec.frames_per_step}})
        return learner, Session(cfg, run, learner, spec, episodes, model_lock, session_index)
    except BaseException:
        if ranks is not None:  # they wait in a collective for this process: stop them
            ranks.stop(timeout_s=5.0)
        run.unlock()
        raise


def _finish(session: Session, run: RunDir, outcome: str, restore) -> dict:
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


def check_checkpoint_fits(state: dict, cfg: Config, spec: EnvSpec, model: torch.nn.Module, path) -> None:
    """Refuse, naming the difference, a checkpoint of another env, observation or action space, or model."""
    from rlbalance.core.errors import ConfigError

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
