"""Design-space sweeps: a grid of config values expanded into points, each a real training run of
fixed length, one SQLite row per finished run. Resumable: a rerun skips the runs already done.

``repeats=N`` runs each point N times, in rounds (every point once, then every point again), so a drift of the
machine's speed over the sweep touches every point alike; the ratio analysis takes the median of a point's runs
and draws their spread. The ``sweeps`` table keeps each sweep's arguments and the database's schema version.

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
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlbalance import config as C

SCHEMA_VERSION = 2  # 1: points without point_key, repeat, stage_shares and no sweeps table (read and upgraded)

SCHEMA = """
CREATE TABLE IF NOT EXISTS points (
    key TEXT PRIMARY KEY,         -- one run: the point's key, with -rN for its repeat N > 0
    sweep TEXT NOT NULL,
    point TEXT NOT NULL,          -- the axis values, JSON
    config TEXT NOT NULL,         -- the whole config used, JSON
    actor_cores INTEGER NOT NULL, -- CPU hardware threads given to actors
    accelerators INTEGER NOT NULL,-- learner devices (learner.devices: GPUs, or CPU core sets)
    device TEXT NOT NULL,
    fps REAL, sps REAL, episode_return REAL, policy_lag REAL,
    cpu_util REAL, node_power_w REAL, power_source TEXT, fps_per_watt REAL,
    verdict TEXT, evidence TEXT,
    hardware TEXT, run_dir TEXT, started TEXT, ended TEXT,
    point_key TEXT,               -- the point (a hash of its whole config); its repeats share it
    repeat INTEGER,               -- 0, 1, ... N-1
    stage_shares TEXT,            -- each role's stage shares over the run (after warm-up), JSON
    learner_ranks TEXT            -- with learner.data_parallel=ddp: each learner rank's stage shares and inference batch
);
CREATE TABLE IF NOT EXISTS sweeps (
    name TEXT PRIMARY KEY,
    schema_version INTEGER NOT NULL,
    args TEXT NOT NULL,           -- JSON: axes (as given), steps, repeats, the base overrides
    created TEXT NOT NULL,
    updated TEXT NOT NULL
);
"""
_ADDED = {"point_key": "TEXT", "repeat": "INTEGER", "stage_shares": "TEXT", "learner_ranks": "TEXT"}


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


def run_key(point_key: str, repeat: int) -> str:
    """The row key of a point's run ``repeat`` (repeat 0 keeps the point's key, as in schema 1)."""
    return point_key if repeat == 0 else f"{point_key}-r{repeat}"


def open_db(path: str | Path) -> sqlite3.Connection:
    """Open (or create) a sweep database at the current schema; a schema-1 database gains the new columns, its
    rows becoming repeat 0 of their points. A database from a newer rlbalance is refused."""
    db = sqlite3.connect(str(path))
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        db.close()
        raise C.ConfigError(f"sweep database {path} has schema version {version}; this rlbalance reads up to "
                            f"{SCHEMA_VERSION}: upgrade rlbalance or use another --db")
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'points'").fetchone():
        have = {r[1] for r in db.execute("PRAGMA table_info(points)")}
        for col, kind in _ADDED.items():
            if col not in have:
                db.execute(f"ALTER TABLE points ADD COLUMN {col} {kind}")
        db.execute("UPDATE points SET point_key = key, repeat = 0 WHERE point_key IS NULL")
    db.executescript(SCHEMA)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    db.commit()
    return db


def record_sweep(db: sqlite3.Connection, name: str, args: dict) -> None:
    """Keep the sweep's arguments (the latest given under this name) and the schema version."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with db:
        db.execute("INSERT INTO sweeps (name, schema_version, args, created, updated) VALUES (?, ?, ?, ?, ?) "
                   "ON CONFLICT(name) DO UPDATE SET schema_version = excluded.schema_version, args = excluded.args, "
                   "updated = excluded.updated", (name, SCHEMA_VERSION, json.dumps(args, sort_keys=True, default=str), now, now))


def sweep_args(db_path: str | Path, name: str) -> dict | None:
    db = _open_existing(db_path)
    try:
        row = db.execute("SELECT args FROM sweeps WHERE name = ?", (name,)).fetchone()
    except sqlite3.OperationalError:  # a schema-1 database, not opened for writing since
        row = None
    db.close()
    return json.loads(row[0]) if row else None


def done_keys(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT key FROM points")}


_COLUMNS = ("key", "sweep", "point", "config", "actor_cores", "accelerators", "device", "fps", "sps",
            "episode_return", "policy_lag", "cpu_util", "node_power_w", "power_source", "fps_per_watt", "verdict",
            "evidence", "hardware", "run_dir", "started", "ended", "point_key", "repeat", "stage_shares",
            "learner_ranks")


def run_sweep(name: str, base: dict, axes: dict[str, list[str]], steps: int, db_path: str | Path,
              out_dir: str, progress: Callable[[int, int, str], None] | None = None, repeats: int = 1) -> list[dict]:
    """Run every point ``repeats`` times (in rounds), skipping runs already in the database; returns the rows of
    this sweep. ``progress(done, total, label)`` counts runs."""
    from rlbalance.runtime.rundir import hardware_stamp
    from rlbalance.runtime.train import train

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise C.ConfigError(f"--repeats {repeats!r}: runs per point must be a whole number >= 1, e.g. --repeats 3")
    points = expand(base, axes, steps)
    db = open_db(db_path)
    record_sweep(db, name, {"axes": axes, "steps": steps, "repeats": repeats, "base": base})
    stamp = json.dumps(hardware_stamp())
    finished = done_keys(db)
    todo = [(r, p) for r in range(repeats) for p in points]  # rounds: each point once, then again
    for i, (rep, p) in enumerate(todo):
        key = run_key(p.key, rep)
        label = ", ".join(f"{k}={v}" for k, v in p.values.items()) + (f" (repeat {rep + 1}/{repeats})" if repeats > 1 else "")
        if key in finished:
            if progress:
                progress(i + 1, len(todo), f"{label} (done before, skipped)")
            continue
        if progress:
            progress(i, len(todo), label)
        over = C.merge(p.overrides, {
            "run": {"out_dir": out_dir, "name": f"{name}-{key}-{int(time.time() * 1000)}"},
            "telemetry": {"progress": False, "tensorboard": False, "report": False}})
        cfg = C.build(over)
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        s = train(cfg)
        power = s.get("node_power_w") or {}
        row = (key, name, json.dumps(p.values), json.dumps(cfg.to_dict()), actor_cores(cfg),
               cfg.learner.devices, s["device"], s["fps_sustained"], s["sps_sustained"], s["episode_return_last100"],
               s.get("policy_lag_mean"), s.get("cpu_util_mean"), power.get("value"), power.get("source"),
               (s.get("fps_per_watt") or {}).get("value"), s["verdict"], s["verdict_evidence"], stamp,
               s["run_dir"], started, s["ended"], p.key, rep, json.dumps(s.get("stage_shares") or {}, allow_nan=False),
               json.dumps(s.get("learner_ranks") or {}, allow_nan=False))
        with db:  # one transaction per finished run: a kill loses at most the run in progress
            db.execute(f"INSERT OR REPLACE INTO points ({', '.join(_COLUMNS)}) VALUES ({','.join('?' * len(row))})",
                       row)
        if progress:
            progress(i + 1, len(todo), f"{label}: {s['fps_sustained']:,.0f} FPS, {s['verdict']}")
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
        r["point_key"] = r.get("point_key") or r["key"]  # a schema-1 row: one run per point
        r["repeat"] = r.get("repeat") or 0
        r["stage_shares"] = json.loads(r["stage_shares"]) if r.get("stage_shares") else {}
        r["learner_ranks"] = json.loads(r["learner_ranks"]) if r.get("learner_ranks") else {}
    return rows


def combine_repeats(rows: list[dict]) -> list[dict]:
    """One entry per sweep point from its runs' rows: the median of their FPS (and FPS per watt; the median of an
    even count is the mean of the middle two), their spread (``fps_min``, ``fps_max``, ``runs``), and the verdict
    most of them got (the median run's where they split evenly). Other fields come from the median run (the lower
    middle one for an even count); ``key`` is the point's key."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r.get("point_key") or r["key"], []).append(r)
    out = []
    for key, runs in groups.items():
        measured = [r for r in runs if r["fps"]] or runs  # a run too short to measure FPS says nothing
        ordered = sorted(measured, key=lambda r: r["fps"] or 0.0)
        mid = ordered[(len(ordered) - 1) // 2]
        fps = [r["fps"] or 0.0 for r in ordered]
        verdicts = [r["verdict"] for r in runs]
        top = max(verdicts.count(v) for v in verdicts)
        verdict = mid["verdict"] if verdicts.count(mid["verdict"]) == top else next(
            v for v in verdicts if verdicts.count(v) == top)
        per_watt = [r["fps_per_watt"] for r in runs if r.get("fps_per_watt")]
        out.append({**mid, "key": key, "fps": statistics.median(fps), "fps_min": fps[0], "fps_max": fps[-1],
                    "runs": len(runs), "fps_per_watt": statistics.median(per_watt) if per_watt else None,
                    "verdict": verdict, "verdicts": verdicts})
    return out
