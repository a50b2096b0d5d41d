"""rlbalance bench atari on a tiny budget: a game trains with the Atari preset, its curve and the table against the
published anchors are written, and a rerun leaves a finished run as it is."""

import json

from pathlib import Path
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
    assert "| **Breakout** | Atari preset | 3 |" in (out / "atari.md").read_text() and (out / "atari.png").stat().st_size > 0
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
    assert all(r["setting"] == "preset" for r in doc["games"])


def test_the_headline_row_is_the_preset_and_a_tuned_run_sits_beside_it_labelled(tmp_path):
    """Issue 45 item 5: each game's headline row is the Atari preset's run; a run tuned apart (OUT/GAME-tuned, made with
    the example config TUNED names) is a second row, marked tuned and naming the file, never in the headline's place."""
    for folder, final in (("SpaceInvaders", 393.5), ("SpaceInvaders-tuned", 604.1), ("Qbert", 4664.8)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "curve.json").write_text(json.dumps({
            "seed": 1, "frames": 10_000_000, "final_return_last100": final, "best_return_last100": final,
            "wall_minutes": 60.0, "fps_median": 2000.0, "outcome": "completed",
            "curve": [{"frames": 10_000_000, "return": final}]}))
    rows = atari.write_table(tmp_path, ("SpaceInvaders", "Qbert"))["games"]
    assert [(r["game"], r["setting"], r["final_return_last100"]) for r in rows] == [
        ("SpaceInvaders", "preset", 393.5), ("SpaceInvaders", "tuned: examples/spaceinvaders-tuned.toml", 604.1),
        ("Qbert", "preset", 4664.8)]
    assert [r["at_or_above_best"] for r in rows] == [False, True, True]  # (best SpaceInvaders anchor: ~550)
    md = (tmp_path / "atari.md").read_text().splitlines()
    si = [line for line in md if line.startswith("| **SpaceInvaders**") or line.startswith("| SpaceInvaders, *tuned*")]
    assert len(si) == 2 and "Atari preset | 1 | 10.00M | 393.5" in si[0]
    assert "`examples/spaceinvaders-tuned.toml`" in si[1] and "604.1" in si[1]
    assert (tmp_path / "atari.png").is_file()
    assert Path(atari.TUNED["SpaceInvaders"]).name in {p.name for p in (Path(__file__).parents[2] / "examples").iterdir()}


def test_an_override_applies_on_top_of_the_preset_and_a_bad_one_stops_before_any_run(tmp_path, capsys):
    from rlbalance import config as C

    cfg = atari.game_config("Breakout", 10_000_000, 1, tmp_path, C.parse_set(["env.episodic_life=true"]))
    assert cfg.env.episodic_life is True and cfg.run.preset == "atari" and cfg.learner.epochs == 4
    assert atari.game_config("Breakout", 10_000_000, 1, tmp_path).env.episodic_life is False
    rc = main(["bench", "atari", "--games", "Breakout", "--frames", "8000", "--out", str(tmp_path / "o"),
               "--set", "env.episodic_lives=true"])
    assert rc != 0 and "episodic_lives" in capsys.readouterr().err and not (tmp_path / "o").exists()
    # an override is checked against the Atari preset it will run on (16 envs per actor), not the plain defaults
    rc = main(["bench", "atari", "--games", "Breakout", "--frames", "8000", "--out", str(tmp_path / "o"),
               "--set", "learner.batch_size=52"])
    err = capsys.readouterr().err
    assert rc != 0 and "learner.batch_size" in err and "envs_per_actor=16" in err and not (tmp_path / "o").exists()


def _curve(folder, game, seed, points, override=None):
    """A game's curve files as bench atari writes them, and (``override``) its run's config as --set made it."""
    (folder / game).mkdir(parents=True)
    (folder / game / "curve.json").write_text(json.dumps({
        "seed": seed, "frames": points[-1][0], "final_return_last100": points[-1][1], "best_return_last100": None,
        "wall_minutes": 1.0, "fps_median": 1000.0 + seed, "outcome": "completed", "milestones": {},
        "curve": [{"frames": f, "return": r, "wall_s": f / 1000} for f, r in points]}))
    if override is not None:
        from rlbalance import config as C

        cfg = atari.game_config(game, 10_000_000, seed, folder / "runs", C.parse_set(override))
        run = folder / "runs" / f"{game}-seed{seed}"
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps(cfg.to_dict()))


def test_an_experiment_is_compared_with_the_presets_run_at_the_frames_it_reached(tmp_path, capsys):
    base, exp = tmp_path / "results" / "atari", tmp_path / "exp" / "atari"
    _curve(base, "BeamRider", 1, [(1e6, None), (2e6, 500.0), (3e6, 550.0), (10e6, 600.0)], override=[])
    _curve(exp, "BeamRider", 1, [(1e6, 300.0), (2.5e6, 700.0)],
           override=["env.episodic_life=true", "r2d2.initial_priority=max"])
    doc = atari.compare_with(exp, base, ("Pong", "BeamRider"))
    (row,) = doc["games"]  # Pong has no curve in either: no row
    assert row["frames"] == 2.5e6 and row["return"] == 700.0
    assert row["against_return"] == 500.0  # its last point at or before 2.5M frames, not its final 600
    assert row["overrides"] == {"env.episodic_life": True, "r2d2.initial_priority": "max"}
    assert row["against_overrides"] == {}
    text = (exp / "compare.md").read_text()
    assert ("| BeamRider | 2.50M | env.episodic_life=True, r2d2.initial_priority=max | 700.0 | the preset | 500.0 |"
            in text)
    assert (exp / "BeamRider" / "vs-against.png").stat().st_size > 0
    assert json.loads((exp / "compare.json").read_text())["games"] == doc["games"]
    # a folder with no curve of the asked games is refused before any run
    rc = main(["bench", "atari", "--games", "Qbert", "--frames", "8000", "--out", str(tmp_path / "o"),
               "--against", str(base)])
    assert rc != 0 and "--against" in capsys.readouterr().err and not (tmp_path / "o").exists()
