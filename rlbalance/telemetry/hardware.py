"""Hardware sampler: CPU, memory, GPU and power figures in a thread beside the learner.

Every power or energy figure carries a ``source``: ``measured`` (NVML, RAPL) or ``modeled`` (a power
model with stated watts, used where no counter can be read, as on a machine without a GPU or RAPL).
Readers are small functions at the library boundary, so tests can fake them.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from dataclasses import dataclass, field

import psutil

from rlbalance.core.thinned import Thinned


@dataclass(frozen=True)
class PowerModel:
    """Stated watts used where power cannot be measured."""

    cpu_watts_per_busy_core: float = 10.0
    cpu_idle_watts: float = 20.0
    gpu_idle_watts: float = 60.0
    gpu_busy_watts: float = 300.0
    base_watts: float = 100.0  # the rest of the node: memory, disks, fans, network


# -- readers (faked in tests) -----------------------------------------------------------------


def read_rapl_energy_uj() -> dict[str, int] | None:
    """CPU package energy counters from /sys/class/powercap (microjoules), or None if unreadable."""
    out = {}
    for path in sorted(glob.glob("/sys/class/powercap/intel-rapl:*/energy_uj")):
        name_file = os.path.join(os.path.dirname(path), "name")
        try:
            with open(name_file) as f:
                name = f.read().strip()
            if not name.startswith("package"):
                continue
            with open(path) as f:
                out[os.path.dirname(path)] = int(f.read().strip())
        except (OSError, ValueError):
            continue
    return out or None


def read_rapl_ranges_uj() -> dict[str, int]:
    """Each package counter's wrap-around value (max_energy_range_uj), read once."""
    out = {}
    for path in sorted(glob.glob("/sys/class/powercap/intel-rapl:*/max_energy_range_uj")):
        try:
            with open(path) as f:
                out[os.path.dirname(path)] = int(f.read().strip())
        except (OSError, ValueError):
            continue
    return out


#: hardware samples a run's timeline holds at most (a day at 1/s is 86,400): evenly thinned beyond it
TIMELINE_CAP = 2048
RAPL_MAX_W_PER_PACKAGE = 1000.0  # no CPU package draws more: a larger figure is a counter fault, never measured


def rapl_delta_uj(new: int, old: int, wrap: int | None) -> int | None:
    """Energy between two readings of one counter; across a wrap, using the counter's own range. None where
    the counter went backwards and its range is unknown (the figure cannot be trusted)."""
    if new >= old:
        return new - old
    return new + wrap - old if wrap else None


class NvmlReader:
    """GPU utilization, memory, power and the energy counter through nvidia-ml-py."""

    def __init__(self) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if not self.handles:
            raise RuntimeError("no NVIDIA GPU")

    def read(self) -> list[dict]:
        n = self.nvml
        out = []
        for h in self.handles:
            util = n.nvmlDeviceGetUtilizationRates(h)
            mem = n.nvmlDeviceGetMemoryInfo(h)
            try:
                energy_mj = n.nvmlDeviceGetTotalEnergyConsumption(h)
            except n.NVMLError:
                energy_mj = None
            out.append({"util": util.gpu / 100.0, "mem_used": mem.used, "power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                        "energy_j": None if energy_mj is None else energy_mj / 1000.0})
        return out

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


def open_nvml() -> NvmlReader | None:
    try:
        return NvmlReader()
    except Exception:  # no library, no driver or no GPU: figures become modeled
        return None


# -- the sampler --------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float
    cpu_per_core: list[float]
    proc_cpu: dict[str, float]  # role -> CPU cores used (1.0 = one core busy) since the last sample
    rss: dict[str, int]
    gpus: list[dict]
    cpu_power_w: float
    cpu_power_source: str
    gpu_power_w: float
    gpu_power_source: str


@dataclass
class HardwareSampler:
    interval_s: float = 1.0
    model: PowerModel = field(default_factory=PowerModel)
    rapl_reader: object = read_rapl_energy_uj
    nvml_factory: object = open_nvml
    rapl_range_reader: object = read_rapl_ranges_uj

    def __post_init__(self) -> None:
        # The whole run in bounded memory (a sample a second for days would not be): running sums for the summary,
        # the latest sample for the live figures, and an evenly thinned timeline for the report's plots.
        self.samples: Thinned[Sample] = Thinned(TIMELINE_CAP)
        self._sum = {"n": 0, "cpu": 0.0, "cpu_w": 0.0, "gpu_w": 0.0, "gpu_util": 0.0, "gpu_n": 0}
        self._role_cpu: dict[str, float] = {}
        self._role_rss_max: dict[str, int] = {}
        self.cores = 0
        self.t0: float | None = None
        self.pids: dict[str, list[int]] = {"learner": [os.getpid()]}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: dict[int, psutil.Process] = {}
        self._last_cpu: dict[int, float] = {}
        self.nvml = None
        self.energy = {"cpu_j": 0.0, "gpu_j": 0.0, "cpu_source": "modeled", "gpu_source": "modeled"}
        self.rapl_dropped = 0  # samples whose RAPL figure was impossible: modeled instead, and counted

    def watch(self, role: str, pid: int) -> None:
        self.pids.setdefault(role, []).append(pid)

    def start(self) -> None:
        self.nvml = self.nvml_factory()
        self._rapl_last = self.rapl_reader()
        self._rapl_wrap = self.rapl_range_reader() if self._rapl_last else {}
        self._t_last = time.perf_counter()
        psutil.cpu_percent(percpu=True)  # prime the per-core counters
        self._thread = threading.Thread(target=self._run, name="hw-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.nvml is not None:
            self.nvml.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # a sampler must never take training down
                pass

    def _proc_cpu(self, dt: float) -> tuple[dict[str, float], dict[str, int]]:
        cpu, rss = {}, {}
        for role, pids in self.pids.items():
            used, mem = 0.0, 0
            for pid in pids:
                try:
                    p = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
                    t = p.cpu_times()
                    total = t.user + t.system
                    used += (total - self._last_cpu.get(pid, total)) / dt
                    self._last_cpu[pid] = total
                    mem += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            cpu[role], rss[role] = used, mem
        return cpu, rss

    def sample(self) -> Sample:
        now = time.perf_counter()
        dt = max(now - self._t_last, 1e-6)
        self._t_last = now
        per_core = [c / 100.0 for c in psutil.cpu_percent(percpu=True)]
        proc_cpu, rss = self._proc_cpu(dt)
        # CPU power: RAPL where readable, else the model on the busy cores.
        rapl = self.rapl_reader()
        cpu_w = None
        if rapl and self._rapl_last:
            deltas = [rapl_delta_uj(rapl[k], self._rapl_last.get(k, rapl[k]), self._rapl_wrap.get(k)) for k in rapl]
            watts = None if None in deltas else sum(deltas) / 1e6 / dt
            if watts is not None and 0 <= watts <= RAPL_MAX_W_PER_PACKAGE * len(rapl):
                cpu_w, cpu_src = watts, "measured"
                self.energy["cpu_source"] = "measured"
            else:
                self.rapl_dropped += 1
        if cpu_w is None:
            cpu_w = self.model.cpu_idle_watts + self.model.cpu_watts_per_busy_core * sum(per_core)
            cpu_src = "modeled"
        self._rapl_last = rapl
        gpus = self.nvml.read() if self.nvml is not None else []
        if gpus:
            gpu_w, gpu_src = sum(g["power_w"] for g in gpus), "measured"
            self.energy["gpu_source"] = "measured"
        else:
            gpu_w, gpu_src = 0.0, "modeled"  # no GPU in this node: it draws nothing
        self.energy["cpu_j"] += cpu_w * dt
        self.energy["gpu_j"] += gpu_w * dt
        s = Sample(now, per_core, proc_cpu, rss, gpus, cpu_w, cpu_src, gpu_w, gpu_src)
        self._add(s)
        return s

    def _add(self, s: Sample) -> None:
        if self.t0 is None:
            self.t0 = s.t
        self.samples.append(s)
        a = self._sum
        a["n"] += 1
        self.cores = self.cores or len(s.cpu_per_core)
        a["cpu"] += sum(s.cpu_per_core)
        a["cpu_w"] += s.cpu_power_w
        a["gpu_w"] += s.gpu_power_w
        a["gpu_util"] += sum(g["util"] for g in s.gpus)
        a["gpu_n"] += len(s.gpus)
        for r, v in s.proc_cpu.items():
            self._role_cpu[r] = self._role_cpu.get(r, 0.0) + v
        for r, v in s.rss.items():
            self._role_rss_max[r] = max(self._role_rss_max.get(r, 0), v)

    @property
    def last(self) -> Sample | None:
        """The latest sample (None before the first)."""
        return self.samples.last

    def summary(self) -> dict:
        """Means over every sample of the run (running sums: no sample is dropped from them), the largest RSS
        of each role, energy, and the power sources of the latest sample."""
        a, last = self._sum, self.samples.last
        if not a["n"]:
            return {}
        n = a["n"]
        roles = sorted(self._role_cpu)
        out = {
            "cpu_util_mean": a["cpu"] / (n * self.cores),
            "cpu_cores": self.cores,
            "role_cpu_cores": {r: self._role_cpu[r] / n for r in roles},
            "role_rss_max": {r: self._role_rss_max.get(r, 0) for r in roles},
            "cpu_power_w": {"value": a["cpu_w"] / n, "source": last.cpu_power_source},
            "gpu_power_w": {"value": a["gpu_w"] / n, "source": last.gpu_power_source},
            "base_power_w": {"value": self.model.base_watts, "source": "modeled"},
            "energy_cpu_j": {"value": self.energy["cpu_j"], "source": self.energy["cpu_source"]},
            "energy_gpu_j": {"value": self.energy["gpu_j"], "source": self.energy["gpu_source"]},
            "rapl_samples_dropped": self.rapl_dropped,
            "samples": n,
        }
        if last.gpus and a["gpu_n"]:
            out["gpu_util_mean"] = {"value": a["gpu_util"] / a["gpu_n"], "source": "measured"}
        out["node_power_w"] = {"value": out["cpu_power_w"]["value"] + out["gpu_power_w"]["value"] +
                               self.model.base_watts,
                               "source": "measured" if (out["cpu_power_w"]["source"] == "measured" and
                                                        out["gpu_power_w"]["source"] == "measured") else "modeled"}
        return out

    def timeline(self) -> list[dict]:
        """The samples held (all of a short run; of a long one, evenly thinned to at most TIMELINE_CAP), times from
        the first sample."""
        t0 = self.t0 or 0.0
        return [{"t": s.t - t0, "cpu_per_core": s.cpu_per_core, "proc_cpu": s.proc_cpu, "rss": s.rss,
                 "cpu_power_w": s.cpu_power_w, "cpu_power_source": s.cpu_power_source,
                 "gpu_power_w": s.gpu_power_w, "gpu_power_source": s.gpu_power_source,
                 "gpu_util": [g["util"] for g in s.gpus]} for s in self.samples.items()]
