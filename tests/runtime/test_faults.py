"""Faults: an env that raises, an actor SIGKILLed, an actor that hangs, a NaN loss, kill -9 of the whole
run, bad checkpoints. Each asserts that training went on (or resumed) and what was lost."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from rlbalance import config as C
from rlbalance.core.errors import NonFiniteLossError
from rlbalance.runtime.actor_pool import ActorFailure
from rlbalance.runtime.rundir import RunDir
from rlbalance.runtime.train import train

SYN = {"id": "synthetic", "synthetic_step_us": 20.0}
# Short enough for a quick test, long enough that a healthy actor on a loaded 2-core machine is not
# taken as hung; only the hang test needs it short (the others detect the death itself).
HANG_TIMEOUT = 3.0


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["raise:300", "kill:300", "hang:300"])
def test_actor_fault_is_restarted_and_training_goes_on(cfg_factory, fault):
    s = train(cfg_factory(env={**SYN, "synthetic_fault": fault},
                          # one actor for the hang: the run cannot finish around a hung actor before it is seen
                          actors=({"num_actors": 1, "heartbeat_timeout_s": HANG_TIMEOUT} if fault.startswith("hang")
                                  else {"heartbeat_timeout_s": 30.0}),
                          run={"total_steps": 120_000, "name": fault.split(":")[0]},
                          telemetry={"tensorboard": False}))
    assert s["outcome"] == "completed" and s["steps"] >= 120_000
    assert s["actor_restarts"] == 1, s["actor_faults"]
    reason = s["actor_faults"][0]["reason"]
    assert ("hung" in reason) if fault.startswith("hang") else ("exited with code" in reason)
    assert s["actor_seconds_lost"] > 0
    if fault.startswith("hang"):
        assert s["actor_seconds_lost"] >= HANG_TIMEOUT  # at least the heartbeat timeout
    recs = [json.loads(line) for line in open(os.path.join(s["run_dir"], "metrics.jsonl"))]
    assert recs[-1]["actors/restarts"] == 1
    assert "actor-seconds lost" in open(os.path.join(s["run_dir"], "report.html")).read()


def test_restart_budget_exhausted_is_a_clear_error(cfg_factory):
    cfg = cfg_factory(env={**SYN, "synthetic_fault": "raise:50"}, actors={"max_restarts": 0},
                      run={"total_steps": 10**7, "name": "budget"}, telemetry={"tensorboard": False})
    with pytest.raises(ActorFailure, match="actors.max_restarts"):
        train(cfg)


def test_nan_loss_stops_with_diagnostic_and_keeps_last_good_checkpoint(cfg_factory):
    cfg = cfg_factory(env={**SYN, "synthetic_fault": "nan:400"}, actors={"num_actors": 1},
                      run={"total_steps": 10**7, "name": "nan", "checkpoint_interval_s": 0.2, "mode": "serial"},
                      telemetry={"tensorboard": False})
    with pytest.raises(NonFiniteLossError, match="loss is nan"):
        train(cfg)
    run = RunDir(os.path.join(cfg.run.out_dir, "nan"))
    state = run.load_checkpoint()
    assert all(torch.isfinite(v).all() for v in state["model"].values())  # the last good weights


@pytest.mark.slow
def test_kill_9_of_the_whole_run_then_resume(tmp_path):
    cmd = [sys.executable, "-m", "rlbalance", "train", "--run.out_dir", str(tmp_path), "--run.name", "k9",
           "--run.checkpoint_interval_s", "1", "--run.total_steps", "100000000", "--telemetry.progress", "false",
           "--telemetry.tensorboard", "false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ckpts = tmp_path / "k9" / "checkpoints"
    deadline = time.time() + 90
    while time.time() < deadline and len(list(ckpts.glob("ckpt-*.pt"))) < 2:
        time.sleep(0.2)
    killed_at = time.time()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run = RunDir(tmp_path / "k9")
    latest = run.latest_checkpoint()
    before = run.load_checkpoint()  # the latest complete checkpoint survived kill -9
    # at most one checkpoint interval (1 s) of training was lost, plus scheduling slack
    assert killed_at - latest.stat().st_mtime <= 1.0 + 1.5
    target = before["steps"] + 20_000
    s = train(C.build(C.merge(run.read_config().to_dict(), {"run": {"total_steps": target},
                                                              "telemetry": {"progress": False}})),
              resume=run.path)
    per_update = run.read_config().learner.batch_size * run.read_config().learner.unroll_length
    assert s["steps"] - before["steps"] == (s["updates"] - before["updates"]) * per_update  # counters exact
    assert s["steps"] >= target


def test_foreign_checkpoint_is_refused_before_anything_is_written(cfg_factory, tmp_path):
    s = train(cfg_factory(run={"total_steps": 3_000, "name": "foreign"}, telemetry={"tensorboard": False}))
    run = RunDir(s["run_dir"])
    bogus = run.ckpt_dir / "ckpt-999999999999.pt"
    torch.save({"weights": torch.zeros(3)}, bogus)
    (run.ckpt_dir / "latest").write_text(bogus.name)
    metrics_before = (run.path / "metrics.jsonl").read_text()
    with pytest.raises(C.ConfigError, match="not an rlbalance-checkpoint"):
        train(run.read_config(), resume=run.path)
    assert (run.path / "metrics.jsonl").read_text() == metrics_before


def test_model_that_cannot_take_the_observations(cfg_factory):
    with pytest.raises(C.ConfigError, match="nature_cnn"):
        train(cfg_factory(learner={"model": "nature_cnn"}, run={"name": "cnn-on-cartpole"}))


@pytest.mark.slow
def test_nothing_listens_on_the_network(cfg_factory):
    import psutil

    s_before = {c.laddr for c in psutil.net_connections(kind="inet") if c.status == "LISTEN"}
    import threading

    seen = set()

    def watch():
        for _ in range(20):
            seen.update(c.laddr for c in psutil.net_connections(kind="inet") if c.status == "LISTEN")
            time.sleep(0.1)

    th = threading.Thread(target=watch)
    th.start()
    train(cfg_factory(run={"total_steps": 20_000, "name": "net"}))
    th.join()
    assert seen <= s_before  # the trainer opened no listening socket


def _actor_pids(min_age_s: float = 0.0) -> list[int]:
    """This test process's actor processes (spawned children; not multiprocessing's resource tracker),
    those at least ``min_age_s`` old."""
    import psutil

    out = []
    for c in psutil.Process().children():
        try:
            cmd = " ".join(c.cmdline())
            age = time.time() - c.create_time()
        except psutil.Error:
            continue
        if "spawn_main" in cmd and "resource_tracker" not in cmd and age >= min_age_s:
            out.append(c.pid)
    return out


@pytest.mark.slow
def test_actors_killed_at_random_moments_never_hang_the_run(cfg_factory, monkeypatch):
    """20 SIGKILLs of actors at random moments of a learner-bound run (an actor can die while it writes a
    buffer, sends on its pipes or waits for the learner): the run completes, with one restart per kill."""
    import random
    import threading

    kills, done = [], threading.Event()

    def killer():
        rng = random.Random(12)
        while len(kills) < 20 and not done.is_set():
            time.sleep(rng.uniform(0.05, 1.0))
            # mostly actors past start-up, which spend most of a learner-bound run waiting for buffers
            pids = [p for p in _actor_pids(min_age_s=3.0 if rng.random() < 0.8 else 0.0) if p not in kills]
            if pids:
                pid = rng.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                except ProcessLookupError:
                    pass

    def watchdog():  # a hang fails the test (SIGTERM ends a run as interrupted) instead of stalling CI
        if not done.wait(600):
            os.kill(os.getpid(), signal.SIGTERM)

    cfg = cfg_factory(env={"id": "synthetic", "synthetic_step_us": 0.0},
                      learner={"hidden_sizes": [1024, 1024, 1024], "batch_size": 64},
                      actors={"max_restarts": 25, "heartbeat_timeout_s": 30.0},
                      run={"total_steps": 10**9, "name": "chaos"}, telemetry={"tensorboard": False})
    threads = [threading.Thread(target=killer, daemon=True), threading.Thread(target=watchdog, daemon=True)]
    for t in threads:
        t.start()

    from rlbalance.runtime.session import Session

    def done_after_kills(self):  # train until every kill has happened and every actor is back
        pool = self.actors
        return len(kills) >= 20 and pool is not None and pool.ledger.restarts >= 20 and not pool._awaiting

    monkeypatch.setattr(Session, "done", done_after_kills)
    try:
        s = train(cfg)
    finally:
        done.set()
    assert s["outcome"] == "completed", s["outcome"]
    assert len(kills) == 20
    assert s["actor_restarts"] == 20, s["actor_faults"]
    assert all("exited with code -9" in f["reason"] for f in s["actor_faults"])
    assert not _actor_pids()  # every actor process is gone


def _strict_json(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("episodes", [0, 1, 99])
def test_every_json_file_of_a_run_is_strict_json(cfg_factory, episodes):
    # serial, one env, unrolls of 10 steps: a game of L steps ends exactly `steps / L` times
    length = {0: 10**6, 1: 100, 99: 10}[episodes]
    steps = {0: 100, 1: 100, 99: 990}[episodes]
    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 0.0, "synthetic_episode_len": length},
                          actors={"num_actors": 1, "envs_per_actor": 1, "env_groups": 1},
                          learner={"batch_size": 1, "unroll_length": 10},
                          run={"total_steps": steps, "mode": "serial", "name": f"json{episodes}"},
                          telemetry={"tensorboard": False}))
    assert s["episodes"] == episodes
    run = s["run_dir"]
    files = [f for f in os.listdir(run) if f.endswith(".json")]
    assert {"summary.json", "config.json", "meta.json", "telemetry.json"} <= set(files)
    for f in files:
        _strict_json(open(os.path.join(run, f)).read())
    for line in open(os.path.join(run, "metrics.jsonl")):
        _strict_json(line)
    summary = _strict_json(open(os.path.join(run, "summary.json")).read())
    assert (summary["episode_return_last100"] is None) == (episodes == 0)


@pytest.mark.slow
def test_resume_of_a_live_run_is_refused(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "rlbalance", "train", "--run.out_dir", str(tmp_path), "--run.name",
                             "live", "--run.total_steps", "100000000", "--telemetry.progress", "false",
                             "--telemetry.tensorboard", "false", "--run.checkpoint_interval_s", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run = RunDir(tmp_path / "live")
        deadline = time.time() + 90
        while time.time() < deadline and run.latest_checkpoint() is None:
            time.sleep(0.2)
        assert run.latest_checkpoint() is not None
        with pytest.raises(C.ConfigError, match=f"in use by a live run \\(pid {proc.pid}\\)"):
            train(run.read_config(), resume=run.path)
        out = subprocess.run([sys.executable, "-m", "rlbalance", "train", "--resume", str(run.path)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "in use by a live run" in out.stderr  # refused
        assert proc.poll() is None  # the first run goes on
        size = (run.path / "metrics.jsonl").stat().st_size
        deadline = time.time() + 30
        while time.time() < deadline and (run.path / "metrics.jsonl").stat().st_size == size:
            time.sleep(0.2)
        assert (run.path / "metrics.jsonl").stat().st_size > size
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    assert json.load(open(run.path / "summary.json"))["outcome"] == "interrupted"


@pytest.mark.slow
def test_checkpoint_of_another_env_with_the_same_shapes_is_refused(cfg_factory):
    # a synthetic env shaped like CartPole (4 observations, 2 actions): same parameter shapes, another task
    s_syn = train(cfg_factory(env={"id": "synthetic", "synthetic_obs_shape": [4], "synthetic_actions": 2},
                              run={"total_steps": 3_000, "name": "syn"}, telemetry={"tensorboard": False}))
    s_cp = train(cfg_factory(run={"total_steps": 3_000, "name": "cp"}, telemetry={"tensorboard": False}))
    syn, cp = RunDir(s_syn["run_dir"]), RunDir(s_cp["run_dir"])
    foreign = syn.latest_checkpoint()
    target = cp.ckpt_dir / "ckpt-999999999999.pt"
    target.write_bytes(foreign.read_bytes())
    (cp.ckpt_dir / "latest").write_text(target.name)
    before = {f: (cp.path / f).read_bytes() for f in ("metrics.jsonl", "summary.json", "config.json", "meta.json")}
    with pytest.raises(C.ConfigError, match="belongs to another run \\(env: checkpoint 'synthetic'"):
        train(cp.read_config(), resume=cp.path)
    # another shape (a bigger MLP's checkpoint): refused with the layer named, no traceback
    s_big = train(cfg_factory(run={"total_steps": 3_000, "name": "big"}, learner={"hidden_sizes": [32]},
                              telemetry={"tensorboard": False}))
    target.write_bytes(RunDir(s_big["run_dir"]).latest_checkpoint().read_bytes())
    state = torch.load(target, weights_only=True)
    state.pop("identity")  # as a checkpoint from before identities were written
    torch.save(state, target)
    with pytest.raises(C.ConfigError, match="does not fit this run's model \\(torso"):
        train(cp.read_config(), resume=cp.path)
    assert {f: (cp.path / f).read_bytes() for f in before} == before  # nothing written


@pytest.mark.slow
def test_disk_full_is_a_clear_error_and_the_run_resumes_once_there_is_space(cfg_factory, monkeypatch):
    import errno

    from rlbalance.core.errors import DiskWriteError
    from rlbalance.runtime import rundir

    cfg = cfg_factory(run={"total_steps": 10**8, "name": "full", "checkpoint_interval_s": 0.5},
                      telemetry={"tensorboard": False})
    real_fsync, calls = rundir.os.fsync, {"ckpts": 0}
    real_save = rundir.RunDir.save_checkpoint

    def save(self, state, keep=2):
        calls["ckpts"] += 1
        if calls["ckpts"] >= 3:  # the disk fills up after two good checkpoints
            def fsync(fd):
                raise OSError(errno.ENOSPC, "No space left on device")
            monkeypatch.setattr(rundir.os, "fsync", fsync)
        return real_save(self, state, keep)

    monkeypatch.setattr(rundir.RunDir, "save_checkpoint", save)
    with pytest.raises(DiskWriteError, match="No space left on device.*last good checkpoint is .*ckpt-"):
        train(cfg)
    monkeypatch.setattr(rundir.os, "fsync", real_fsync)
    monkeypatch.setattr(rundir.RunDir, "save_checkpoint", real_save)
    run = RunDir(os.path.join(cfg.run.out_dir, "full"))
    assert not list(run.path.rglob("*.tmp"))
    good = run.load_checkpoint()
    s = train(C.build(C.merge(run.read_config().to_dict(), {"run": {"total_steps": good["steps"] + 5_000}})),
              resume=run.path)
    assert s["outcome"] == "completed" and s["steps"] >= good["steps"] + 5_000


def test_exit_codes_are_distinct(tmp_path):
    from rlbalance.cli import EXIT_COMPLETED, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_REFUSED, main

    assert len({EXIT_COMPLETED, EXIT_FAILED, EXIT_REFUSED, EXIT_INTERRUPTED}) == 4
    common = ["--run.out_dir", str(tmp_path), "--telemetry.progress", "false", "--telemetry.tensorboard", "false"]
    assert main(["train", "--run.total_steps", "2000", "--run.name", "ok", *common]) == EXIT_COMPLETED
    assert main(["train", "--learner.batch_size", "-1", "--run.name", "bad", *common]) == EXIT_REFUSED
    assert not (tmp_path / "bad").exists()
    assert main(["train", "--run.name", "../escape", *common]) == EXIT_REFUSED
    assert main(["train", "--env.id", "synthetic", "--env.synthetic_fault", "nan:100", "--run.mode", "serial",
                 "--run.total_steps", "100000", "--run.name", "nan", *common]) == EXIT_FAILED
    s = json.load(open(tmp_path / "nan" / "summary.json"))
    assert s["outcome"] == "failed" and "environment returned NaN" in s["error"]
    # interrupted (130): test_sigint_stops_everything_and_checkpoints in test_train.py


@pytest.mark.slow
def test_restarted_actor_that_never_steps_is_restarted_again(cfg_factory, monkeypatch):
    """An actor restarted after a fault and then stopped (SIGSTOP) before its first step is restarted once
    its start-up time is over, instead of being waited on forever."""
    from rlbalance.runtime import actor_pool
    from rlbalance.runtime.session import Session

    monkeypatch.setattr(actor_pool, "START_TIMEOUT_S", 15.0)  # the default 60 s would make the test long
    stopped: list[int] = []
    original_done = Session.done

    def done(self):
        pool = self.actors
        if pool is not None and not stopped and pool.ledger.restarts == 1 and 0 in pool._awaiting:
            pid = pool.procs[0].pid  # actor 0's second life, not stepped yet
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        return original_done(self) and pool is not None and pool.ledger.restarts >= 2

    monkeypatch.setattr(Session, "done", done)
    try:
        s = train(cfg_factory(env={**SYN, "synthetic_fault": "kill:300"},
                              actors={"heartbeat_timeout_s": 3.0, "max_restarts": 5},
                              run={"total_steps": 60_000, "name": "stopped-restart"},
                              telemetry={"tensorboard": False}))
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert stopped, "actor 0 was not caught between its restart and its first step"
    assert s["outcome"] == "completed"
    assert s["actor_restarts"] >= 2, s["actor_faults"]
    assert any(f["actor"] == 0 and "hung" in f["reason"] for f in s["actor_faults"][1:]), s["actor_faults"]
    assert stopped[0] not in _actor_pids()


@pytest.mark.slow
def test_run_end_kills_an_actor_that_ignores_sigterm(cfg_factory, monkeypatch):
    """An actor stopped (SIGSTOP) when the run ends cannot act on SIGTERM: the learner kills it rather than
    leave it behind (or hang in multiprocessing's exit-time join)."""
    from rlbalance.runtime.session import Session

    stopped: list[int] = []
    original_done = Session.done

    def done(self):
        finished = original_done(self)
        if finished and not stopped and self.actors is not None:
            pid = self.actors.procs[1].pid
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        return finished

    monkeypatch.setattr(Session, "done", done)
    try:
        s = train(cfg_factory(env=SYN, actors={"heartbeat_timeout_s": 60.0},
                              run={"total_steps": 30_000, "name": "stopped-at-end"},
                              telemetry={"tensorboard": False}))
        left = _actor_pids()
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert stopped and s["outcome"] == "completed"
    assert stopped[0] not in left and not left


@pytest.mark.slow
def test_chaos_bench_short(tmp_path, capsys):
    """`rlbalance bench chaos`, short: actors killed, hung and crashed at random, the learner killed with
    SIGKILL and resumed; the run ends, nothing is lost or leaked, and the report files are written."""
    from rlbalance.cli import main

    out = tmp_path / "chaos"
    rc = main(["bench", "chaos", "--minutes", "0.6", "--fault-every", "5", "--seed", "3", "--out", str(out)])
    r = _strict_json((out / "chaos.json").read_text())
    assert rc == 0 and r["ok"], json.dumps({k: v for k, v in r.items() if k not in ("curve", "baseline")})
    assert not r["hang"] and not r["processes_leaked"] and not r["shm_files_leaked"]
    assert r["faults"]["learner_kill"] == 1 and sum(r["faults"].values()) >= 2
    assert sum(r["faults"][k] for k in ("kill", "hang", "crash")) >= 1 and r["actor_restarts"] >= 1
    assert [s["exit_code"] for s in r["sessions"]] == [-signal.SIGKILL, 0]
    assert r["checks"]["resume"]["ok"] and r["checks"]["metrics"]["sessions"] == [0, 1]
    assert r["baseline"]["exit_code"] == 0 and r["baseline"]["steps"] > 0
    assert (out / "chaos.png").stat().st_size > 0 and "passed" in (out / "chaos.md").read_text()
    assert "chaos: passed" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("path", ["ddp", "ray"])
def test_chaos_bench_on_the_other_runtime_paths(tmp_path, path):
    """`rlbalance bench chaos --path ddp`: learner rank 1 killed, rank 0 stops the run (exit 1, the last checkpoint
    kept), which resumes from it on one learner process; `--path ray`: Ray actors killed and hung, the Ray worker
    node killed, the learner killed and resumed on the same cluster. Nothing lost or leaked on either."""
    if path == "ray":
        pytest.importorskip("ray")
    from rlbalance.cli import main

    out = tmp_path / f"chaos-{path}"
    rc = main(["bench", "chaos", "--path", path, "--minutes", "0.8", "--fault-every", "5", "--seed", "3",
               "--no-baseline", "--out", str(out)])
    r = _strict_json((out / "chaos.json").read_text())
    assert rc == 0 and r["ok"], json.dumps({k: v for k, v in r.items() if k != "curve"})
    assert not r["hang"] and not r["processes_leaked"] and not r["shm_files_leaked"]
    assert r["faults"]["learner_kill"] == 1 and r["checks"]["resume"]["ok"]
    assert r["checks"]["metrics"]["sessions"] == [0, 1] and r["sessions"][-1]["exit_code"] == 0
    if path == "ddp":  # rank 0 stopped the run itself, with an error naming the dead rank
        assert r["sessions"][0]["exit_code"] == 1
    else:
        assert r["faults"]["node_kill"] == 1 and r["sessions"][0]["exit_code"] == -signal.SIGKILL
