"""Sweeps and the CPU/GPU ratio: the paper's shape on a controlled workload, and resumability."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from rlbalance.bench.trainer import learner_ceiling
from rlbalance import config as C
from rlbalance.cli import main
from rlbalance.ratio import analyse, write_outputs
from rlbalance.sweep import expand, load_rows, parse_axes, run_sweep

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
    knee = a["throughput_optimal_R"]
    assert a["knee_verdict"] == "learner-bound"  # the knee is where the learner saturates ...
    assert all(p["verdict"] == "actor-bound" for p in curve if p["R"] < knee)  # ... and not before
    page = write_outputs(a, tmp_path / "ratio")
    text = page.read_text()
    assert f'<b id="knee">{knee:g}</b>' in text and "modeled" in text
    assert (tmp_path / "ratio" / "ratio.png").stat().st_size > 1000
    assert len((tmp_path / "ratio" / "ratio.csv").read_text().splitlines()) == 4


def test_killed_sweep_resumes_without_losing_or_repeating_points(tmp_path):
    db = tmp_path / "k.db"
    cmd = [sys.executable, "-m", "rlbalance", "sweep", "--axis", "actors.num_actors=1,2,3", "--steps", "20000",
           "--db", str(db), "--name", "k", "--run.out_dir", str(tmp_path / "runs"),
           "--telemetry.warmup_s", "0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120

    def n_rows():
        if not db.exists():
            return 0
        try:
            return sqlite3.connect(db).execute("SELECT COUNT(*) FROM points").fetchone()[0]
        except sqlite3.OperationalError:
            return 0

    while time.time() < deadline and n_rows() < 1:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole sweep, mid-way
    proc.wait()
    first = load_rows(db)
    assert 1 <= len(first) < 3
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=300)
    rows = load_rows(db)
    assert len(rows) == 3 and len({r["key"] for r in rows}) == 3
    keys = {p.key for p in expand({"run": {"out_dir": str(tmp_path / "runs")}, "telemetry": {"warmup_s": "0.5"}},
                                  parse_axes(["actors.num_actors=1,2,3"]), steps=20000)}
    assert {r["key"] for r in rows} == keys
    for r in first:  # points finished before the kill were kept, not run again
        again = next(x for x in rows if x["key"] == r["key"])
        assert again["ended"] == r["ended"] and again["run_dir"] == r["run_dir"]


def test_ratio_refuses_to_mix_sweeps(tmp_path, capsys):
    from rlbalance.sweep import open_db

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
    assert json.loads((tmp_path / "r" / "ratio.json").read_text())["throughput_optimal_R"] == 2


def test_axis_values_keep_their_types():
    """Axis values are stored as the config takes them: numbers sort as numbers (10 after 2)."""
    pts = expand({}, parse_axes(["actors.num_actors=10,2", "inference.mode=actor", "learner.learning_rate=1e-3",
                                 "telemetry.tensorboard=false", "cores=1"]))
    v = pts[0].values
    assert v == {"actors.num_actors": 10, "inference.mode": "actor", "learner.learning_rate": 0.001,
                 "telemetry.tensorboard": False, "cores": 1}
    assert sorted(p.values["actors.num_actors"] for p in pts) == [2, 10]
    assert json.loads(json.dumps(v)) == v
