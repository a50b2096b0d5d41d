"""The bottleneck verdict on controlled scenarios built from costs measured first, so that a slower or loaded machine
gets the same shape (no assertion depends on the machine's speed). Actor-bound and learner-bound are the two ends
of the sweep-shape test (tests/analysis/test_sweep.py); here the inference server is the limit, once by its forward passes and
once by its copies."""

import statistics
import threading
import time
from multiprocessing import Pipe

import pytest
import torch

from rlbalance import config as C
from rlbalance.agents.registry import build_model
from rlbalance.analysis.calibrate import _median_time
from rlbalance.bench.trainer import learner_ceiling
from rlbalance.core.timing import StageTimer
from rlbalance.envs.batch import probe_spec
from rlbalance.runtime.buffers import StepSlots
from rlbalance.runtime.inference import InferenceServer
from rlbalance.runtime.train import train
from rlbalance.telemetry.verdict import decide


def test_a_run_that_waits_on_its_inference_server_is_inference_bound(tmp_path):
    """A free env, one env per actor and inference.max_batch=1: the server answers one env per forward pass, so a
    step costs one whole forward pass (its per-call overhead), while the learner trains on batches of B x T steps.
    The learner's batch is chosen from measured costs, so that a step costs the learner under a third of what it
    costs the server; then four actors keep the server busy, wait for it, and the learner waits for data."""
    base = {"env": {"id": "synthetic", "synthetic_step_us": 0.0}, "actors": {"num_actors": 4, "envs_per_actor": 1},
            "inference": {"max_batch": 1}, "run": {"total_steps": 10**12, "max_seconds": 12.0,
                                                   "out_dir": str(tmp_path)},
            "telemetry": {"progress": False, "report": False, "tensorboard": False, "warmup_s": 3.0}}
    cfg = C.build(base)
    spec = probe_spec(cfg.env)
    model = build_model(cfg.learner, spec)
    one = torch.zeros(1, *spec.obs_shape)
    call_us = _median_time(lambda: model.act(one), reps=3, min_s=0.2) * 1e6
    batch = 16
    while True:
        over = C.merge(base, {"learner": {"batch_size": batch}})
        learner_us = 1e6 / learner_ceiling(C.build(over), seconds=1.0)["sps"]
        if 3 * learner_us < call_us or batch >= 256:
            break
        batch *= 2
    assert 3 * learner_us < call_us, (learner_us, call_us)  # the scenario's premise, measured
    s = train(C.build(over))
    assert s["verdict"] == "inference-bound", (s["verdict"], s["verdict_evidence"], s["stage_shares"])
    assert "wait for actions" in s["verdict_evidence"]
    if not torch.cuda.is_available():  # the advice fits a machine without a GPU: nothing about moving to one
        assert "no GPU" in s["verdict_advice"] and "learner.device=cuda" not in s["verdict_advice"]


class _SliceHead(torch.nn.Module):
    """A policy whose forward pass reads a few features of each observation, so its cost does not grow with the
    observation's size (as a fast accelerator's forward pass against the host copies it waits for)."""

    def __init__(self, num_actions: int = 4):
        super().__init__()
        self.head = torch.nn.Linear(4, num_actions)

    @torch.inference_mode()
    def act(self, obs, generator=None, explore=None):  # (the net interface: see rlbalance.agents.base)
        logits = self.head(obs[:, :4])
        return logits.argmax(dim=-1), {"logits": logits}


def _serve(model, obs_dim: int, clients: int = 4, k: int = 4, seconds: float = 3.0) -> dict:
    """The real inference server on shared-memory slots, with ``clients`` free actors (threads that ask for actions
    as soon as they have them): the stage shares of the server and of the actors after a warm-up."""
    slots = StepSlots(obs=torch.rand(clients, k, obs_dim).share_memory_(),
                      action=torch.zeros(clients, k, dtype=torch.int64),
                      version=torch.zeros(clients, dtype=torch.int64), first=torch.zeros(clients, k, dtype=torch.bool),
                      core_in=torch.zeros(clients, k, 0), record={"logits": torch.zeros(clients, k, 4)})
    pairs = [Pipe() for _ in range(clients)]
    server = InferenceServer(model, slots, [a for a, _ in pairs], torch.device("cpu"), k, max_batch=0,
                             max_wait_ms=0.0, model_lock=threading.Lock(), version_fn=lambda: 0, seed=0)
    stop, warm = threading.Event(), threading.Event()
    waits: list[float] = []
    walls: list[float] = []

    def actor(conn):
        wait, t0 = 0.0, None
        while not stop.is_set():
            if t0 is None and warm.is_set():
                wait, t0 = 0.0, time.perf_counter()
            t = time.perf_counter()
            conn.send_bytes(b"r")
            conn.recv_bytes()
            wait += time.perf_counter() - t
        waits.append(wait)
        walls.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=actor, args=(b,), daemon=True) for _, b in pairs]
    server.start()
    for t in threads:
        t.start()
    time.sleep(1.0)
    server.timer.snapshot(reset=True)
    warm.set()
    time.sleep(seconds)
    shares = StageTimer.shares(server.timer.snapshot())
    stop.set()
    for t in threads:
        t.join(timeout=10)
    server.stop_event.set()
    server.join(timeout=10)
    return {"inference": shares, "actor": {"wait_action": statistics.mean(w / t for w, t in zip(waits, walls)),
                                           "env_step": 0.0, "wait_buffer": 0.0},
            "learner": {"wait_data": 1.0}}  # no learner in this scenario: it only ever waits


@pytest.mark.slow
def test_the_server_split_between_copies_and_forward_passes_decides_transfer_or_inference():
    """The same server, actors and observations, two policies: one whose forward pass reads every feature through a
    256-unit layer (inference-bound), one that reads four (its time goes to gathering the observations: transfer-
    bound). The observation size is grown from measured costs until gathering a batch costs at least four times
    the small policy's forward pass, the server waits for requests under a fifth of its time (on a quiet machine
    small copies leave it waiting for the actors' turnaround), and the large policy's pass costs four copies."""
    clients, k = 4, 4
    dim = 4096
    small, idx = _SliceHead(), torch.arange(clients)
    transfer = None
    while True:  # (the premises measured: copies dominate the small policy's pass and keep the server busy)
        obs = torch.rand(clients, k, dim)
        copy_s = _median_time(lambda: obs[idx], reps=3, min_s=0.05)  # what the server's gather does
        small_s = _median_time(lambda: small.act(obs.reshape(clients * k, dim)), reps=3, min_s=0.05)
        if copy_s > 4 * small_s:
            transfer = _serve(small, dim, clients, k)
            if transfer["inference"].get("batch_wait", 1.0) < 0.2:
                break
        if dim >= 1 << 18:
            break
        dim *= 2
    large = torch.nn.Sequential(torch.nn.Linear(dim, 256), torch.nn.Linear(256, 4))
    with torch.inference_mode():
        large_s = _median_time(lambda: large(obs.reshape(clients * k, dim)), reps=3, min_s=0.05)
    assert transfer is not None and copy_s > 4 * small_s and large_s > 4 * copy_s, (dim, copy_s, small_s, large_s)

    class _Large(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = large

        @torch.inference_mode()
        def act(self, o, generator=None, explore=None):
            logits = self.net(o)
            return logits.argmax(dim=-1), {"logits": logits}

    v = decide(transfer, central=True)
    assert v["verdict"] == "transfer-bound", (v, transfer)
    assert "copying" in v["evidence"]
    cpu_only = decide(transfer, central=True, machine={"gpus": 0, "learner_device": "cpu"})
    assert "host-memory copies" in cpu_only["advice"]
    inference = _serve(_Large(), dim, clients, k)
    v = decide(inference, central=True)
    assert v["verdict"] == "inference-bound", (v, inference)
