"""The central inference role: dynamic batching over all actors' envs, one forward pass per batch.

Runs as a thread in the learner process, on the learner device, with the learner's model (new
weights are used at once; a lock keeps a forward pass from seeing a half-applied optimizer step).
"""

from __future__ import annotations

import threading
import time
from multiprocessing.connection import Connection, wait

import torch

from rlbalance.core.timing import StageTimer
from rlbalance.runtime.policies import EnvStates
from rlbalance.runtime.buffers import StepSlots


class InferenceServer(threading.Thread):
    def __init__(self, model: torch.nn.Module, slots: StepSlots, conns: list, device: torch.device,
                 envs_per_actor: int, max_batch: int, max_wait_ms: float, model_lock: threading.Lock,
                 version_fn, seed: int, timers: bool = True, values: torch.Tensor | None = None):
        super().__init__(name="inference", daemon=True)
        self.torch_threads = torch.get_num_threads()  # the learner process's (learner.torch_threads)
        self.model, self.slots, self.conns, self.device = model, slots, conns, device
        self.k = envs_per_actor
        self.max_clients = max(1, (max_batch or envs_per_actor * len(conns)) // envs_per_actor)
        self.max_wait = max_wait_ms / 1000.0
        self.model_lock, self.version_fn = model_lock, version_fn
        self.stop_event = threading.Event()
        self.timer = StageTimer(timers)
        self.batch_sizes: list[int] = []
        self.error: BaseException | None = None
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.pinned = None
        self.gpu_busy_s = 0.0  # true device time of the forward passes, from CUDA events
        if device.type == "cuda":
            self.pinned = torch.empty_like(slots.obs).pin_memory()
            self._ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        # every env's core state (a recurrent policy's, kept on the learner device as SEED does) and acting values
        self.envs = EnvStates(model, len(conns), self.k, device, values)
        self._conn_index = {id(c): i for i, c in enumerate(conns) if c is not None}
        self._lock = threading.Lock()
        # clients whose channel closed (a dead actor) until replaced, or that no actor runs (a pool below capacity)
        self._dead: set[int] = {i for i, c in enumerate(conns) if c is None}
        self._replaced: set[int] = set()

    def replace_clients(self, ids: list[int], conns: list) -> None:
        """New channels for a restarted actor's env groups (called from the learner thread)."""
        with self._lock:
            for i, c in zip(ids, conns):
                self.conns[i] = c
                self._dead.discard(i)
                self._replaced.add(i)
            self._conn_index = {id(c): i for i, c in enumerate(self.conns) if c is not None}

    def remove_clients(self, ids: list[int]) -> None:
        """A retired actor's env groups: no longer served (called from the learner thread, before their channels
        are closed)."""
        with self._lock:
            for i in ids:
                self.conns[i] = None
                self._dead.add(i)
                self._replaced.add(i)
            self._conn_index = {id(c): i for i, c in enumerate(self.conns) if c is not None}

    def set_layout(self, max_wait_ms: float | None = None, torch_threads: int | None = None,
                   max_batch: int | None = None) -> None:
        """Move the server's knobs while it runs (a run that balances itself): its wait for a fuller batch, its
        thread's torch threads (applied before its next batch), the most envs in one forward pass (0: all)."""
        if max_wait_ms is not None:
            self.max_wait = max_wait_ms / 1000.0
        if torch_threads is not None:
            self.torch_threads = torch_threads
        if max_batch is not None:
            self.max_clients = max(1, (max_batch or self.k * len(self.conns)) // self.k)

    def _collect(self, pending: list[int]) -> list[int]:
        """Wait for requests; return the client (env group) ids to serve now, oldest first.

        Blocks until one request is in, takes every other request already there, then waits up to
        max_wait for more while the batch is below max_batch (max_wait 0: serve what is ready)."""
        with self._lock:
            if self._replaced:  # requests from a replaced process are void
                pending = [i for i in pending if i not in self._replaced]
                self._replaced.clear()
            waiting = [c for i, c in enumerate(self.conns) if i not in pending and i not in self._dead]
            index = dict(self._conn_index)
        if not waiting and not pending:
            time.sleep(0.01)  # every client is dead or being replaced
            return pending
        deadline = None
        while len(pending) < self.max_clients and waiting and not self.stop_event.is_set():
            if not pending:
                timeout = 0.1
            elif deadline is None:
                timeout = 0.0  # first sweep up what is already there
                deadline = time.perf_counter() + self.max_wait
            else:
                timeout = deadline - time.perf_counter()
                if timeout <= 0:
                    break
            if not waiting:
                break
            ready = wait(waiting, timeout=timeout)
            if not ready and pending and (timeout > 0 or self.max_wait == 0):
                break
            for c in ready:
                assert isinstance(c, Connection)  # (wait() returns what it was given: the clients' pipes)
                waiting.remove(c)
                try:
                    c.recv_bytes()
                except (EOFError, OSError):  # the actor died; the learner restarts it
                    with self._lock:
                        if index.get(id(c)) is not None and self.conns[index[id(c)]] is c:
                            self._dead.add(index[id(c)])
                    continue
                pending.append(index[id(c)])
        return pending

    def run(self) -> None:
        # A thread's OpenMP team size is its own: without this the server's matrix products ran on a team of one
        # per CPU whose idle worker spin-waited between requests, a core burned (measured: 0.94 of a core at one
        # actor on 2 CPUs, where the actor got 0.45)
        torch.set_num_threads(self.torch_threads)
        try:
            self._loop()
        except BaseException as e:  # surfaced by the learner loop
            if self.stop_event.is_set():
                return  # channels closed at shutdown
            self.error = e

    def _loop(self) -> None:
        pending: list[int] = []
        slots, timer = self.slots, self.timer
        threads = self.torch_threads
        while not self.stop_event.is_set():
            if self.torch_threads != threads:
                threads = self.torch_threads
                torch.set_num_threads(threads)
            with timer.stage("batch_wait"):
                pending = self._collect(pending)
            if not pending:
                continue
            ids, pending = pending[: self.max_clients], pending[self.max_clients:]
            with self._lock:
                targets = [self.conns[i] for i in ids]  # the channels these requests came on (None: removed since)
            idx = torch.tensor(ids)
            with timer.stage("h2d"):
                if self.pinned is not None:
                    staged = self.pinned[: len(ids)]
                    torch.index_select(slots.obs, 0, idx, out=staged)
                    obs = staged.to(self.device, non_blocking=True)
                else:
                    obs = slots.obs[idx]
                obs = obs.reshape(len(ids) * self.k, *obs.shape[2:])
            with timer.stage("forward"), self.model_lock:
                if self.pinned is not None:
                    self._ev[0].record()
                actions, out, core_in = self._step(idx, obs)
                if self.pinned is not None:
                    self._ev[1].record()
                version = self.version_fn()
            with timer.stage("d2h"):
                slots.action[idx] = actions.view(len(ids), self.k, *actions.shape[1:]).cpu()  # synchronises the stream
                for name, x in out.items():
                    slot = slots.record[name]
                    slot[idx] = x.view(len(ids), self.k, *slot.shape[2:]).to(slot.dtype).cpu()
                slots.version[idx] = version
                if core_in is not None:
                    slots.core_in[idx] = core_in.view(len(ids), self.k, *core_in.shape[1:]).cpu()
            if self.pinned is not None:
                self.gpu_busy_s += self._ev[0].elapsed_time(self._ev[1]) / 1000.0
            for i, c in zip(ids, targets):
                with self._lock:
                    if c is None or self.conns[i] is not c:
                        continue  # the actor was restarted meanwhile: its new process asks afresh
                try:
                    c.send_bytes(b"a")
                except (BrokenPipeError, EOFError, OSError):
                    with self._lock:
                        self._dead.add(i)
            self.batch_sizes.append(len(ids) * self.k)

    def _step(self, idx: torch.Tensor, obs: torch.Tensor
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
        """One step of the policy for clients ``idx``: the actions, the net's record of the step and the states it
        started from (the actor records them at the start of each unroll; None: feed-forward)."""
        first = None if self.envs.state is None else self.slots.first[idx].reshape(-1).to(self.device)
        return self.envs.step(idx.to(self.device), obs, first, self.generator)

    def stop(self) -> None:
        self.stop_event.set()
