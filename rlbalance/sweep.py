"""Design-space sweeps: a grid of config values expanded into points, each a real training run of
fixed length, one SQLite row per finished point. Resumable: a rerun skips the points already done.

Axes are config fields (``actors.num_actors=1,2,4``) plus one shorthand, ``cores=1,2``: pin the
actors to that many CPU cores (CPU affinity), so a large machine can emulate smaller CPU/GPU ratios.
A point's accelerators are its ``learner.devices`` (an axis like any other field).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import config as C

SCHEMA = """
CREATE TABLE IF NOT EXISTS points (
    key TEXT PRIMARY KEY,
    sweep TEXT NOT NULL,
    point TEXT NOT NULL,          -- the axis values, JSON
    config TEXT NOT NULL,         -- the whole config used, JSON
    actor_cores INTEGER NOT NULL, -- CPU hardware threads given to actors
    accelerators INTEGER NOT NULL,-- learner devices (learner.devices: GPUs, or CPU core sets)
    device TEXT NOT NULL,
    fps REAL, sps REAL, episode_return REAL, policy_lag REAL,
    cpu_util REAL, node_power_w REAL, power_source TEXT, fps_per_watt REAL,
    verdict TEXT, evidence TEXT,
    hardware TEXT, run_dir TEXT, started TEXT, ended TEXT
)
"""


@dataclass(frozen=True)
class Point:
    values: dict  # axis -> value
    overrides: dict  # nested config overrides
    key: str


def parse_axes(items: list[str]) -> dict[str, list[str]]:
    axes = {}
    for item in items:
        name, sep, vals = item.partition("=")
        if not sep or not vals:
            raise C.ConfigError(f"--axis {item!r}: expected NAME=V1,V2,... e.g. actors.num_actors=1,2,4 or cores=1,2")
        if name != "cores" and "." not in name:
            raise C.ConfigError(f"--axis {item!r}: NAME is a config field (section.field) or 'cores'")
        axes[name] = [v for v in vals.split(",") if v]
    return axes


def _usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def expand(base: dict, axes: dict[str, list[str]], steps: int | None = None) -> list[Point]:
    """Every combination of axis values, each checked as a full config before anything runs.
    A point's key hashes its whole config (steps included), so a rerun recognises finished points."""
    names = list(axes)
    points = []
    cpus = _usable_cpus()
    for combo in itertools.product(*(axes[n] for n in names)):
        values = dict(zip(names, combo))
        over: dict = {}
        for name, v in values.items():
            if name == "cores":
                n = int(v)
                if not 1 <= n <= len(cpus):
                    raise C.ConfigError(f"--axis cores={v}: this machine has {len(cpus)} usable CPUs")
                over.setdefault("actors", {})["cpu_affinity"] = cpus[:n]
            else:
                sec, field = name.split(".", 1)
                over.setdefault(sec, {})[field] = v
        merged = C.merge(base, over, {"run": {"total_steps": steps}} if steps else {})
        cfg = C.build(merged)  # fails here, naming the field, before any point runs
        key = hashlib.sha1(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:12]
        points.append(Point(_typed(values, cfg), merged, key))
    return points


def _typed(values: dict[str, str], cfg: C.Config) -> dict:
    """The axis values as the config took them (4 is a number, so 10 sorts after 2; lists stay lists)."""
    out = {}
    for name, v in values.items():
        if name == "cores":
            out[name] = int(v)
        else:
            sec, field = name.split(".", 1)
            typed = getattr(getattr(cfg, sec), field)
            out[name] = list(typed) if isinstance(typed, tuple) else typed
    return out


def actor_cores(cfg: C.Config) -> int:
    """CPU hardware threads given to actors: the pinned set, else one per actor process (at most all).
    With the synthetic env in 'sleep' mode each actor emulates one core whose work runs elsewhere; Ray
    actors count the CPUs they reserve (ray.cpus_per_actor each)."""
    if cfg.env.id == "synthetic" and cfg.env.synthetic_cost == "sleep":
        return cfg.actors.num_actors
    if cfg.ray.enabled:  # Ray actors reserve their CPUs on the cluster's nodes
        return max(1, round(cfg.actors.num_actors * cfg.ray.cpus_per_actor))
    if cfg.actors.cpu_affinity:
        return len(set(cfg.actors.cpu_affinity))
    return min(cfg.actors.num_actors, len(_usable_cpus()))


def open_db(path: str | Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path))
    db.execute(SCHEMA)
    db.commit()
    return db


def done_keys(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT key FROM points")}


def run_sweep(name: str, base: dict, axes: dict[str, list[str]], steps: int, db_path: str | Path,
              out_dir: str, progress: Callable[[int, int, str], None] | None = None) -> list[dict]:
    """Run every point not yet in the database; returns the rows of this sweep."""
    from .rundir import hardware_stamp
    from .train import train

    points = expand(base, axes, steps)
    db = open_db(db_path)
    stamp = json.dumps(hardware_stamp())
    finished = done_keys(db)
    for i, p in enumerate(points):
        label = ", ".join(f"{k}={v}" for k, v in p.values.items())
        if p.key in finished:
            if progress:
                progress(i + 1, len(points), f"{label} (done before, skipped)")
            continue
        if progress:
            progress(i, len(points), label)
        over = C.merge(p.overrides, {
            "run": {"out_dir": out_dir, "name": f"{name}-{p.key}-{int(time.time() * 1000)}"},
            "telemetry": {"progress": False, "tensorboard": False, "report": False}})
        cfg = C.build(over)
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        s = train(cfg)
        power = s.get("node_power_w") or {}
        row = (p.key, name, json.dumps(p.values), json.dumps(cfg.to_dict()), actor_cores(cfg),
               cfg.learner.devices, s["device"], s["fps_sustained"], s["sps_sustained"], s["episode_return_last100"],
               s.get("policy_lag_mean"), s.get("cpu_util_mean"), power.get("value"), power.get("source"),
               (s.get("fps_per_watt") or {}).get("value"), s["verdict"], s["verdict_evidence"], stamp,
               s["run_dir"], started, s["ended"])
        with db:  # one transaction per finished point: a kill loses at most the point in progress
            db.execute(f"INSERT OR REPLACE INTO points VALUES ({','.join('?' * len(row))})", row)
        if progress:
            progress(i + 1, len(points), f"{label}: {s['fps_sustained']:,.0f} FPS, {s['verdict']}")
    rows = load_rows(db_path, name)
    db.close()
    return rows


def _open_existing(db_path: str | Path) -> sqlite3.Connection:
    if not Path(db_path).is_file():
        raise C.ConfigError(f"sweep database {db_path} not found; run `rlbalance sweep --db {db_path} ...` first")
    return sqlite3.connect(str(db_path))


def sweep_names(db_path: str | Path) -> list[str]:
    db = _open_existing(db_path)
    names = [r[0] for r in db.execute("SELECT DISTINCT sweep FROM points ORDER BY sweep")]
    db.close()
    return names


def load_rows(db_path: str | Path, sweep: str | None = None) -> list[dict]:
    db = _open_existing(db_path)
    db.row_factory = sqlite3.Row
    q = "SELECT * FROM points" + (" WHERE sweep = ?" if sweep else "") + " ORDER BY started"
    rows = [dict(r) for r in db.execute(q, (sweep,) if sweep else ())]
    db.close()
    for r in rows:
        r["point"] = json.loads(r["point"])
    return rows
