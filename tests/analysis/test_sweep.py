"""Sweeps and the CPU/GPU ratio: the paper's shape on a controlled workload, and resumability."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from rlbalance import config as C
from rlbalance.analysis.ratio import analyse, ratio_figure, write_outputs
from rlbalance.analysis.sweep import expand, load_rows, parse_axes, run_sweep
from rlbalance.bench.trainer import learner_ceiling
from rlbalance.cli import main

# Envs whose work runs elsewhere (sleep mode: each actor emulates one core) and a learner heavy enough
# to saturate after a few actors (the env's cost per step is set from the learner's speed below): the sweep must show FPS rising, then flat, with the verdict flipping.
BASE = {"env": {"id": "synthetic", "synthetic_cost": "sleep", "synthetic_step_us": 1000.0,
                "synthetic_obs_shape": [16]},
        "learner": {"hidden_sizes": [1024, 1024], "batch_size": 32},
        "telemetry": {"warmup_s": 3.0, "hardware_interval_s": 0.5}}


def test_dry_run_lists_points(tmp_path, capsys):
    rc = main(["sweep", "--axis", "actors.num_actors=1,2", "--axis", "actors.envs_per_actor=8,16", "--dry-run",
               "--db", str(tmp_path / "s.db")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "4 points" in out and out.count("[todo]") == 4


def test_bad_axis_named_before_anything_runs(tmp_path, capsys):
    assert main(["sweep", "--axis", "learner.batch_size=30", "--db", str(tmp_path / "s.db")]) == 2
    assert "learner.batch_size" in capsys.readouterr().err
    assert not (tmp_path / "s.db").exists()


@pytest.mark.slow
def test_sweep_shape_knee_where_verdict_flips(tmp_path):
    # Each actor is given a fifth of this machine's learner ceiling (measured first, so a slower machine gets
    # slower envs and the same shape): 1 and 2 actors are actor-bound, 8 are learner-bound.
    ceiling = learner_ceiling(C.build(BASE), seconds=3.0)["sps"]
    env = {"env": {"synthetic_step_us": round(5e6 / ceiling, 1)}}
    axes = parse_axes(["actors.num_actors=1,2,8"])
    rows = run_sweep("shape", C.merge(BASE, env, {"run": {"max_seconds": 10.0}}), axes, steps=10**9,
                     db_path=tmp_path / "s.db", out_dir=str(tmp_path / "runs"))
    a = analyse(rows)
    curve = a["curve"]
    assert [p["R"] for p in curve] == [1, 2, 8]
    fps = [p["fps_per_accelerator"] for p in curve]
    verdicts = [p["verdict"] for p in curve]
    assert fps[1] > 1.4 * fps[0], curve  # more actor cores, more FPS while actors are the limit
    assert verdicts[0] == "actor-bound" and verdicts[-1] == "learner-bound", curve
    # The knee is where the learner saturates, and not before. Where the last point is still more than 5% above
    # the one before (noise on a loaded machine), it is at the edge: not reported, with the warning.
    knee = a["best_R_swept"]
    assert next(p["verdict"] for p in curve if p["R"] == knee) == "learner-bound", curve
    assert all(p["verdict"] == "actor-bound" for p in curve if p["R"] < knee)
    page = write_outputs(a, tmp_path / "ratio")
    text = page.read_text()
    if a["knee_bracketed"]:
        assert a["throughput_optimal_R"] == knee and a["knee_verdict"] == "learner-bound"
        assert f'<b id="knee">{knee:g}</b>' in text
    else:
        assert knee == 8 and a["throughput_optimal_R"] is None and "extend the sweep to R &gt; 8" in text
    assert "modeled" in text
    assert (tmp_path / "ratio" / "ratio.png").stat().st_size > 1000
    assert len((tmp_path / "ratio" / "ratio.csv").read_text().splitlines()) == 4


def test_ratio_refuses_to_mix_sweeps(tmp_path, capsys):
    from rlbalance.analysis.sweep import open_db

    db_path = tmp_path / "two.db"
    db = open_db(db_path)
    for sweep, actors, fps in (("cartpole", 1, 100.0), ("cartpole", 2, 180.0), ("pong", 1, 9.0)):
        cfg = json.dumps({"actors": {"num_actors": actors}})
        db.execute("INSERT INTO points (key, sweep, point, config, actor_cores, accelerators, device, fps, verdict, "
                   "started) VALUES (?, ?, ?, ?, ?, 1, 'cpu', ?, 'actor-bound', ?)",
                   (f"{sweep}{actors}", sweep, json.dumps({"actors.num_actors": actors}), cfg, actors, fps,
                    f"2026-12-03T10:0{actors}"))
    db.commit()
    db.close()
    assert main(["ratio", "--db", str(db_path), "--out", str(tmp_path / "r")]) == 2
    assert "--name" in capsys.readouterr().err and not (tmp_path / "r").exists()  # nothing written
    assert main(["ratio", "--db", str(db_path), "--name", "chess", "--out", str(tmp_path / "r")]) == 2
    assert "cartpole, pong" in capsys.readouterr().err
    assert main(["ratio", "--db", str(db_path), "--name", "cartpole", "--out", str(tmp_path / "r")]) == 0
    doc = json.loads((tmp_path / "r" / "ratio.json").read_text())
    assert doc["best_R_swept"] == 2 and doc["throughput_optimal_R"] is None  # still rising at the edge: no knee


def test_axis_values_keep_their_types():
    """Axis values are stored as the config takes them: numbers sort as numbers (10 after 2)."""
    pts = expand({}, parse_axes(["actors.num_actors=10,2", "inference.mode=actor", "learner.learning_rate=1e-3",
                                 "telemetry.tensorboard=false", "cores=1"]))
    v = pts[0].values
    assert v == {"actors.num_actors": 10, "inference.mode": "actor", "learner.learning_rate": 0.001,
                 "telemetry.tensorboard": False, "cores": 1}
    assert sorted(p.values["actors.num_actors"] for p in pts) == [2, 10]
    assert json.loads(json.dumps(v)) == v


def _row(key, actors, fps, verdict="actor-bound", repeat=0, point_key=None, watts=None):
    """A finished run's row as load_rows gives it (no training: the analysis alone is under test)."""
    return {"key": key, "point_key": point_key or key, "repeat": repeat, "sweep": "t",
            "point": {"actors.num_actors": actors}, "config": json.dumps({"actors": {"num_actors": actors}}),
            "actor_cores": actors, "accelerators": 1, "device": "cpu", "fps": fps, "sps": fps, "verdict": verdict,
            "node_power_w": watts, "power_source": "modeled" if watts else None,
            "fps_per_watt": fps / watts if watts else None, "policy_lag": 1.0, "episode_return": 0.0,
            "stage_shares": {"actor": {"env_step": 0.8}}}


def test_knee_reported_only_where_the_sweep_brackets_it(tmp_path):
    rising = analyse([_row("a", 1, 100), _row("b", 2, 190), _row("c", 4, 280, "learner-bound")])
    assert rising["throughput_optimal_R"] is None and not rising["knee_bracketed"]
    assert rising["best_R_swept"] == 4 and rising["knee_verdict"] is None
    assert any("extend the sweep to R > 4" in w for w in rising["warnings"]), rising["warnings"]
    page = write_outputs(rising, tmp_path / "rising").read_text()
    assert "not bracketed" in page and "extend the sweep to R &gt; 4" in page and 'class="warning"' in page
    doc = json.loads((tmp_path / "rising" / "ratio.json").read_text(), parse_constant=lambda c: 1 / 0)
    assert doc["throughput_optimal_R"] is None and doc["warnings"] == rising["warnings"]

    flat = analyse([_row("a", 1, 100), _row("b", 2, 190, "learner-bound"), _row("c", 4, 195, "learner-bound")])
    assert flat["throughput_optimal_R"] == 2 and flat["knee_bracketed"] and flat["knee_verdict"] == "learner-bound"
    assert flat["warnings"] == []
    assert '<b id="knee">2</b>' in write_outputs(flat, tmp_path / "flat").read_text()

    low = analyse([_row("a", 2, 200, "learner-bound"), _row("b", 3, 201, "learner-bound"), _row("c", 4, 199)])
    assert low["throughput_optimal_R"] is None and any("R < 2" in w for w in low["warnings"])
    one = analyse([_row("a", 2, 200)])
    assert one["throughput_optimal_R"] is None and "only one R" in one["warnings"][0]

    eff = analyse([_row("a", 1, 100, watts=50), _row("b", 2, 190, watts=60), _row("c", 3, 195, watts=80)])
    assert eff["throughput_optimal_R"] == 2 and eff["efficiency_optimal_R"] == 2 and eff["warnings"] == []
    eff_edge = analyse([_row("a", 1, 100, watts=50), _row("b", 2, 190, watts=60), _row("c", 3, 280, watts=62)])
    assert any("FPS per watt is at an edge" in w and "R > 3" in w for w in eff_edge["warnings"])


def test_repeats_count_by_their_median_and_the_plots_draw_the_spread(tmp_path):
    rows = [_row("p1", 1, fps, v, rep, "p1") for rep, (fps, v) in
            enumerate([(130, "actor-bound"), (90, "learner-bound"), (100, "actor-bound")])]
    rows += [_row("p2", 2, fps, "learner-bound", rep, "p2") for rep, fps in enumerate([150, 170, 160])]
    rows += [_row("p3", 3, fps, "learner-bound", rep, "p3") for rep, fps in enumerate([171, 160, 165])]
    a = analyse(rows)
    first = a["curve"][0]
    assert (first["fps_per_accelerator"], first["fps_per_accelerator_min"], first["fps_per_accelerator_max"],
            first["runs"], first["verdict"]) == (100, 90, 130, 3, "actor-bound")
    assert [p["fps_per_accelerator"] for p in a["curve"]] == [100, 160, 165] and a["repeats"] == 3
    assert a["throughput_optimal_R"] == 2  # 160 is within 5% of the best median (165), 100 is not
    fig = ratio_figure(a)
    from matplotlib.container import ErrorbarContainer

    bars = [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 1
    fig.canvas.draw()
    assert all(float(t).is_integer() for t in fig.axes[0].get_xticks())  # whole-number R: whole-number ticks
    assert "learner core set" in fig.axes[0].get_xlabel() and "3 runs per point" in fig.axes[0].get_title()
    write_outputs(a, tmp_path / "r")
    lines = (tmp_path / "r" / "ratio.csv").read_text().splitlines()
    assert len(lines) == 4 and "fps_min" in lines[0] and "stage_shares" in lines[0]
    assert "90 to 130 (3 runs)" in (tmp_path / "r" / "ratio.html").read_text()


def test_schema1_database_is_upgraded_and_a_newer_one_refused(tmp_path):
    import pytest

    from rlbalance.analysis.sweep import SCHEMA_VERSION, open_db, sweep_args

    path = tmp_path / "old.db"
    old = sqlite3.connect(path)  # the schema-1 table, as sweeps before repeats wrote it
    old.execute("CREATE TABLE points (key TEXT PRIMARY KEY, sweep TEXT NOT NULL, point TEXT NOT NULL, config TEXT "
                "NOT NULL, actor_cores INTEGER NOT NULL, accelerators INTEGER NOT NULL, device TEXT NOT NULL, "
                "fps REAL, sps REAL, episode_return REAL, policy_lag REAL, cpu_util REAL, node_power_w REAL, "
                "power_source TEXT, fps_per_watt REAL, verdict TEXT, evidence TEXT, hardware TEXT, run_dir TEXT, "
                "started TEXT, ended TEXT)")
    old.execute("INSERT INTO points (key, sweep, point, config, actor_cores, accelerators, device, fps, verdict, "
                "started) VALUES ('k1', 's', '{\"actors.num_actors\": 1}', '{}', 1, 1, 'cpu', 10.0, "
                "'actor-bound', 'x')")
    old.commit()
    old.close()
    assert load_rows(path)[0]["point_key"] == "k1" and sweep_args(path, "s") is None  # read as it is
    open_db(path).close()
    row = load_rows(path)[0]
    assert (row["point_key"], row["repeat"], row["stage_shares"]) == ("k1", 0, {})
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(C.ConfigError, match="schema version"):
        open_db(path)


@pytest.mark.slow
def test_sweep_with_repeats_stores_the_spread_and_resumes_after_a_kill(tmp_path):
    """rlbalance sweep --repeats 3: killed mid-way and run again, every point ends with exactly 3 runs (none lost,
    none repeated), the sweeps table holds the arguments, and the ratio page draws the spread."""
    db = tmp_path / "r.db"
    cmd = [sys.executable, "-m", "rlbalance", "sweep", "--axis", "actors.num_actors=1,2", "--repeats", "3",
           "--steps", "6000", "--db", str(db), "--name", "rep", "--run.out_dir", str(tmp_path / "runs"),
           "--env.id", "synthetic", "--env.synthetic_step_us", "20", "--telemetry.warmup_s", "0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 180

    def n_rows():
        try:
            return sqlite3.connect(db).execute("SELECT COUNT(*) FROM points").fetchone()[0] if db.exists() else 0
        except sqlite3.OperationalError:
            return 0

    while time.time() < deadline and n_rows() < 2 and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {r["key"]: r["ended"] for r in load_rows(db)}
    assert 2 <= len(before) < 6
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=600)
    rows = load_rows(db)
    assert len(rows) == 6 and len({r["key"] for r in rows}) == 6
    assert sorted((r["point"]["actors.num_actors"], r["repeat"]) for r in rows) == [(n, i) for n in (1, 2)
                                                                                    for i in range(3)]
    assert all(r["ended"] == before[r["key"]] for r in rows if r["key"] in before)  # finished runs kept
    assert all(set(r["stage_shares"]) >= {"actor", "learner"} for r in rows)
    from rlbalance.analysis.sweep import sweep_args

    args = sweep_args(db, "rep")
    assert args["repeats"] == 3 and args["steps"] == 6000 and args["axes"] == {"actors.num_actors": ["1", "2"]}
    assert main(["ratio", "--db", str(db), "--out", str(tmp_path / "ratio")]) == 0
    doc = json.loads((tmp_path / "ratio" / "ratio.json").read_text())
    assert doc["repeats"] == 3 and all(p["runs"] == 3 for p in doc["curve"])
    assert all(p["fps_per_accelerator_min"] <= p["fps_per_accelerator"] <= p["fps_per_accelerator_max"]
               for p in doc["curve"])
