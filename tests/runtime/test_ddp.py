"""The learner on torch.distributed (issue 17): one learner process per device, gradients all-reduced by DDP.
On CPU with gloo, two ranks each training on half a batch make the same update as one learner on the whole."""

import copy

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from rlbalance import config as C
from rlbalance.agents.registry import build_model
from rlbalance.agents.vtrace.learner import Learner
from rlbalance.envs.batch import EnvSpec

T, N = 5, 8
CFG = dict(batch_size=N, normalize_advantages=False, normalize_observations=True, max_grad_norm=0.5,
           learning_rate=1e-2)


def _spec():
    return EnvSpec((4,), np.dtype(np.float32), 2, 1)


def _batch():
    g = torch.Generator().manual_seed(1)
    return {"obs": 3 + 2 * torch.randn(T + 1, N, 4, generator=g), "action": torch.randint(0, 2, (T + 1, N), generator=g),
            "logits": torch.randn(T + 1, N, 2, generator=g), "reward": torch.randn(T + 1, N, generator=g),
            "done": torch.rand(T + 1, N, generator=g) < 0.2, "truncated": torch.rand(T + 1, N, generator=g) < 0.1,
            "final_obs": torch.randn(T + 1, N, 4, generator=g)}


def _model(seed: int):
    torch.manual_seed(seed)
    return build_model(C.LearnerConfig(**CFG), _spec())


def _rank(rank: int, world: int, rendezvous: str, updates: int, out: dict) -> None:
    from rlbalance.core import distributed

    torch.set_num_threads(1)
    distributed.init(rank, world, torch.device("cpu"), rendezvous, timeout_s=60)
    try:
        # rank 1 starts from other weights: DDP gives every rank rank 0's at the start
        learner = Learner(_model(seed=rank), C.LearnerConfig(**CFG), torch.device("cpu"), total_steps=10**6,
                          distributed=True)
        cols = torch.arange(N).chunk(world)[rank]  # this rank's unrolls: an equal share of the batch
        shard = {k: v[:, cols] for k, v in _batch().items()}
        losses = [learner.train(shard)["total_loss"] for _ in range(updates)]
        out[rank] = {"state": {k: v.clone() for k, v in learner.model.state_dict().items()}, "losses": losses,
                     "steps": learner.steps}
    finally:
        distributed.close()


@pytest.mark.slow
def test_two_gloo_ranks_make_the_one_learner_update():
    from rlbalance.core.distributed import close_rendezvous, private_rendezvous

    updates = 2  # twice: both ranks must start the second update from the same new weights
    one = Learner(copy.deepcopy(_model(seed=0)), C.LearnerConfig(**CFG), torch.device("cpu"), total_steps=10**6)
    batch = _batch()
    one_losses = [one.train(batch)["total_loss"] for _ in range(updates)]

    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        rendezvous = private_rendezvous()
        procs = [ctx.Process(target=_rank, args=(r, 2, rendezvous, updates, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        close_rendezvous(rendezvous)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        res = dict(out)
    for r in range(2):
        for name, value in one.model.state_dict().items():  # weights and the observation statistics
            assert torch.allclose(res[r]["state"][name], value, atol=1e-5, rtol=1e-4), (r, name)
        assert res[r]["steps"] == updates * T * N  # each rank counts the steps of all (equal batches)
    # each rank's loss is over its half; their mean is the whole batch's loss
    assert np.mean([res[r]["losses"][0] for r in range(2)]) == pytest.approx(one_losses[0], rel=1e-4)
    assert torch.equal(res[0]["state"]["obs_norm.mean"], res[1]["state"]["obs_norm.mean"])


def test_learner_ranks_need_an_equal_share_of_the_actors_and_a_ray_cluster_they_all_join():
    with pytest.raises(C.ConfigError, match="multiple of learner.devices=2"):
        C.build({"learner": {"devices": 2}, "actors": {"num_actors": 3}})
    with pytest.raises(C.ConfigError, match="ray.address.*ray start --head"):  # a private Ray per rank: refused
        C.build({"learner": {"devices": 2}, "ray": {"address": "local"}})
    cfg = C.build({"learner": {"devices": 2}, "actors": {"num_actors": 4}})
    assert cfg.ddp and cfg.rank_config(1).actors.num_actors == 2 and cfg.rank_config(1).run.seed != cfg.run.seed
    assert C.build({"learner": {"devices": 2}, "run": {"mode": "serial"}}).rank_config(1).actors.num_actors == 1


@pytest.mark.slow
def test_cartpole_learns_with_two_gloo_learner_ranks(cfg_factory):
    """learner.devices=2 on CPU: two learner processes (gloo), one actor each, to the bar one learner meets
    (tests/learning/test_learning.py: a last-100 mean >= 400 within 500k steps); the summary has both ranks' figures."""
    from rlbalance.bench.seeds import learning_curve
    from rlbalance.runtime.train import train

    s = train(cfg_factory(learner={"devices": 2}, actors={"num_actors": 2},
                          run={"total_steps": 500_000, "name": "ddp2"}, telemetry={"tensorboard": False}))
    curve = learning_curve(s["run_dir"])
    assert s["outcome"] == "completed" and s["steps"] >= 500_000
    assert max(r for _, r in curve) >= 400, curve
    ranks = s["learner_ranks"]
    assert set(ranks) == {"0", "1"}
    for r in ranks.values():
        assert r["inference_batch_mean"] > 0
        assert {"actor", "inference", "learner"} <= set(r["stage_shares"]), r
    import json

    tel = json.load(open(f"{s['run_dir']}/telemetry.json"))
    assert tel["data_parallel"]["kind"] == "ddp" and tel["data_parallel"]["backend"] == "gloo"
    assert tel["data_parallel"]["summed_batch_unrolls"] == 2 * C.build({}).learner.batch_size


@pytest.mark.slow
def test_a_killed_learner_rank_stops_the_run_cleanly_and_it_resumes(tmp_path):
    """kill -9 of learner rank 1: the run stops with an error naming the rank, writes a checkpoint that resumes,
    and leaves no process or shared-memory file of its own behind."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    import psutil

    from rlbalance.bench.chaos_faults import _Tree
    from rlbalance.runtime.rundir import RunDir

    cmd = [sys.executable, "-m", "rlbalance", "train", "--env.id", "synthetic", "--env.synthetic_step_us", "20",
           "--learner.devices", "2", "--actors.num_actors", "2", "--actors.heartbeat_timeout_s", "20",
           "--run.out_dir", str(tmp_path), "--run.name", "rank", "--run.total_steps", "100000000",
           "--telemetry.progress", "false", "--telemetry.tensorboard", "false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    root = psutil.Process(proc.pid)
    tree, stop = _Tree(), threading.Event()

    def watch():
        while not stop.is_set():
            tree.poll(root)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    metrics = tmp_path / "rank" / "metrics.jsonl"
    deadline = time.time() + 180
    rank1 = None
    while time.time() < deadline and rank1 is None:
        time.sleep(0.5)
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            # rank 1: the run's child process with children of its own (its actors); rank 0's actors have none
            rank1 = next((c for c in root.children() if c.children()), None)
    assert rank1 is not None, "no training progress from the two learner ranks"
    rank1.kill()
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        stop.set()
        watcher.join()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode not in (0, None)
    assert "learner rank 1 stopped (killed by signal 9)" in err, err[-2000:]
    # rank 1's actors and its resource tracker see their parent gone and exit (the tracker removing any
    # shared memory left registered); allow them a while on a loaded machine
    deadline = time.time() + 30
    while time.time() < deadline and tree.alive():
        time.sleep(0.5)
    assert tree.alive() == [], [tree.what[p] for p in tree.alive()]
    assert not [n for n in tree.shm if os.path.exists(n)]  # (named files: semaphores, if any were made)
    summary = json.loads((tmp_path / "rank" / "summary.json").read_text())
    assert summary["outcome"] == "failed" and "learner rank 1" in summary["error"]
    run = RunDir(tmp_path / "rank")
    state = run.load_checkpoint()
    assert summary["last_good_checkpoint"] == str(run.latest_checkpoint()) and state["steps"] > 0
    from rlbalance.runtime.train import train

    resumed = train(C.build(C.merge(run.read_config().to_dict(), {"run": {"total_steps": state["steps"] + 5_000}})),
                    resume=run.path)
    assert resumed["outcome"] == "completed" and resumed["steps"] >= state["steps"] + 5_000
    assert set(resumed["learner_ranks"]) == {"0", "1"}


@pytest.mark.slow
def test_sweep_over_learner_ranks_records_each_rank_and_halves_r(tmp_path):
    """A sweep of learner.devices=1,2 (ddp) with 2 actors: R = actor cores per learner device halves, and the
    2-rank point keeps each rank's stage shares and inference batch."""
    from rlbalance.analysis.ratio import analyse
    from rlbalance.analysis.sweep import parse_axes, run_sweep

    base = {"env": {"id": "synthetic", "synthetic_step_us": 20.0}, "actors": {"num_actors": 2},
            "telemetry": {"warmup_s": 0.5, "hardware_interval_s": 0.5}}
    rows = run_sweep("ranks", base, parse_axes(["learner.devices=1,2"]), 12_000, tmp_path / "s.db",
                     str(tmp_path / "runs"))
    by_dev = {r["accelerators"]: r for r in rows}
    assert by_dev[1]["learner_ranks"] == {} and set(by_dev[2]["learner_ranks"]) == {"0", "1"}
    for rank in by_dev[2]["learner_ranks"].values():
        assert rank["inference_batch_mean"] > 0 and "learner" in rank["stage_shares"]
    a = analyse(rows)
    r_of = {p["accelerators"]: p["R"] for p in a["points"]}
    assert r_of[2] == r_of[1] / 2 == 1


@pytest.mark.slow
def test_torchrun_launches_the_learner_ranks(tmp_path):
    """torchrun --nproc-per-node 2 -m rlbalance train --learner.devices 2: rank 0 keeps the run directory, rank 1
    joins it (the same code path as between nodes)."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "rlbalance", "train",
           "--env.id", "synthetic", "--env.synthetic_step_us", "20", "--learner.devices", "2",
           "--actors.num_actors", "2", "--run.total_steps", "10000", "--run.out_dir", str(tmp_path),
           "--run.name", "tr", "--telemetry.progress", "false", "--telemetry.tensorboard", "false"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "learner rank 1: completed" in out.stdout
    s = json.loads((tmp_path / "tr" / "summary.json").read_text())
    assert s["outcome"] == "completed" and s["steps"] >= 10_000 and set(s["learner_ranks"]) == {"0", "1"}
    tel = json.loads((tmp_path / "tr" / "telemetry.json").read_text())
    assert tel["data_parallel"]["launcher"] == "torchrun"
    assert not any(p.name != "tr" for p in tmp_path.iterdir())  # rank 1 wrote no run directory


def test_a_straggling_rank_is_named():
    from rlbalance.runtime.role_figures import straggling_rank

    def rank(wait):
        return {"stage_shares": {"learner": {"wait_data": wait}}}

    slow = straggling_rank({"0": rank(0.05), "1": rank(0.6), "2": rank(0.1)})
    assert slow["rank"] == 1 and "learner rank 1" in slow["evidence"]
    assert straggling_rank({"0": rank(0.3), "1": rank(0.35)}) is None  # within the gap: nobody holds others back


def test_a_non_finite_loss_on_any_rank_stops_every_rank(cfg_factory):
    """NaN rewards reach the ranks at different updates: the collective check stops every rank at the same step
    (none left waiting in a collective), with the NaN error, and no new checkpoint over the last good one."""
    import psutil

    from rlbalance.core.errors import NonFiniteLossError
    from rlbalance.runtime.rundir import RunDir
    from rlbalance.runtime.train import train

    def ours():  # (multiprocessing's resource tracker lives as long as this process, once a spawn started it)
        return {p.pid for p in psutil.Process().children(recursive=True)
                if "resource_tracker" not in " ".join(p.cmdline())}

    before = ours()
    cfg = cfg_factory(env={"id": "synthetic", "synthetic_step_us": 20.0, "synthetic_fault": "nan:600"},
                      learner={"devices": 2}, actors={"num_actors": 2},
                      run={"total_steps": 10**7, "name": "nan2", "checkpoint_interval_s": 0.3},
                      telemetry={"tensorboard": False})
    with pytest.raises(NonFiniteLossError):
        train(cfg)
    state = RunDir(f"{cfg.run.out_dir}/nan2").load_checkpoint()
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    import time

    deadline = time.time() + 30
    while time.time() < deadline and ours() - before:
        time.sleep(0.5)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid in ours() - before]
    assert not left, [" ".join(p.cmdline())[-80:] for p in left]


@pytest.mark.slow
def test_ctrl_c_on_rank_0_stops_every_rank_with_the_final_report(tmp_path):
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "rlbalance", "train", "--env.id", "synthetic", "--env.synthetic_step_us", "20",
           "--learner.devices", "2", "--actors.num_actors", "2", "--run.out_dir", str(tmp_path), "--run.name", "int",
           "--run.total_steps", "100000000", "--telemetry.progress", "false", "--telemetry.tensorboard", "false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = tmp_path / "int" / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the group gets it
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    s = json.loads((tmp_path / "int" / "summary.json").read_text())
    assert s["outcome"] == "interrupted" and set(s["learner_ranks"]) == {"0", "1"}
    assert "Traceback" not in err, err[-2000:]
