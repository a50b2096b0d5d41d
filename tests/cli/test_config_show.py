"""rlbalance config show: the effective config with the layer that set each value (issue 45, item 4)."""

import json

from rlbalance.cli import main


def _show(capsys, *argv) -> dict:
    assert main(["config", "show", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_pong_config_names_the_layer_of_every_value(capsys, tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text("[learner]\nentropy_cost = 0.02\n")
    t = _show(capsys, "--env.id", "ALE/Pong-v5", "--config", str(f), "--learner.batch_size", "32",
              "--actors.num_actors", "1")
    assert all(v["layer"] for sec in t.values() for v in sec.values())  # every value has its layer
    assert t["env"]["id"] == {"value": "ALE/Pong-v5", "layer": "command line"}
    assert t["learner"]["batch_size"]["layer"] == "command line"
    assert t["learner"]["entropy_cost"] == {"value": 0.02, "layer": f"config file {f}"}
    assert t["learner"]["learning_rate"] == {"value": 0.00025, "layer": "atari preset"}
    assert t["learner"]["clip_rho"]["layer"] == "default"
    assert t["actors"]["buffers_per_actor"]["layer"].startswith("fitted by rlbalance (atari preset gave 2)")
    assert t["run"]["preset"]["value"] == "atari" and t["run"]["preset"]["layer"].startswith("fitted by rlbalance")
    r2d2 = _show(capsys, "--env.id", "ALE/Pong-v5", "--learner.agent", "r2d2")
    assert r2d2["learner"]["learning_rate"]["layer"] == "atari preset: r2d2 on atari"
    assert r2d2["learner"]["core"]["layer"] == "atari preset: r2d2's own"
    bare = _show(capsys, "--env.id", "ALE/Pong-v5", "--run.preset", "none")
    assert {v["layer"] for sec in bare.values() for v in sec.values()} == {"default", "command line"}


def test_the_table_reads_in_a_pipe(capsys):
    assert main(["config", "show", "--env.id", "CartPole-v1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["field", "value", "layer"]
    assert any(line.startswith("learner.learning_rate") and line.endswith("classic preset") for line in lines)
