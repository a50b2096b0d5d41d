"""rlbalance bench atari on a tiny budget: a game trains with the Atari preset, its curve and the table against the
published anchors are written, and a rerun leaves a finished run as it is."""

import json

import pytest

from rlbalance.bench import atari
from rlbalance.cli import main


@pytest.mark.slow
def test_bench_atari_trains_writes_the_table_and_resumes_nothing_finished(tmp_path, capsys):
    args = ["bench", "atari", "--games", "Breakout", "--frames", "8000", "--seed", "3", "--out", str(tmp_path)]
    assert main(args) == 0
    out = tmp_path / "atari"
    doc = json.loads((out / "atari.json").read_text())
    (row,) = doc["games"]
    assert row["game"] == "Breakout" and row["seed"] == 3 and row["frames"] >= 8000
    assert row["best_anchor"] == {"value": 72.0, "source": "RLlib IMPALA, 32 workers"}
    assert "| Breakout | 3 |" in (out / "atari.md").read_text() and (out / "atari.png").stat().st_size > 0
    run = out / "runs" / "Breakout-seed3"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["run"]["preset"] == "atari" and cfg["env"]["sticky_actions"] == 0.0
    before = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(args) == 0  # finished: not trained again
    assert "already trained" in capsys.readouterr().out and (run / "metrics.jsonl").read_text() == before


def test_table_from_curves_marks_the_games_at_or_above_the_best_anchor(tmp_path):
    for game, final in (("Breakout", 80.0), ("Qbert", 500.0)):
        (tmp_path / game).mkdir()
        (tmp_path / game / "curve.json").write_text(json.dumps({
            "seed": 1, "frames": 10_000_000, "final_return_last100": final, "best_return_last100": final,
            "wall_minutes": 60.0, "fps_median": 2000.0, "outcome": "completed",
            "curve": [{"frames": 10_000_000, "return": final}]}))
    doc = atari.write_table(tmp_path, ("Breakout", "Qbert", "BeamRider"))
    marks = {r["game"]: r["at_or_above_best"] for r in doc["games"]}
    assert marks == {"Breakout": True, "Qbert": False}  # BeamRider has no curve yet: no row


def test_an_override_applies_on_top_of_the_preset_and_a_bad_one_stops_before_any_run(tmp_path, capsys):
    from rlbalance import config as C

    cfg = atari.game_config("Breakout", 10_000_000, 1, tmp_path, C.parse_set(["env.episodic_life=true"]))
    assert cfg.env.episodic_life is True and cfg.run.preset == "atari" and cfg.learner.epochs == 4
    assert atari.game_config("Breakout", 10_000_000, 1, tmp_path).env.episodic_life is False
    rc = main(["bench", "atari", "--games", "Breakout", "--frames", "8000", "--out", str(tmp_path / "o"),
               "--set", "env.episodic_lives=true"])
    assert rc != 0 and "episodic_lives" in capsys.readouterr().err and not (tmp_path / "o").exists()
