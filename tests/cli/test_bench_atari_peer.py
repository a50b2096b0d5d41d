"""The Atari peer (CleanRL-style PPO on EnvPool) on a tiny budget: it trains, stops on request with its state saved,
resumes where it stopped, refuses a state made for another run, and writes curve files that our table and figures
read, beside our own curve."""

import json

import numpy as np
import pytest
import torch

from rlbalance.bench import atari
from rlbalance.bench.ppo_envpool import ATARI_PEER, PEER_STATS, _NatureNet, _ppo_update, game_over, ppo_envpool_atari
from rlbalance.cli import main

TINY = {"num_envs": 2, "num_steps": 16}  # 128 frames a rollout


def test_a_game_ends_where_envpool_says_the_game_ended_not_at_each_life():
    term = np.array([True, True, False, False])
    trunc = np.array([False, False, False, True])
    info = {"terminated": np.array([0, 1, 0, 0], dtype=np.int32)}
    assert game_over(term, trunc, info).tolist() == [False, True, False, True]


def _rollout(net, t_len=8, n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (t_len, n, 4, 84, 84), dtype=torch.uint8, generator=g)
    with torch.no_grad():
        logits, v = net(obs.flatten(0, 1))
    dist = torch.distributions.Categorical(logits=logits)
    act = dist.sample()
    return (obs[-1], torch.zeros(n), obs, act.reshape(t_len, n), dist.log_prob(act).reshape(t_len, n),
            torch.randn(t_len, n, generator=g).sign(), torch.zeros(t_len, n), v.reshape(t_len, n))


def test_peer_update_measures_what_our_learner_records():
    torch.manual_seed(0)
    net = _NatureNet(6)
    s = {**ATARI_PEER, "minibatches": 2}
    rollout = _rollout(net)
    # With the rate at 0 the policy never moves off the one that acted: nothing is clipped, the KL is 0, and the
    # entropy is that of the acting policy on the rollout's observations.
    still = _ppo_update(net, torch.optim.Adam(net.parameters(), lr=0.0), s, *rollout)
    assert set(still) == set(PEER_STATS)
    assert still["clip_fraction"] == 0.0 and abs(still["approx_kl"]) < 1e-6 and still["grad_norm"] > 0
    with torch.no_grad():
        acting = torch.distributions.Categorical(logits=net(rollout[2].flatten(0, 1))[0]).entropy().mean()
    assert still["entropy"] == pytest.approx(float(acting), rel=1e-5)
    # A large rate moves the policy within the update's own steps: later steps see clipped ratios and a KL > 0.
    moved = _ppo_update(net, torch.optim.Adam(net.parameters(), lr=1e-2), s, *rollout)
    assert moved["clip_fraction"] > 0 and moved["approx_kl"] > 1e-4
    assert 0 < moved["entropy"] <= np.log(6) + 1e-6


@pytest.mark.slow
def test_peer_stops_resumes_and_refuses_another_runs_state(tmp_path):
    state = tmp_path / "runs" / "Pong-seed1" / "state.pt"
    calls = []

    def stop_after_two():
        calls.append(1)
        return len(calls) == 2

    first = ppo_envpool_atari("Pong", 640, 1, state, progress=lambda m: None, log_interval_s=0.0, settings=TINY,
                              stop=stop_after_two)
    assert first["outcome"] == "interrupted" and first["frames"] == 256 and state.is_file()
    assert [r["frames"] for r in first["curve"]] == [128, 256]
    assert all(0 < r["entropy"] <= np.log(6) and 0 <= r["clip_fraction"] <= 1 and r["approx_kl"] >= 0
               for r in first["curve"])  # Pong's 6 actions
    said = []
    second = ppo_envpool_atari("Pong", 640, 1, state, progress=said.append, log_interval_s=0.0, settings=TINY)
    assert second["outcome"] == "completed" and second["frames"] == 640
    assert any("resuming at 256" in m for m in said)
    assert [r["frames"] for r in second["curve"]] == [128, 256, 384, 512, 640]
    walls = [r["wall_s"] for r in second["curve"]]
    assert walls == sorted(walls) and walls[2] >= first["wall_s"]
    more = ppo_envpool_atari("Pong", 768, 1, state, progress=lambda m: None, log_interval_s=0.0, settings=TINY)
    assert more["frames"] == 768 and more["sessions"] == 3  # a longer budget goes on
    with pytest.raises(ValueError, match="Pong seed 1 with settings"):
        ppo_envpool_atari("Pong", 1280, 1, state, progress=lambda m: None, settings={**TINY, "num_envs": 4})
    with pytest.raises(ValueError, match="not Pong seed 2"):
        ppo_envpool_atari("Pong", 1280, 2, state, progress=lambda m: None, settings=TINY)


def test_peer_curve_files_read_by_the_table_and_drawn_against_ours(tmp_path):
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({"seed": 1, "agent": "vtrace", "milestones": {"-15": None, "+18": None},
                                "final_return_last100": -20.0,
                                "curve": [{"frames": 4096, "wall_s": 3.0, "return": -21.0},
                                          {"frames": 8192, "wall_s": 6.0, "return": -20.0}]}))
    run = {"game": "Pong", "seed": 1, "frames": 8192, "wall_s": 7.5, "outcome": "completed", "settings": TINY,
           "curve": [{"frames": 4096, "wall_s": 4.0, "return": None, "fps": 1000.0},
                     {"frames": 8192, "wall_s": 7.5, "return": -20.5, "fps": 1100.0, "entropy": 1.5,
                      "clip_fraction": 0.125, "approx_kl": 0.01, "grad_norm": 0.25}]}
    out = tmp_path / "atari-peer"
    r = atari.write_peer_curve(run, out / "Pong", against=[ours])
    assert r["final_return_last100"] == -20.5 and r["milestones"] == {"-15": None, "+18": None}
    doc = json.loads((out / "Pong" / "curve.json").read_text())  # strict JSON: the None return is null
    assert doc["curve"][0]["return"] is None and doc["fps_median"] == 1100.0
    # the update measures in the CSV; the row from before the peer recorded them leaves them empty
    assert (out / "Pong" / "curve.csv").read_text().splitlines() == [
        "frames,wall_s,mean_return_last100,fps,entropy,clip_fraction,approx_kl,grad_norm",
        "4096,4.0,,1000,,,,", "8192,7.5,-20.5,1100,1.5,0.125,0.01,0.25"]
    assert (out / "Pong" / "vs-ours.png").stat().st_size > 0 and (out / "Pong" / "curve.png").stat().st_size > 0
    ours_dir = tmp_path / "atari" / "Pong"  # our table beside the peer's folder shows the peer's result
    ours_dir.mkdir(parents=True)
    (ours_dir / "curve.json").write_text(json.dumps({
        "seed": 2, "frames": 10_000_000, "final_return_last100": 17.5, "best_return_last100": 18.1,
        "wall_minutes": 90.0, "fps_median": 1800.0, "outcome": "completed",
        "curve": [{"frames": 10_000_000, "return": 17.5}]}))
    (row,) = atari.write_table(tmp_path / "atari", ("Pong",))["games"]
    assert row["final_return_last100"] == 17.5 and row["peer"]["final_return_last100"] == -20.5
    assert "-20.5 at 0.01M frames, 0 min, 1,100 FPS (completed)" in (tmp_path / "atari" / "atari.md").read_text()


def test_cli_names_a_missing_curve_to_draw_against_before_training(tmp_path, capsys):
    rc = main(["bench", "atari-peer", "--games", "Pong", "--frames", "1000", "--out", str(tmp_path),
               "--against", str(tmp_path / "nope.json")])
    assert rc != 0 and "--against" in capsys.readouterr().err
    assert not (tmp_path / "atari-peer").exists()


@pytest.mark.slow
def test_peer_stops_at_until_once_a_full_window_of_games_reaches_it(tmp_path):
    # Every Pong game lost 21-0 in 2 envs takes > 700 steps: 100 games do not fit this budget, so 'until' below any
    # score never fires on a partial window, and with the window forced full it fires at once and stays fired.
    state = tmp_path / "state.pt"
    r = ppo_envpool_atari("Pong", 256, 1, state, progress=lambda m: None, settings=TINY, until=-21.0)
    assert r["outcome"] == "completed" and r["frames"] == 256
    import torch

    saved = torch.load(state, weights_only=False)
    saved["run"]["returns"] = [-21.0] * 100
    torch.save(saved, state)
    r = ppo_envpool_atari("Pong", 1280, 1, state, progress=lambda m: None, settings=TINY, until=-21.0)
    assert r["outcome"] == "reached" and r["frames"] == 384 and r["curve"][-1]["frames"] == 384
    again = ppo_envpool_atari("Pong", 1280, 1, state, progress=lambda m: None, settings=TINY, until=-21.0)
    assert again["outcome"] == "reached" and again["frames"] == 384
    higher = ppo_envpool_atari("Pong", 512, 1, state, progress=lambda m: None, settings=TINY, until=0.0)
    assert higher["outcome"] == "completed" and higher["frames"] == 512  # a higher bar: it trains on


def test_gae_of_the_peers_cuts_at_a_new_episode_and_bootstraps_at_the_rollouts_end():
    import torch

    from rlbalance.bench.ppo_envpool import _gae

    rew, val = torch.tensor([[1.0], [1.0]]), torch.tensor([[0.5], [0.5]])
    next_v, next_done = torch.tensor([0.5]), torch.tensor([0.0])
    cut = torch.tensor([[0.0], [1.0]])  # the observation at step 1 starts a new episode
    adv, ret = _gae(rew, cut, val, next_v, next_done, 0.9, 0.8)
    assert torch.allclose(adv[:, 0], torch.tensor([0.5, 0.95])) and torch.allclose(ret[:, 0], torch.tensor([1.0, 1.45]))
    adv, _ = _gae(rew, torch.zeros(2, 1), val, next_v, next_done, 0.9, 0.8)
    assert torch.allclose(adv[:, 0], torch.tensor([0.95 + 0.72 * 0.95, 0.95]))
