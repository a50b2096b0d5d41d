"""The self-balancing controller past this machine, by simulation (``rlbalance bench balance-sim``).

The controller of ``run.balance=auto`` (``rlbalance.runtime.balance.Balancer``, unchanged) drives a simulated run on
each machine of the planner's catalog: the planner's model (``rlbalance.analysis.planner.predict``, from a committed
calibration) gives the steps per second of every layout, times measurement noise (uniform, +-``noise``, seeded),
and the windows the controller reads are made from it as a run's would be (the actors held back where the learner is
the bound, the learner waiting where the actors are). It moves the actor threads, from one actor, as on a machine
with one learner device per GPU. The table says where it settled against the throughput-optimal ratio ``rlbalance
plan`` names for that machine (the knee: the fewest actor threads within the knee tolerance of the best), the
throughput there against the best layout's, and how many windows it took.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from rlbalance.analysis.catalog import load_catalog
from rlbalance.analysis.planner import best_ratios, learner_devices, predict
from rlbalance.core.jsonio import atomic_write_json
from rlbalance.runtime.balance import Balancer
from rlbalance.telemetry.balance_model import Layout

WINDOW_S = 5.0
UPDATE_S = 0.5  # the simulated learner's updates, this far apart


class SimulatedRun:
    """``balance.Knobs`` over the planner's model of machine ``m``."""

    def __init__(self, cal: dict, m, noise: float, seed: int):
        self.cal, self.m, self.noise = cal, m, noise
        self.rng = random.Random(seed)
        self.lay = Layout(1, 1, 0.0)
        self.start_actors = 1
        self.t = 0.0
        self.steps = 0.0
        self.cpu = [0.0, 0.0]
        self._cache: dict[int, dict] = {}

    def model(self, actors: int) -> dict:
        if actors not in self._cache:
            self._cache[actors] = predict(self.cal, self.m, actor_threads=actors)
        return self._cache[actors]

    def layout(self) -> Layout:
        return self.lay

    def apply(self, to: Layout) -> None:
        self.lay = to

    def settled(self) -> bool:
        return True

    def cpu_seconds(self) -> tuple[float, float]:
        return self.cpu[0], self.cpu[1]

    def faults(self) -> int:
        return 0

    def restart_pending(self) -> bool:
        return False

    def run(self, bal: Balancer, seconds: float) -> None:
        end = self.t + seconds
        while self.t < end:
            p = self.model(self.lay.actors)
            sps = p["sps"] * (1 + self.rng.uniform(-self.noise, self.noise))
            held = max(0.0, 1 - p["sps"] / max(p["actor_sps"], 1e-9))  # actors held back by the learner
            wait = max(0.0, 1 - p["sps"] / max(p["learner_sps"], 1e-9))  # the learner waiting for the actors
            self.t += UPDATE_S
            self.steps += sps * UPDATE_S
            self.cpu[0] += self.lay.actors * (1 - held) * UPDATE_S
            self.cpu[1] += (0.0 if self.m.gpus else int(self.cal.get("torch_threads", 1))) * (1 - wait) * UPDATE_S
            bal.feed("actor", {"wall_s": UPDATE_S * self.lay.actors,
                               "seconds": {"wait_buffer": held * UPDATE_S * self.lay.actors}})
            bal.step(int(self.steps), wait * UPDATE_S)


def ga3c(sim: SimulatedRun, most: int, minutes: float, best_fps: float, period_s: float = 20.0) -> dict:
    """GA3C's method as the anchor to beat (its ThreadDynamicAdjustment): every ``period_s`` seconds move the actor
    count by +-1 at random, and move back if the throughput measured over the period fell. Returns where it ended
    and the first period at which the count it held was within 5% of the best (in windows of WINDOW_S)."""
    rng = random.Random(sim.rng.random())
    t, n, prev, reached = 0.0, 1, None, None
    while t < minutes * 60:
        fps = sim.model(n)["fps"] * (1 + sim.rng.uniform(-sim.noise, sim.noise))
        if reached is None and sim.model(n)["fps"] >= 0.95 * best_fps:
            reached = t
        if prev is not None and fps < prev[1]:
            n = prev[0]  # it fell: back
            prev = None
        else:
            step = rng.choice((-1, 1))
            prev, n = (n, fps), min(most, max(1, n + step))
        t += period_s
    return {"ga3c_actors": n, "ga3c_of_best": sim.model(n)["fps"] / best_fps,
            "ga3c_windows_to_95": None if reached is None else round(reached / WINDOW_S)}


def simulate(cal: dict, m, noise: float = 0.1, seed: int = 0, minutes: float = 20.0) -> dict:
    sim = SimulatedRun(cal, m, noise, seed)
    most = max(1, m.threads - (1 if m.gpus else int(cal.get("torch_threads", 1))))  # plan's range: the learner's kept
    bal = Balancer(sim, m.threads, WINDOW_S, max_actors=most, max_threads=1, knob_names=("actors",),
                   clock=lambda: sim.t)
    sim.run(bal, minutes * 60)
    ratios = best_ratios(cal, m)
    devices = learner_devices(cal, m)
    knee = ratios["at_knee"]
    best = max((sim.model(n) for n in range(1, most + 1)), key=lambda p: p["fps"])  # every count, not only plan's
    got = sim.model(sim.lay.actors)
    kept = [mv for mv in bal.moves if mv.get("outcome") == "kept"]
    settle_t = kept[-1]["judged_t"] if kept else 0.0
    first_95 = next((mv["judged_t"] for mv in kept if sim.model(mv["to"]["actors"])["fps"] >= 0.95 * best["fps"]),
                    0.0 if sim.model(sim.start_actors)["fps"] >= 0.95 * best["fps"] else None)
    anchor = ga3c(SimulatedRun(cal, m, noise, seed + 10_000), most, minutes, best["fps"])
    return {"machine": m.name, "threads": m.threads, "gpus": m.gpus, "devices": devices,
            "settled_actors": sim.lay.actors, "settled_fps": got["fps"], "phase": bal.phase,
            "knee_actors": knee["actor_threads"], "knee_fps": knee["fps"], "best_fps": best["fps"],
            "best_actors": best["actor_threads"], "most_actors": most,
            "of_best": got["fps"] / best["fps"], "settle_windows": round(settle_t / WINDOW_S),
            "moves": sum(1 for mv in bal.moves if mv.get("event") == "move"), "kept": len(kept),
            "windows_to_95": None if first_95 is None else round(first_95 / WINDOW_S), **anchor}


def run_balance_sim(out: Path, calibrations: list[Path], noise: float = 0.1, seeds: int = 3,
                    minutes: float = 20.0) -> dict:
    machines = load_catalog()
    rows = []
    for path in calibrations:
        cal = json.loads(path.read_text())
        for name, m in machines.items():
            for seed in range(seeds):
                r = simulate(cal, m, noise, seed, minutes)
                rows.append({"workload": path.stem.removeprefix("calibration-"), "seed": seed, **r})
                print(f"{rows[-1]['workload']} on {name} (seed {seed}): settled at {r['settled_actors']} actor threads "
                      f"({r['of_best']:.0%} of the best), plan's knee {r['knee_actors']}, "
                      f"{r['settle_windows']} windows", flush=True)
    res = {"noise": noise, "seeds": seeds, "minutes": minutes, "window_s": WINDOW_S, "rows": rows,
           "calibrations": [p.name for p in calibrations], "made": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    folder = out / "balance"
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / "simulation.json", res)
    (folder / "simulation.md").write_text(_table(res))
    return res


def _most(values) -> str:
    vals = list(values)
    return "never" if any(v is None for v in vals) else str(max(vals))


def _table(res: dict) -> str:
    lines = ["# run.balance=auto past this machine, by simulation", "",
             f"The controller against the planner's model of each catalog machine (calibrations: "
             f"{', '.join(res['calibrations'])}), throughput noise +-{res['noise']:.0%} per update, "
             f"{res['window_s']:g} s windows, {res['minutes']:g} simulated minutes from one actor, {res['seeds']} "
             "seeds; it moves the actor threads. 'of best': the settled layout's modeled FPS over the best layout's; "
             "'knee': the actor threads `rlbalance plan` names (the fewest within its knee tolerance of the best). "
             "GA3C: its method on the same model and noise, a +-1 move every 20 s (4 windows), undone if the "
             "throughput fell; 'never': a seed that did not reach 95% of the best in the simulated minutes.",
             "", "| workload | machine | threads | GPUs | settled actor threads (seeds) | plan's knee | of best (worst) "
             "| windows to settle (most) | windows to 95% of best (most) | GA3C +-1: of best (worst) | GA3C: windows to "
             "95% (most) |", "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    groups: dict[tuple, list] = {}
    for r in res["rows"]:
        groups.setdefault((r["workload"], r["machine"]), []).append(r)
    for (w, m), rs in groups.items():
        lines.append(f"| {w} | {m} | {rs[0]['threads']} | {rs[0]['gpus']} | "
                     f"{', '.join(str(r['settled_actors']) for r in rs)} | {rs[0]['knee_actors']} | "
                     f"{min(r['of_best'] for r in rs):.0%} | {max(r['settle_windows'] for r in rs)} | "
                     f"{_most(r['windows_to_95'] for r in rs)} | {min(r['ga3c_of_best'] for r in rs):.0%} | "
                     f"{_most(r['ga3c_windows_to_95'] for r in rs)} |")
    return "\n".join(lines) + "\n"
