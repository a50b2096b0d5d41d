"""End-to-end training on CPU: run directory contents, resume, Pong smoke, actor-side inference."""

import json

import pytest
import torch

from rlbalance.runtime.rundir import RunDir
from rlbalance.runtime.train import train


def _records(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


def test_run_directory_has_everything(cfg_factory):
    s = train(cfg_factory(run={"total_steps": 15_000, "name": "rd"}))
    run = RunDir(s["run_dir"])
    cfg = json.load(open(run.path / "config.json"))
    assert cfg["run"]["total_steps"] == 15_000
    # what the run decided from the machine: CartPole's MLP torso stays float32 whatever the CPU, and says why
    used = cfg["resolved"]["learner"]
    assert used["torso_precision"] == "fp32" and used["asked"] == "fp32" and used["why"]
    meta = json.load(open(run.path / "meta.json"))
    hw = meta["hardware"]
    for key in ("cpu_model", "physical_cores", "logical_cpus", "gpus", "versions", "git_commit"):
        assert key in hw
    assert "torch" in hw["versions"]
    recs = _records(run.path)
    assert recs and recs[-1]["steps"] >= 15_000
    for key in ("fps", "sps", "episode_return", "loss/pg_loss", "loss/baseline_loss", "policy_lag",
                "queue/full"):
        assert key in recs[-1], key
    # a stage's share is logged for the windows in which it ran (the last window may be too short)
    assert any("learner/share_wait_data" in r for r in recs)
    assert list((run.path / "tb").glob("events.out.tfevents.*"))
    assert run.latest_checkpoint() is not None
    summary = json.load(open(run.path / "summary.json"))
    assert summary["outcome"] == "completed" and summary["steps"] >= 15_000


@pytest.mark.slow
def test_resume_continues_counters_exactly(cfg_factory):
    s1 = train(cfg_factory(run={"total_steps": 10_000, "name": "res"}))
    state = RunDir(s1["run_dir"]).load_checkpoint()
    assert state["steps"] == s1["steps"] and state["updates"] == s1["updates"]
    cfg2 = cfg_factory(run={"total_steps": 20_000, "name": "res"})
    s2 = train(cfg2, resume=s1["run_dir"])
    per_update = cfg2.learner.batch_size * cfg2.learner.unroll_length
    assert s2["steps"] >= 20_000
    assert s2["steps"] - s1["steps"] == (s2["updates"] - s1["updates"]) * per_update
    recs = _records(s1["run_dir"])
    assert recs[-1]["steps"] == s2["steps"]


def test_truncated_checkpoint_is_a_clear_error(cfg_factory, tmp_path):
    s = train(cfg_factory(run={"total_steps": 5_000, "name": "trunc"}, telemetry={"tensorboard": False}))
    run = RunDir(s["run_dir"])
    ckpt = run.latest_checkpoint()
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    from rlbalance.core.errors import ConfigError

    with pytest.raises(ConfigError, match="truncated"):
        run.load_checkpoint()


def test_a_checkpoint_left_half_written_by_a_killed_session_is_cleared_by_the_next_save(cfg_factory):
    """SIGKILL mid-checkpoint leaves the writer's temporary file (a chaos run found one after its learner kill);
    the next checkpoint of the run removes it and keeps the good ones."""
    s = train(cfg_factory(run={"total_steps": 5_000, "name": "tmpleft"}, telemetry={"tensorboard": False}))
    run = RunDir(s["run_dir"])
    stale = run.ckpt_dir / "ckpt-000000099999.pt.tmp"
    stale.write_bytes(b"half a checkpoint")
    good = run.latest_checkpoint()
    run.save_checkpoint(run.load_checkpoint())
    assert not stale.exists() and good.exists() and run.latest_checkpoint() == good


@pytest.mark.slow
def test_pong_trains_end_to_end_on_two_actors(cfg_factory):
    s = train(cfg_factory(env={"id": "ALE/Pong-v5"}, actors={"num_actors": 2, "envs_per_actor": 2},
                          learner={"batch_size": 4, "unroll_length": 10, "reward_clip": 1.0},
                          run={"total_steps": 600, "name": "pong"}, telemetry={"tensorboard": False}))
    assert s["model"] == "nature_cnn" and s["preset"] == "atari"
    assert s["steps"] >= 600 and s["frames"] == 4 * s["steps"]
    recs = _records(s["run_dir"])
    assert all(torch.isfinite(torch.tensor(r["loss/total_loss"])) for r in recs if "loss/total_loss" in r)
    assert recs[-1]["inference/batch_size"] >= 2


@pytest.mark.slow
def test_actor_side_inference_trains(cfg_factory):
    s = train(cfg_factory(inference={"mode": "actor"}, run={"total_steps": 20_000, "name": "actorinf"}))
    assert s["inference"] == "actor" and s["steps"] >= 20_000
    lags = [r["policy_lag"] for r in _records(s["run_dir"]) if r["policy_lag"] is not None]
    assert lags and min(lags) >= 0  # (a final record with no update since the one before has no lag: null)


def test_one_batch_of_buffers_in_all_trains_without_waiting_forever(cfg_factory):
    """actors.buffers_per_actor as low as one learner batch in all (here 2 actors x 1 buffer, a batch of 2 buffers):
    every batch takes every buffer, which go back to the actors before the update, so the run goes on. Each buffer
    trained was handed back one update before, and its unroll's first action asked for at most one update earlier:
    a policy lag of at most 3 (counted after the update), where spare buffers let it grow with the queue."""
    cfg = cfg_factory(actors={"num_actors": 2, "envs_per_actor": 4, "env_groups": 1, "buffers_per_actor": 1},
                      learner={"batch_size": 8}, run={"total_steps": 6_000, "name": "onebatch"},
                      telemetry={"tensorboard": False})
    assert cfg.num_buffers == cfg.buffers_per_batch == 2
    s = train(cfg)
    assert s["steps"] >= 6_000
    lags = [r["policy_lag"] for r in _records(s["run_dir"]) if r["policy_lag"] is not None]
    assert lags and max(lags) <= 3


def test_synthetic_env_serial_and_parallel(cfg_factory):
    for mode in ("serial", "parallel"):
        s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 5.0}, run={"total_steps": 8_000,
                              "name": f"syn-{mode}", "mode": mode}, telemetry={"tensorboard": False}))
        assert s["steps"] >= 8_000


@pytest.mark.slow
def test_sigint_stops_everything_and_checkpoints(tmp_path):
    """SIGINT to a running `rlbalance train`: a final checkpoint, no child process left, summary says so."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    proc = subprocess.Popen([sys.executable, "-m", "rlbalance", "train", "--run.total_steps", "100000000",
                             "--run.out_dir", str(tmp_path), "--run.name", "sig", "--telemetry.progress", "false",
                             "--telemetry.tensorboard", "false"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    metrics = tmp_path / "sig" / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 2  # the actor processes
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out.decode()[-2000:]  # interrupted (documented exit code)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    if os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) - shm_before == set()  # no shared-memory segment left
    s = json.load(open(tmp_path / "sig" / "summary.json"))
    assert s["outcome"] == "interrupted"
    state = RunDir(tmp_path / "sig").load_checkpoint()
    assert state["steps"] == s["steps"]


@pytest.mark.slow
def test_meta_keeps_earlier_sessions_after_resume(cfg_factory):
    s1 = train(cfg_factory(run={"total_steps": 4_000, "name": "meta"}, telemetry={"tensorboard": False}))
    train(cfg_factory(run={"total_steps": 8_000, "name": "meta"}, telemetry={"tensorboard": False}),
          resume=s1["run_dir"])
    meta = json.load(open(f"{s1['run_dir']}/meta.json"))
    assert meta["resumed_from_steps"] == s1["steps"]
    assert len(meta["previous"]) == 1 and meta["previous"][0]["resumed_from_steps"] == 0
