"""`rlbalance eval`: whole games with a run's checkpoint, no learning."""

import json
import os
import re
from pathlib import Path

from rlbalance.cli import main
from rlbalance.runtime.evaluate import evaluate
from rlbalance.runtime.train import train


def test_eval_trained_policy_beats_random_and_is_reproducible(cfg_factory, capsys):
    # synthetic task: reward 1 when the action is the argmax of the first 4 observation entries, 200-step
    # games, so a random policy scores 50 on average
    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 0.0}, run={"mode": "serial",
                                                                                  "total_steps": 30_000}))
    assert main(["eval", s["run_dir"], "--episodes", "10", "--envs", "8", "--greedy", "--into-run"]) == 0
    assert "return" in capsys.readouterr().out
    greedy = json.load(open(os.path.join(s["run_dir"], "eval.json")))
    assert greedy["episodes"] == 16 and greedy["games_per_env"] == 2  # every env plays the same number of games
    assert greedy["lengths"] == [200] * 16 and greedy["checkpoint_steps"] == s["steps"]
    assert greedy["return_mean"] > 100, greedy  # well above random (50): it learned, and eval plays that policy
    assert greedy["torch_threads"] == 1  # the CLI's default: one thread, which never spins against a training run
    assert "greedy policy, checkpoint at" in open(os.path.join(s["run_dir"], "report.html")).read()
    sampled = evaluate(s["run_dir"], episodes=8, num_envs=4, progress=False)
    again = evaluate(s["run_dir"], episodes=8, num_envs=4, progress=False)
    assert sampled["returns"] == again["returns"]  # seeded: the same games twice
    assert 50 < sampled["return_mean"] < greedy["return_mean"], (sampled["return_mean"], greedy["return_mean"])
    few = evaluate(s["run_dir"], episodes=3, progress=False)  # fewer games than the default 8 envs: 3 games
    assert few["episodes"] == 3 and few["num_envs"] == 3 and few["games_per_env"] == 1
    # --threads: the policy plays with that many torch threads, and the process's own count comes back after
    import torch

    before = torch.get_num_threads()
    one = evaluate(s["run_dir"], episodes=2, num_envs=2, progress=False, threads=1)
    assert one["torch_threads"] == 1 and one["episodes"] == 2 and torch.get_num_threads() == before
    assert few["torch_threads"] == before


def test_eval_without_checkpoint_names_the_fix(tmp_path, capsys):
    run = tmp_path / "empty-run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"env": {"id": "CartPole-v1"}}))
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint" in err and "--checkpoint" in err
    assert main(["eval", str(tmp_path / "nowhere")]) == 2
    assert "nowhere does not exist" in capsys.readouterr().err
    assert main(["eval", str(run), "--episodes", "0"]) == 2
    assert "--episodes" in capsys.readouterr().err
    assert main(["eval", str(run), "--threads", "0"]) == 2
    assert "--threads 0: must be >= 1" in capsys.readouterr().err


def test_eval_out_of_steps_keeps_the_games_played(cfg_factory):
    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 0.0}, run={"mode": "serial",
                                                                                  "total_steps": 2_000}))
    out = os.path.join(s["run_dir"], "..", "eval-out")
    assert main(["eval", s["run_dir"], "--episodes", "8", "--envs", "4", "--max-steps", "1000", "--out", out]) == 1
    r = json.load(open(os.path.join(out, "eval.json")))
    # 200-step games, 4 envs: 1,000 env steps = 250 per env, so each env finished one game of its two
    assert not r["complete"] and r["episodes"] == 4 and r["lengths"] == [200] * 4


def test_eval_leaves_the_run_it_reads_as_it_is(cfg_factory, tmp_path, monkeypatch, capsys):
    """By default eval writes to evals/RUN_NAME-TIME/ in the current directory: not one file of the run changes
    (the README's eval of a committed results folder must not overwrite it)."""
    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 0.0},
                          run={"mode": "serial", "total_steps": 2_000, "name": "readonly"}))
    run = Path(s["run_dir"])
    before = {f: (f.stat().st_mtime_ns, f.read_bytes()) for f in run.rglob("*") if f.is_file()}
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(run), "--episodes", "2", "--envs", "2"]) == 0
    after = {f: (f.stat().st_mtime_ns, f.read_bytes()) for f in run.rglob("*") if f.is_file()}
    assert after == before
    written = list((tmp_path / "evals").glob("readonly-*/eval.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["run_dir"] == str(run)
    assert f"wrote {written[0].relative_to(tmp_path)}" in capsys.readouterr().out
    assert main(["eval", str(run), "--out", str(tmp_path / "x"), "--into-run"]) == 2  # one or the other


def test_eval_video_writes_a_playable_mp4(cfg_factory, tmp_path, capsys):
    """`rlbalance eval RUN --video` records one game with the env's own frames: an MP4 that OpenCV reads back
    with one frame per agent step (plus the first), at the env's frame rate."""
    import cv2

    from rlbalance.cli import main

    s = train(cfg_factory(run={"mode": "serial", "total_steps": 3_000, "name": "vid"},
                          telemetry={"tensorboard": False, "report": False}))
    out = tmp_path / "game.mp4"
    assert main(["eval", s["run_dir"], "--episodes", "2", "--envs", "2", "--video", str(out),
                 "--video-steps", "40", "--out", str(tmp_path / "ev")]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed
    cap = cv2.VideoCapture(str(out))
    n, fps = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), cap.get(cv2.CAP_PROP_FPS)
    ok, frame = cap.read()
    cap.release()
    assert ok and frame.shape == (400, 600, 3) and frame.std() > 0  # CartPole's own drawing, not a blank
    assert fps == 50  # CartPole's render_fps
    steps = int(re.search(r"(\d+) frames at", printed).group(1))
    assert 2 <= n == steps <= 41  # the first frame, then one per step, cut at --video-steps
    seconds = float(re.search(r"\(([0-9.]+) s\)", printed).group(1))
    assert abs(n / fps - seconds) < 0.05  # the duration the player shows is the one reported
    assert not list(tmp_path.glob("*.tmp.mp4"))
    # a bad count is refused before the video is recorded: nothing is written
    for bad in (["--threads", "0"], ["--episodes", "0"], ["--max-steps", "0"], ["--video-steps", "0"]):
        assert main(["eval", s["run_dir"], "--video", str(tmp_path / "bad.mp4"), "--out", str(tmp_path / "bad"),
                     *bad]) == 2
        assert f"{bad[0]} 0: must be >= 1" in capsys.readouterr().err, bad
        assert not (tmp_path / "bad.mp4").exists() and not (tmp_path / "bad").exists()
    # the recorded game plays with --threads too, and the process's own count comes back after
    import torch

    from rlbalance.runtime.evaluate import record_video

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        v = record_video(s["run_dir"], tmp_path / "one.mp4", max_steps=5, threads=1)
        assert v["torch_threads"] == 1 and torch.get_num_threads() == 3
        assert record_video(s["run_dir"], tmp_path / "own.mp4", max_steps=5)["torch_threads"] == 3
    finally:
        torch.set_num_threads(before)


def test_eval_video_of_the_synthetic_env_is_refused_before_anything_is_written(cfg_factory, capsys, tmp_path,
                                                                               monkeypatch):
    from rlbalance.cli import main

    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 0.0},
                          run={"mode": "serial", "total_steps": 2_000, "name": "novid"},
                          telemetry={"tensorboard": False, "report": False}))
    monkeypatch.chdir(tmp_path)
    assert main(["eval", s["run_dir"], "--video"]) == 2
    assert not (tmp_path / "evals").exists()
    assert "synthetic env has nothing to show" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(s["run_dir"], "eval.json"))
    assert not os.path.exists(os.path.join(s["run_dir"], "video.mp4"))
