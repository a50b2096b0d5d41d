"""Help for people: a short usage line, options grouped by section with the values a run will use, suggestions for
misspelled options and fields, examples that parse as written."""

import re

import pytest

from rlbalance import config as C
from rlbalance.cli import main


def _help(capsys, *cmd) -> str:
    with pytest.raises(SystemExit):
        main([*cmd, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("cmd", ["train", "profile", "sweep", "calibrate", "eval", "bench"])
def test_usage_is_short(capsys, cmd):
    usage = _help(capsys, cmd).split("\n\n")[0]
    assert usage.startswith(f"usage: rlbalance {cmd}") and "[OPTIONS]" in usage
    assert len(usage.splitlines()) < 6, usage


def test_options_show_what_a_cartpole_and_a_pong_run_use(capsys):
    text = " ".join(_help(capsys, "train").split())
    item = re.search(r"--learner\.learning_rate FLOAT (.*?) --learner\.", text).group(1)
    cartpole = C.build({}).learner.learning_rate
    pong = C.build({"env": {"id": "ALE/Pong-v5"}}).learner.learning_rate
    assert f"{cartpole} in a plain run (classic preset, CartPole-v1)" in item, item
    assert f"{pong} with the atari preset" in item, item
    assert "learner options" in text and "env options" in text  # grouped by section


def test_a_misspelled_option_gets_a_suggestion(capsys):
    assert main(["train", "--learner.lerning_rate", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "did you mean --learner.learning_rate?" in err and len(err.strip().splitlines()) <= 3


def test_a_misspelled_field_in_set_gets_a_suggestion(capsys):
    assert main(["train", "--set", "learner.lerning_rate=0.1"]) == 2
    assert "did you mean learner.learning_rate?" in capsys.readouterr().err


def test_a_value_from_the_preset_is_named_as_such(capsys):
    assert main(["train", "--learner.batch_size", "10"]) == 2
    err = capsys.readouterr().err
    assert "learner.minibatches=4 is the classic preset's" in err


def test_the_help_shows_each_value_once():
    """Issue 48 item 5: no field's help repeats one value ('1e-05 in a plain run; 1e-05 with the atari preset; 1e-05
    otherwise' was eight options' text): presets with the same value are named together, one equal to the default is
    not named, and where every preset keeps the default the help says just that."""
    import dataclasses

    from rlbalance.cli.options import default_text

    seen = 0
    for sec, cls in C.SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            text = default_text(sec, f.name, default)
            if text.startswith("default: "):
                continue
            seen += 1
            values = [re.split(r" (?:in a plain run|with the|otherwise)", part)[0] for part in text.split("; ")]
            assert len(values) == len(set(values)), (sec, f.name, text)
    assert seen >= 5  # (presets do set values that differ from the defaults)
    assert default_text("learner", "adam_eps", C.LearnerConfig.adam_eps).count("1e-05") <= 1


def test_the_help_shows_each_presets_value_and_no_game_of_its_own():
    from rlbalance.cli.options import default_text

    text = default_text("learner", "unroll_length", 80)
    assert "20 with the atari preset" in text and "SpaceInvaders" not in text  # one Atari setting for every game


@pytest.mark.parametrize("text, want", [("[myenvs]", ("myenvs",)), ("myenvs,other", ("myenvs", "other")),
                                         ('["myenvs"]', ("myenvs",)), ("[a, b]", ("a", "b"))])
def test_list_values_parse_in_every_form_the_help_shows(text, want):
    assert C.coerce("env", "imports", text) == want


def test_resume_of_a_missing_directory_says_so(capsys, tmp_path):
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert f"run directory {tmp_path / 'nope'} does not exist" in capsys.readouterr().err


def test_every_help_example_parses_as_written():
    """The examples in each command's help (and the config fields' 'e.g.' lists) parse: no unknown option, no
    refused value."""
    import shlex

    from rlbalance.cli import build_parser
    from rlbalance.cli.options import cli_overrides, normalize_option

    parser, parsers, modules = build_parser()
    seen = 0
    for name, mod in modules.items():
        for line in (mod.__doc__ or "").splitlines():
            line = line.split("#", 1)[0].strip()
            if not line.startswith(f"rlbalance {name}"):
                continue
            args, unknown = parser.parse_known_args([normalize_option(a) for a in shlex.split(line)[1:]])
            assert not unknown, (line, unknown)
            if hasattr(args, "set") and name in ("train", "profile", "sweep", "calibrate"):
                C.merge(cli_overrides(args))  # --set items are well formed
            seen += 1
    assert seen >= 20


def test_an_abbreviated_option_is_refused_with_the_one_meant(tmp_path, capsys):
    """argparse's prefix matching took --actors.num_actor for --actors.num_actors and trained a whole run; a typo is
    named instead, with the option meant, before anything starts (issue 48, item 5)."""
    from rlbalance.cli import main

    assert main(["train", "--actors.num_actor", "3", "--run.out_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unrecognized argument --actors.num_actor" in err and "did you mean --actors.num_actors?" in err
    assert not any(tmp_path.iterdir())
