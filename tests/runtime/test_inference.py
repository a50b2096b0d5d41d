"""The central inference server's thread runs torch with the learner process's thread count."""

import threading
from multiprocessing import Pipe

import numpy as np
import psutil
import torch

from rlbalance import config as C
from rlbalance.agents.base import StepField
from rlbalance.agents.registry import build_model
from rlbalance.envs.batch import EnvSpec
from rlbalance.runtime.buffers import StepSlots
from rlbalance.runtime.inference import InferenceServer


def test_the_server_thread_starts_no_thread_pool_of_its_own():
    """An OpenMP team belongs to the thread that starts it, sized by that thread's own setting (one per CPU unless
    set): the server's forward passes had a team of two on a 2-CPU machine whose idle worker spin-waited between
    requests, most of a core taken from the actors (0.94 of a core measured at one actor, the actor left 0.45).
    With learner.torch_threads=1 the server must serve requests without starting any native thread besides its
    own."""
    spec = EnvSpec((16,), np.dtype(np.float32), 4, 1)
    k, clients = 8, 1
    before_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_model(C.LearnerConfig(hidden_sizes=(256, 256)), spec)
        slots = StepSlots.allocate(clients, k, spec, shared=False, record={"logits": StepField((4,))})
        slots.obs.uniform_()
        server_end, actor_end = Pipe()
        server = InferenceServer(model, slots, [server_end], torch.device("cpu"), k, max_batch=0, max_wait_ms=0.0,
                                 model_lock=threading.Lock(), version_fn=lambda: 0, seed=0)
        proc = psutil.Process()
        known = {t.id for t in proc.threads()}
        server.start()
        for _ in range(200):  # requests, each answered before the next
            actor_end.send_bytes(b"r")
            actor_end.recv_bytes()
        new = {t.id for t in proc.threads()} - known
        python = {t.native_id for t in threading.enumerate()}
        server.stop_event.set()
        actor_end.close()
        server.join(timeout=10)
    finally:
        torch.set_num_threads(before_threads)
    assert server.native_id in new  # (the count sees the server's own thread)
    assert new - python == set(), f"the server started {len(new - python)} native thread(s) beside its own"
