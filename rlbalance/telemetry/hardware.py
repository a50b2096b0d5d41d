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
        self.samples: list[Sample] = []
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
        self.samples.append(s)
        return s

    def summary(self) -> dict:
        if not self.samples:
            return {}
        n = len(self.samples)
        cores = len(self.samples[0].cpu_per_core)
        roles = sorted({r for s in self.samples for r in s.proc_cpu})
        out = {
            "cpu_util_mean": sum(sum(s.cpu_per_core) for s in self.samples) / (n * cores),
            "cpu_cores": cores,
            "role_cpu_cores": {r: sum(s.proc_cpu.get(r, 0.0) for s in self.samples) / n for r in roles},
            "role_rss_max": {r: max(s.rss.get(r, 0) for s in self.samples) for r in roles},
            "cpu_power_w": {"value": sum(s.cpu_power_w for s in self.samples) / n,
                            "source": self.samples[-1].cpu_power_source},
            "gpu_power_w": {"value": sum(s.gpu_power_w for s in self.samples) / n,
                            "source": self.samples[-1].gpu_power_source},
            "base_power_w": {"value": self.model.base_watts, "source": "modeled"},
            "energy_cpu_j": {"value": self.energy["cpu_j"], "source": self.energy["cpu_source"]},
            "energy_gpu_j": {"value": self.energy["gpu_j"], "source": self.energy["gpu_source"]},
            "rapl_samples_dropped": self.rapl_dropped,
        }
        if self.samples[-1].gpus:
            out["gpu_util_mean"] = {"value": sum(g["util"] for s in self.samples for g in s.gpus) /
                                    sum(len(s.gpus) for s in self.samples), "source": "measured"}
        out["node_power_w"] = {"value": out["cpu_power_w"]["value"] + out["gpu_power_w"]["value"] +
                               self.model.base_watts,
                               "source": "measured" if (out["cpu_power_w"]["source"] == "measured" and
                                                        out["gpu_power_w"]["source"] == "measured") else "modeled"}
        return out

    def timeline(self) -> list[dict]:
        t0 = self.samples[0].t if self.samples else 0.0
        return [{"t": s.t - t0, "cpu_per_core": s.cpu_per_core, "proc_cpu": s.proc_cpu, "rss": s.rss,
                 "cpu_power_w": s.cpu_power_w, "cpu_power_source": s.cpu_power_source,
                 "gpu_power_w": s.gpu_power_w, "gpu_power_source": s.gpu_power_source,
                 "gpu_util": [g["util"] for g in s.gpus]} for s in self.samples]
