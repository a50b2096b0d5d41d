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
from rlbalance.actor_pool import ActorFailure
from rlbalance.learner import NonFiniteLossError
from rlbalance.rundir import RunDir
from rlbalance.train import train

SYN = {"id": "synthetic", "synthetic_step_us": 20.0}
# Short enough for a quick test, long enough that a healthy actor on a loaded 2-core machine is not
# taken as hung; only the hang test needs it short (the others detect the death itself).
HANG_TIMEOUT = 3.0


@pytest.mark.parametrize("fault", ["raise:300", "kill:300", "hang:300"])
def test_actor_fault_is_restarted_and_training_goes_on(cfg_factory, fault):
    s = train(cfg_factory(env={**SYN, "synthetic_fault": fault},
                          actors={"heartbeat_timeout_s": HANG_TIMEOUT if fault.startswith("hang") else 30.0},
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
    per_update = 16 * 20
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
