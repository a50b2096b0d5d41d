"""Config: precedence (defaults < file < command line), validation naming the field, round trip."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbalance import config as C
from rlbalance.cli import main


def test_defaults_are_valid_and_documented():
    cfg = C.build()
    assert cfg.env.id == "CartPole-v1"
    for sec, name, _default, doc in C.field_docs():
        assert doc, f"{sec}.{name} has no documentation"


def test_precedence_defaults_file_cli(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[learner]\nbatch_size = 32\nlearning_rate = 0.01\n[env]\nid = "Acrobot-v1"\n')
    cfg = C.load(str(f), {"learner": {"learning_rate": "0.003"}})
    assert cfg.learner.batch_size == 32          # from the file
    assert cfg.learner.learning_rate == 0.003    # the command line beats the file
    assert cfg.env.id == "Acrobot-v1"
    assert cfg.learner.discount == 0.99          # default untouched


def test_yaml_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("actors:\n  num_actors: 3\n  cpu_affinity: [0, 1]\n")
    cfg = C.load(str(f))
    assert cfg.actors.num_actors == 3 and cfg.actors.cpu_affinity == (0, 1)


@pytest.mark.parametrize("over, field", [
    ({"learner": {"batch_size": 30}}, "learner.batch_size"),
    ({"learner": {"discount": 1.5}}, "learner.discount"),
    ({"inference": {"mode": "remote"}}, "inference.mode"),
    ({"actors": {"num_actors": 0}}, "actors.num_actors"),
    ({"learner": {"unroll_length": "abc"}}, "learner.unroll_length"),
    ({"learner": {"nonsense": 1}}, "learner.nonsense"),
])
def test_bad_values_name_the_field(over, field):
    with pytest.raises(C.ConfigError, match=field.replace(".", r"\.")):
        C.build(over)


def test_unknown_section_is_named():
    with pytest.raises(C.ConfigError, match="lerner"):
        C.build({"lerner": {"batch_size": 32}})


def test_round_trip_through_json():
    cfg = C.build({"env": {"synthetic_obs_shape": [4, 84, 84]}, "actors": {"cpu_affinity": "0,1"}})
    again = C.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


def test_cli_reports_bad_value_before_anything_runs(tmp_path, capsys):
    rc = main(["train", "--learner.batch_size", "33", "--run.preset", "none", "--run.out_dir", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "learner.batch_size" in err and "multiple of actors.envs_per_actor" in err
    # with the classic preset's 4 minibatches, the first check to fail names both fields
    assert main(["train", "--learner.batch_size", "33", "--run.out_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "learner.minibatches=4" in err and "learner.batch_size=33" in err
    assert not any(tmp_path.iterdir())  # no run directory was created


def test_cli_unknown_env_id(tmp_path, capsys):
    rc = main(["train", "--env.id", "CartPol-v1", "--run.out_dir", str(tmp_path)])
    assert rc == 2
    assert "env.id='CartPol-v1'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@settings(max_examples=60, deadline=None)
@given(section=st.sampled_from(sorted(C.SECTIONS)), value=st.one_of(
    st.integers(-10**6, 10**6), st.floats(allow_nan=True), st.text(max_size=8), st.booleans(),
    st.lists(st.integers(-3, 100), max_size=3)))
def test_loader_either_builds_or_names_the_field(section, value):
    """Any value for any field either gives a valid frozen Config or a ConfigError naming that field."""
    import dataclasses

    for f in dataclasses.fields(C.SECTIONS[section]):
        try:
            cfg = C.build({section: {f.name: value}})
        except C.ConfigError as e:
            assert f"{section}.{f.name}" in str(e) or "multiple of" in str(e) or "buffers" in str(e)
        else:
            assert isinstance(cfg, C.Config)
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(getattr(cfg, section), f.name, value)


def test_presets_sit_between_defaults_and_file_and_command_line(tmp_path):
    from rlbalance.config.presets import PRESETS

    atari = PRESETS["atari"]["learner"]
    cfg = C.build({"env": {"id": "ALE/Pong-v5"}})
    assert cfg.run.preset == "atari"
    assert cfg.learner.learning_rate == atari["learning_rate"] and cfg.learner.epochs == atari["epochs"]
    f = tmp_path / "c.toml"
    f.write_text('[env]\nid = "ALE/Pong-v5"\n[learner]\nlearning_rate = 0.001\nepochs = 3\n')
    cfg = C.load(str(f), {"learner": {"epochs": "1"}})
    assert cfg.learner.learning_rate == 0.001  # the file beats the preset
    assert cfg.learner.epochs == 1  # the command line beats the file
    assert cfg.learner.ppo_clip == atari["ppo_clip"]  # the preset beats the default
    bare = C.build({"env": {"id": "ALE/Pong-v5"}, "run": {"preset": "none"}})
    assert bare.run.preset == "none" and bare.learner.epochs == 1 and bare.learner.learning_rate == 1e-3
    assert C.build({}).run.preset == "classic"
    # config.json round trip keeps the values and names the preset used
    again = C.from_dict(C.build({"env": {"id": "ALE/Pong-v5"}, "learner": {"epochs": 5}}).to_dict())
    assert again.run.preset == "atari" and again.learner.epochs == 5
    with pytest.raises(C.ConfigError, match="run.preset"):
        C.build({"run": {"preset": "mujoco"}})


def test_learner_update_options_are_checked():
    with pytest.raises(C.ConfigError, match="learner.minibatches"):
        C.build({"learner": {"batch_size": 16, "minibatches": 3}})
    with pytest.raises(C.ConfigError, match="learner.ppo_clip"):
        C.build({"learner": {"ppo_clip": 1.5}})
    with pytest.raises(C.ConfigError, match="learner.data_parallel.*'threads' learner was removed"):
        C.build({"learner": {"devices": 2, "data_parallel": "threads"}})
    assert C.build({"learner": {"devices": 2, "epochs": 2}}).ddp  # one learner process per device: any epochs
    with pytest.raises(C.ConfigError, match="run.name"):
        C.build({"run": {"name": "../escape"}})


def test_preset_buffer_count_follows_the_actor_layout_a_user_gives():
    """The Atari preset's 2 buffers per group fit its 2 actors; with 1 actor (one batch takes both of its
    buffers) the preset's value is raised so that the actor has one to fill while a batch is taken. A user's own
    value is only checked: as few as one batch in all (the least policy lag), and fewer is refused, naming the
    field, since a batch takes its buffers at once."""
    assert C.build({"env": {"id": "ALE/Pong-v5"}}).actors.buffers_per_actor == 2
    assert C.build({"env": {"id": "ALE/Pong-v5"}, "actors": {"num_actors": 1}}).actors.buffers_per_actor == 3
    one = C.build({"env": {"id": "ALE/Pong-v5"}, "actors": {"num_actors": 1, "buffers_per_actor": 2}})
    assert one.num_buffers == one.buffers_per_batch == 2
    assert C.build({"env": {"id": "ALE/Pong-v5"}, "actors": {"buffers_per_actor": 1}}).num_buffers == 2
    with pytest.raises(C.ConfigError, match=r"actors.buffers_per_actor=1 is invalid.*at once.*raise it to 2"):
        C.build({"env": {"id": "ALE/Pong-v5"}, "actors": {"num_actors": 1, "buffers_per_actor": 1}})
    with pytest.raises(C.ConfigError, match=r"actors.buffers_per_actor=-1 is invalid.*>= 1"):
        C.build({"env": {"id": "ALE/Pong-v5"}, "actors": {"buffers_per_actor": -1}})


def test_one_atari_setting_for_every_game_and_the_tuned_game_is_an_example_config():
    """Issue 45 item 5: the Atari preset is one setting for every game (no game layer), for each agent; SpaceInvaders'
    tuned settings are an example config file a user passes, which gives them whole (its one buffer per actor kept as
    given, as a user's value is) and whose layout, changed on top, is checked by its field."""
    from pathlib import Path

    def setting(cfg):
        d = cfg.to_dict()
        d["env"].pop("id")
        return {k: v for k, v in d.items() if k != "run"}

    for agent in ("vtrace", "r2d2"):
        games = [C.build({"env": {"id": i}, "learner": {"agent": agent}}) for i in
                 ("ALE/Pong-v5", "ALE/SpaceInvaders-v5", "SpaceInvadersNoFrameskip-v4", "ALE/Breakout-v5")]
        assert all(g.run.preset == "atari" for g in games)
        assert all(setting(g) == setting(games[0]) for g in games[1:]), agent
    si = C.build({"env": {"id": "ALE/SpaceInvaders-v5"}})
    assert (si.learner.unroll_length, si.actors.num_actors, si.env.episodic_life) == (20, 2, False)
    example = Path(__file__).resolve().parents[2] / "examples" / "spaceinvaders-tuned.toml"
    tuned = C.build(C.read_file(example))
    assert tuned.env.id == "ALE/SpaceInvaders-v5" and tuned.env.episodic_life is True and tuned.run.preset == "atari"
    assert (tuned.actors.num_actors, tuned.actors.envs_per_actor, tuned.num_buffers) == (1, 8, 1)
    assert (tuned.learner.unroll_length, tuned.learner.batch_size, tuned.learner.minibatches) == (128, 8, 4)
    assert tuned.learner.ppo_clip_reference == "proximal" and tuned.learner.minibatch_split == "steps"
    assert tuned.learner.learning_rate == si.learner.learning_rate  # the rest is the preset's
    with pytest.raises(C.ConfigError, match=r"actors.buffers_per_actor=1 is invalid.*raise it to 2"):
        C.build(C.merge(C.read_file(example), {"learner": {"batch_size": 16}}))


def test_a_recorded_config_reads_back_as_it_ran_not_with_newer_preset_values(tmp_path):
    """A config.json written before a field existed reads back with that field's default (how the run ran), not
    with what today's preset would set: a resumed run keeps its own setup."""
    from rlbalance.runtime.rundir import RunDir

    old = C.build({"env": {"id": "ALE/SpaceInvaders-v5"}, "run": {"preset": "atari"}}).to_dict()
    old["env"]["episodic_life"] = True  # a run tuned apart (examples/spaceinvaders-tuned.toml) ...
    old["actors"].update(num_actors=1, envs_per_actor=8, buffers_per_actor=1)
    old["learner"].update(unroll_length=128, batch_size=8)
    for field in ("ppo_clip_reference", "minibatch_split"):  # fields newer than the run
        del old["learner"][field]
    (tmp_path / "config.json").write_text(json.dumps(old))
    back = RunDir(tmp_path).read_config()
    assert back.learner.ppo_clip_reference == C.LearnerConfig.ppo_clip_reference == "behaviour"
    assert back.learner.minibatch_split == C.LearnerConfig.minibatch_split
    assert (back.env.episodic_life, back.actors.num_actors, back.learner.unroll_length) == (True, 1, 128)
    assert back.run.preset == "atari" and back.learner.epochs == 4  # the recorded preset values stay
    assert C.from_dict(C.build({"env": {"id": "ALE/SpaceInvaders-v5"}}).to_dict()).learner.unroll_length == 20


def test_preset_none_means_no_layer_at_all_the_agents_included():
    """run.preset=none gives the bare field defaults: the agent's own layer (R2D2's learning rate, core, ...) no longer
    comes with it (issue 45, item 4), so what the error hints promise ('run.preset=none for no preset') holds."""
    bare = C.build({"learner": {"agent": "r2d2"}, "run": {"preset": "none"}})
    assert bare.learner.learning_rate == C.LearnerConfig.learning_rate and bare.learner.core == C.LearnerConfig.core
    with_preset = C.build({"learner": {"agent": "r2d2"}})
    assert with_preset.learner.core == "lstm" and with_preset.learner.unroll_length != C.LearnerConfig.unroll_length
    assert bare.learner.unroll_length == C.LearnerConfig.unroll_length
