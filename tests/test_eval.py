"""`rlbalance eval`: whole games with a run's checkpoint, no learning."""

import json
import os

from rlbalance.cli import main
from rlbalance.evaluate import evaluate
from rlbalance.train import train


def test_eval_trained_policy_beats_random_and_is_reproducible(cfg_factory, capsys):
    # synthetic task: reward 1 when the action is the argmax of the first 4 observation entries, 200-step
    # games, so a random policy scores 50 on average
    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 0.0}, run={"mode": "serial",
                                                                                  "total_steps": 30_000}))
    assert main(["eval", s["run_dir"], "--episodes", "10", "--envs", "8", "--greedy"]) == 0
    assert "return" in capsys.readouterr().out
    greedy = json.load(open(os.path.join(s["run_dir"], "eval.json")))
    assert greedy["episodes"] == 16 and greedy["games_per_env"] == 2  # every env plays the same number of games
    assert greedy["lengths"] == [200] * 16 and greedy["checkpoint_steps"] == s["steps"]
    assert greedy["return_mean"] > 100, greedy  # well above random (50): it learned, and eval plays that policy
    assert "greedy policy, checkpoint at" in open(os.path.join(s["run_dir"], "report.html")).read()
    sampled = evaluate(s["run_dir"], episodes=8, num_envs=4, progress=False)
    again = evaluate(s["run_dir"], episodes=8, num_envs=4, progress=False)
    assert sampled["returns"] == again["returns"]  # seeded: the same games twice
    assert 50 < sampled["return_mean"] < greedy["return_mean"], (sampled["return_mean"], greedy["return_mean"])


def test_eval_without_checkpoint_names_the_fix(tmp_path, capsys):
    run = tmp_path / "empty-run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"env": {"id": "CartPole-v1"}}))
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint" in err and "--checkpoint" in err
    assert main(["eval", str(tmp_path / "nowhere")]) == 2
    assert "config.json" in capsys.readouterr().err
    assert main(["eval", str(run), "--episodes", "0"]) == 2
    assert "--episodes" in capsys.readouterr().err


def test_eval_out_of_steps_keeps_the_games_played(cfg_factory):
    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 0.0}, run={"mode": "serial",
                                                                                  "total_steps": 2_000}))
    assert main(["eval", s["run_dir"], "--episodes", "8", "--envs", "4", "--max-steps", "1000"]) == 1
    r = json.load(open(os.path.join(s["run_dir"], "eval.json")))
    # 200-step games, 4 envs: 1,000 env steps = 250 per env, so each env finished one game of its two
    assert not r["complete"] and r["episodes"] == 4 and r["lengths"] == [200] * 4
