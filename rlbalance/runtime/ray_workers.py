"""The Ray side of the Ray runner: connecting to (or starting) the cluster, and ``EnvWorker``, the Ray actor that
steps one actor's env groups (a step per call with central inference, a whole unroll with actor-side inference)."""

from __future__ import annotations

import os
import socket
import time
import warnings
from typing import Any

import numpy as np
import torch

from rlbalance.agents import registry
from rlbalance.config import Config
from rlbalance.core.errors import ConfigError
from rlbalance.core.timing import StageTimer
from rlbalance.runtime.actor import Rollout, client_seed, unroll_base
from rlbalance.runtime.policies import DirectPolicy, acting_values, group_values
from rlbalance.runtime.buffers import RolloutBuffers

_RETRY_S = 0.5  # how often a restarting actor is asked again


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("ray.address is set but Ray is not installed: pip install 'rlbalance[ray]' "
                          "(or leave ray.address empty for local actor processes)") from None
    return ray


def loopback_env(cfg: Config) -> None:
    """On loopback, Ray must not resolve 127.0.0.1 to this host's network address (a closed network
    would refuse it, and nothing should be exposed). Set before Ray starts or is connected to."""
    if cfg.ray.loopback:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


def private_ray_dir() -> str:
    """The folder of a private Ray's session files and sockets: this user's own (0700), where Ray's default
    (/tmp/ray) is open to everyone, its sockets too. An existing one owned by another user, or open to others, is
    refused rather than used."""
    import stat
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"rlbalance-ray-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise ConfigError(f"ray.address=local: {path} (the private Ray's folder) is not a folder of yours; remove it")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def connect(cfg: Config):
    """ray.init for this run: a private Ray on 127.0.0.1, or a running cluster. Returns the module and
    whether this call started the connection (then the run shuts it down at its end); a process already
    connected (a benchmark, a notebook) keeps its connection."""
    loopback_env(cfg)
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    rc = cfg.ray
    kw = dict(logging_level="WARNING", log_to_driver=True,
              runtime_env={"env_vars": {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}} if rc.loopback else None)
    if rc.address == "local":
        ray.init(address="local", num_cpus=rc.num_cpus or None, include_dashboard=rc.dashboard,
                 dashboard_host="127.0.0.1", object_store_memory=rc.object_store_mb * 2**20,
                 _node_ip_address="127.0.0.1", _temp_dir=private_ray_dir(), **kw)
    else:
        if rc.loopback:
            kw["_node_ip_address"] = "127.0.0.1"
        try:
            ray.init(address=rc.address, **kw)
        except (ConnectionError, RuntimeError) as e:
            raise ConfigError(f"ray.address={rc.address!r}: cannot join the Ray cluster ({e}); start one with "
                              "`ray start --head` or use ray.address=local") from None
    return ray, True


class EnvWorker:
    """One actor on a Ray node: ``env_groups`` EnvBatches of K envs (a Ray actor class, see worker_class)."""

    def __init__(self, actor_id: int, cfg_dict: dict, module_dirs: list[str] | None = None):
        import sys

        import psutil
        import ray

        # The user's env modules where the learner found them (same machine or a shared filesystem; elsewhere
        # they must be installed on the node).
        sys.path.extend(d for d in module_dirs or [] if d not in sys.path and os.path.isdir(d))

        from rlbalance.config import from_dict
        from rlbalance.runtime.actor import actor_env_groups, init_process

        cfg = from_dict(cfg_dict)
        self.cfg, self.actor_id = cfg, actor_id
        ctx = ray.get_runtime_context()
        with warnings.catch_warnings():  # Ray's own property warns about an API it uses inside
            warnings.simplefilter("ignore")
            self.restarted = bool(ctx.was_current_actor_reconstructed)
        life = (os.getpid() % 997 + 1) if self.restarted else 0
        self.life = life
        g = cfg.actors.env_groups
        clients = [actor_id * g + i for i in range(g)]
        try:
            init_process(1, None, client_seed(cfg, clients[0]) + 7919 * life)
        except ValueError:  # signals are only set from a main thread
            torch.set_num_threads(1)
        self.envs = actor_env_groups(cfg, actor_id, life)
        self.timer = StageTimer(cfg.telemetry.stage_timers)
        self.node = {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                     "host": socket.gethostname(), "pid": os.getpid()}
        self.proc = psutil.Process()
        self._cpu0 = sum(self.proc.cpu_times()[:2])
        psutil.cpu_percent(None)
        self._last_report = time.perf_counter()
        self.local: tuple[Any, Any, Any, dict[str, int]] | None = None  # actor-side inference: (model, rollouts,
        # buffers, version), built on first use
        self._t_out: float | None = None  # when the last call returned

    def info(self) -> dict:
        return dict(self.node, actor=self.actor_id, restarted=self.restarted)

    def reset(self, group: int) -> np.ndarray:
        with self.timer.stage("reset"):
            return self.envs[group].reset()  # Ray serialises replies as the method returns: no copies

    def step(self, group: int, actions: np.ndarray):
        """Step one env group; returns its StepResult fields, final_obs where truncated, and now and
        then a telemetry report."""
        t_in = time.perf_counter()
        if self._t_out is not None:
            self.timer.add("wait_action", t_in - self._t_out)
        with self.timer.stage("env_step"):
            envs = self.envs[group]
            r = envs.step(actions)
        final = envs.final_obs[r.truncated] if r.truncated.any() else None
        out = (r, final, self._report())
        self._t_out = time.perf_counter()
        return out

    def unroll(self, group: int, weights, version: int):
        """Actor-side inference: T steps with the local policy; the whole unroll comes back."""
        t_in = time.perf_counter()
        if self._t_out is not None:
            self.timer.add("wait_buffer", t_in - self._t_out)
        if self.local is None:
            cfg = self.cfg
            spec = self.envs[0].spec
            model = registry.build_model(cfg.learner, spec)
            self.local = (model, None, None, {"version": 0})
        model, rollouts, bufs, state = self.local
        if weights is not None:
            with self.timer.stage("weight_sync"), torch.no_grad():
                torch.nn.utils.vector_to_parameters(torch.as_tensor(weights), model.parameters())
            state["version"] = version
        if rollouts is None:  # (after the first weights: a Rollout asks for its first actions as it starts)
            cfg = self.cfg
            gen = torch.Generator().manual_seed(client_seed(cfg, self.actor_id * cfg.actors.env_groups) + 1)
            values = acting_values(cfg)
            k, g = cfg.actors.envs_per_actor, cfg.actors.env_groups
            clients = [self.actor_id * g + i for i in range(g)]
            held: dict[str, int] = state
            rollouts = [Rollout(e, DirectPolicy(model, k, gen, lambda: held["version"], group_values(values, c)),
                                self.timer, c, unroll_base(self.life)) for e, c in zip(self.envs, clients)]
            spec = self.envs[0].spec
            bufs = RolloutBuffers.allocate(1, cfg.learner.unroll_length, k, spec, shared=False,
                                           record=registry.step_record(cfg, spec),
                                           core_size=registry.core_state_size(cfg.learner, spec))
            self.local = (model, rollouts, bufs, state)
        assert rollouts is not None and bufs is not None
        rollouts[group].fill(bufs.view(0))
        out = (bufs.view(0).arrays(), self._report())
        self._t_out = time.perf_counter()
        return out

    def _report(self) -> dict | None:
        now = time.perf_counter()
        if now - self._last_report < 1.0:
            return None
        self._last_report = now
        return self.report()

    def report(self) -> dict:
        import psutil

        cpu = sum(self.proc.cpu_times()[:2])
        snap = self.timer.snapshot(reset=True)
        out = {"stages": snap, "node": self.node["ip"] + "/" + self.node["node_id"][:8], "actor": self.actor_id,
               "cpu_s": cpu - self._cpu0, "node_cpu_util": psutil.cpu_percent(None) / 100.0}
        self._cpu0 = cpu
        return out


def worker_class(ray, cfg: Config):
    return ray.remote(num_cpus=cfg.ray.cpus_per_actor, max_restarts=cfg.actors.max_restarts,
                      max_task_retries=0)(EnvWorker)


class NodeReports:
    """On learner ranks 1..N-1: the Ray actors' node reports, kept until the next report to rank 0 (whose NodeStats
    takes them)."""

    def __init__(self) -> None:
        self.reports: list[dict] = []

    def add(self, rep: dict) -> None:
        self.reports.append(rep)

    def take(self) -> list[dict]:
        out, self.reports = self.reports, []
        return out

    def scalars(self) -> dict[str, float]:
        return {}  # (rank 0 logs the nodes' figures)

    def summary(self) -> dict[str, dict]:
        return {}


class NodeStats:
    """Per-node CPU figures reported by Ray actors (the local sampler cannot see other nodes)."""

    def __init__(self) -> None:
        self.latest: dict[str, dict] = {}
        self.total: dict[str, dict] = {}

    def add(self, rep: dict) -> None:
        node = rep["node"]
        n = self.latest.setdefault(node, {"cpu_s": 0.0, "wall_s": 0.0, "actors": set(), "node_cpu_util": 0.0})
        n["cpu_s"] += rep["cpu_s"]
        n["wall_s"] = max(n["wall_s"], rep["stages"]["wall_s"])
        n["actors"].add(rep["actor"])
        n["node_cpu_util"] = rep["node_cpu_util"]
        tot = self.total.setdefault(node, {"cpu_s": 0.0, "wall_s": 0.0, "actors": set(), "util": []})
        tot["cpu_s"] += rep["cpu_s"]
        tot["wall_s"] += rep["stages"]["wall_s"]
        tot["actors"].add(rep["actor"])
        tot["util"].append(rep["node_cpu_util"])

    def scalars(self) -> dict[str, float]:
        out = {}
        for i, (node, n) in enumerate(sorted(self.latest.items())):
            out[f"ray/node{i}_actor_cpu_cores"] = n["cpu_s"] / max(n["wall_s"], 1e-9)
            out[f"ray/node{i}_cpu_util"] = n["node_cpu_util"]
            out[f"ray/node{i}_actors"] = float(len(n["actors"]))
        self.latest.clear()
        return out

    def summary(self) -> dict[str, dict]:
        return {node: {"actors": sorted(t["actors"]), "actor_cpu_seconds": t["cpu_s"],
                       "node_cpu_util_mean": float(np.mean(t["util"])) if t["util"] else None}
                for node, t in sorted(self.total.items())}
