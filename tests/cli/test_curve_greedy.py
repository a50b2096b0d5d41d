"""Curve files of an R2D2 run: its near-greedy envs' returns kept apart, with their own milestones."""

import json
from pathlib import Path

from rlbalance.bench.pong_curve import write_curve


def _run(tmp_path: Path, greedy: bool) -> Path:
    run = tmp_path / ("r2d2" if greedy else "vtrace")
    run.mkdir()
    cfg = {"env": {"id": "ALE/Pong-v5"}, "run": {"preset": "atari", "seed": 3},
           "learner": {"agent": "r2d2" if greedy else "vtrace"}, "actors": {}}
    (run / "config.json").write_text(json.dumps(cfg))
    recs = []
    for i, (mixed, best) in enumerate([(-21.0, -21.0), (-16.0, -12.0), (-2.0, 18.5), (3.0, 19.0)]):
        r = {"time_s": 60.0 * (i + 1), "session": 1, "frames": 1_000_000 * (i + 1), "fps": 1000.0,
             "episode_return": mixed}
        if greedy:
            r["episode_return_greedy"] = best
        recs.append(r)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


def test_an_r2d2_curve_keeps_its_least_exploring_envs_apart(tmp_path):
    r = write_curve(_run(tmp_path, greedy=True), tmp_path / "out")
    assert r["final_return_last100"] == 3.0 and r["milestones"]["+18"] is None
    assert r["final_return_greedy_last100"] == 19.0 and r["best_return_greedy_last100"] == 19.0
    assert r["milestones_greedy"]["+18"] == {"frames": 3_000_000, "minutes": 3.0}
    assert r["milestones_greedy"]["-15"] == {"frames": 2_000_000, "minutes": 2.0}
    csv = (tmp_path / "out" / "pong-curve.csv").read_text().splitlines()
    assert csv[0].endswith(",greedy_mean_return_last100") and csv[3].endswith(",18.5")
    doc = json.loads((tmp_path / "out" / "pong-curve.json").read_text())
    assert doc["curve"][2]["return_greedy"] == 18.5


def test_a_policy_gradient_curve_has_no_greedy_part(tmp_path):
    r = write_curve(_run(tmp_path, greedy=False), tmp_path / "out")
    assert "milestones_greedy" not in r and "final_return_greedy_last100" not in r
    assert (tmp_path / "out" / "pong-curve.csv").read_text().splitlines()[0].endswith(",policy_lag")
