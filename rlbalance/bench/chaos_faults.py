"""Where the chaos bench's faults land: the run's process tree (what it started and mapped), the actor processes of
each runtime path, a learner rank, and a two-node Ray cluster on 127.0.0.1 whose worker node can be killed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil


class _Tree:
    """Every process the run's learner started (seen by polling), and the shared-memory files they mapped."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}  # pid -> create_time
        self.what: dict[int, str] = {}  # pid -> its command line, shortened
        self.shm: set[str] = set()
        self._lock = threading.Lock()

    def poll(self, root: psutil.Process) -> None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            try:
                ct = p.create_time()
                maps = Path(f"/proc/{p.pid}/maps")
                names = {line.split(None, 5)[5].strip() for line in maps.read_text().splitlines()
                         if "/dev/shm/" in line and len(line.split(None, 5)) == 6} if maps.exists() else set()
                # (read here too: a process that exits between the listing and this read is simply gone; a clean-
                # clone CI run failed on psutil.NoSuchProcess from a cmdline read outside this guard)
                what = " ".join(p.cmdline())[-120:] if p.pid not in self.seen else None
            except (psutil.Error, OSError):
                continue
            with self._lock:
                if p.pid not in self.seen:
                    self.seen[p.pid] = ct
                    self.what[p.pid] = what or "?"
                self.shm.update(n.replace(" (deleted)", "") for n in names if not n.endswith("(deleted)"))

    def alive(self) -> list[int]:
        out = []
        for pid, ct in self.seen.items():
            try:
                if psutil.Process(pid).create_time() == ct:
                    out.append(pid)
            except psutil.Error:
                pass
        return out


def _actors(root: psutil.Process, min_age_s: float) -> list[psutil.Process]:
    """The learner's running actor processes at least ``min_age_s`` old: its direct children, less
    multiprocessing's resource tracker and any actor already stopped."""
    out = []
    try:
        for c in root.children(recursive=False):
            try:
                if "resource_tracker" not in " ".join(c.cmdline()) and c.status() != psutil.STATUS_STOPPED \
                        and time.time() - c.create_time() >= min_age_s:
                    out.append(c)
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return out


def _leaf_processes(root: psutil.Process, min_age_s: float) -> list[psutil.Process]:
    """Actor processes wherever they are in the learner's tree (a learner rank's among them): the processes with
    no children of their own, less multiprocessing's resource tracker, stopped ones and those younger than
    ``min_age_s``."""
    out = []
    try:
        procs = root.children(recursive=True)
    except psutil.Error:
        return out
    for c in procs:
        try:
            if not c.children() and "resource_tracker" not in " ".join(c.cmdline()) \
                    and c.status() != psutil.STATUS_STOPPED and time.time() - c.create_time() >= min_age_s:
                out.append(c)
        except psutil.Error:
            pass
    return out


def _ray_actors(min_age_s: float) -> list[psutil.Process]:
    """The Ray actor processes (``ray::EnvWorker``) of the cluster this bench started (its raylets are its
    children), at least ``min_age_s`` old and not stopped."""
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if "ray::EnvWorker" in " ".join(c.cmdline()) and c.status() != psutil.STATUS_STOPPED \
                    and time.time() - c.create_time() >= min_age_s:
                out.append(c)
        except psutil.Error:
            pass
    return out


def _learner_rank(root: psutil.Process, rank: int) -> psutil.Process | None:
    """Learner rank ``rank`` >= 1: the child of rank 0 that has actor processes of its own."""
    try:
        ranks = [c for c in root.children(recursive=False) if c.children()]
    except psutil.Error:
        return None
    return ranks[rank - 1] if len(ranks) >= rank else None


class _RayCluster:
    """A head and a worker node on 127.0.0.1 (Ray's own test utility), 2 CPUs each; the worker node can be killed
    and replaced."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
        self.worker = self.cluster.add_node(num_cpus=2)
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address

    def kill_worker(self) -> None:
        self.cluster.remove_node(self.worker, allow_graceful=False)

    def add_worker(self) -> None:
        self.worker = self.cluster.add_node(num_cpus=2)

    def shutdown(self) -> None:
        self.cluster.shutdown()
