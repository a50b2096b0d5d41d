"""A run directory or config file from someone else runs no code (issue 44, item 1): the modules it names for import
(env.id 'module:Name', env.imports, learner.agent 'module:Agent') are shown and refused, with one line and nothing
imported or written, unless the user confirms them; and even then only env classes (or functions a module registers
with gymnasium) are called as envs, never an arbitrary callable such as os.system."""

import json
import sys

import pytest
import torch

from rlbalance import config as C
from rlbalance.cli import main


def _planted_run(tmp_path, env: dict, learner: dict | None = None):
    """A run directory as a stranger could share it: config.json naming code, and a stub checkpoint."""
    run = tmp_path / "shared-run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = C.build({"run": {"out_dir": str(tmp_path)}}).to_dict()
    cfg["env"].update(env)
    cfg["learner"].update(learner or {})
    (run / "config.json").write_text(json.dumps(cfg))
    torch.save({"format": "rlbalance-checkpoint-v1", "steps": 1000, "model": {}},
               run / "checkpoints" / "ckpt-000000001000.pt")
    (run / "checkpoints" / "latest").write_text("ckpt-000000001000.pt")
    return run


@pytest.fixture
def evil_module(tmp_path, monkeypatch):
    """A module whose import leaves a marker file: importing it is running it."""
    marker = tmp_path / "imported"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "evilmod.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nimport gymnasium as gym\n"
        "gym.register('Evil-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    yield marker
    sys.modules.pop("evilmod", None)


def _refused(capsys, argv, *names) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one clear line
    for n in names:
        assert n in err, err
    return err


def test_os_system_in_a_run_directory_runs_nothing_on_eval_or_resume(tmp_path, capsys, monkeypatch):
    marker = tmp_path / "pwned"
    run = _planted_run(tmp_path, {"id": "os:system", "kwargs": {"command": f"id > {marker}"}})
    monkeypatch.chdir(tmp_path)
    _refused(capsys, ["eval", str(run)], "env.id='os:system'", "--trust-modules", "nothing was imported")
    _refused(capsys, ["eval", str(run), "--video"], "env.id='os:system'")
    _refused(capsys, ["train", "--resume", str(run)], "env.id='os:system'", "--trust-modules")
    # confirmed, os is imported (it is installed), but os.system is no env: it is never called
    _refused(capsys, ["eval", str(run), "--trust-modules"], "is neither a registered env id, an env class")
    _refused(capsys, ["train", "--resume", str(run), "--trust-modules"], "is neither a registered env id")
    assert not marker.exists()
    assert not (tmp_path / "evals").exists()  # nothing written


def test_a_shared_config_file_naming_code_is_refused(tmp_path, capsys, evil_module):
    marker = tmp_path / "pwned"
    bad = tmp_path / "shared.yaml"
    bad.write_text(f"env:\n  id: 'os:system'\n  kwargs: {{command: 'id > {marker}'}}\n")
    out = ["--run.out_dir", str(tmp_path / "runs")]
    for cmd in (["train"], ["calibrate"], ["sweep", "--axis", "actors.num_actors=1", "--db", str(tmp_path / "s.db")], ["profile"]):
        _refused(capsys, [*cmd, "--config", str(bad), *out], "config file", "env.id='os:system'")
    assert not marker.exists() and not (tmp_path / "runs").exists()
    imports = tmp_path / "imports.toml"
    imports.write_text('[env]\nimports = ["evilmod"]\nid = "evilmod:Evil-v0"\n')
    _refused(capsys, ["train", "--config", str(imports), *out], "env.id='evilmod:Evil-v0'", "env.imports=['evilmod']")
    assert not evil_module.exists()
    agent = tmp_path / "agent.toml"
    agent.write_text('[learner]\nagent = "evilmod:Agent"\n')
    _refused(capsys, ["train", "--config", str(agent), *out], "learner.agent='evilmod:Agent'")
    assert not evil_module.exists() and not (tmp_path / "runs").exists()


def test_the_user_confirms_modules_with_the_flag_or_on_the_command_line(tmp_path, evil_module):
    run = _planted_run(tmp_path, {"id": "evilmod:Evil-v0", "imports": ["evilmod"]})
    from rlbalance.runtime.rundir import RunDir

    with pytest.raises(C.ConfigError, match="--trust-modules"):
        RunDir(run).read_config()
    # the command line naming the same fields is the user's word for them
    cfg = RunDir(run).read_config(cli={"env": {"id": "evilmod:Evil-v0", "imports": ["evilmod"]}})
    assert cfg.env.id == "evilmod:Evil-v0"
    assert not evil_module.exists()  # reading the config imports nothing; the env is made later
    assert RunDir(run).read_config(trust_modules=True).env.imports == ("evilmod",)
    # a config file the same way
    f = tmp_path / "mine.toml"
    f.write_text('[env]\nid = "evilmod:Evil-v0"\n')
    with pytest.raises(C.ConfigError, match="config file"):
        C.load(str(f))
    assert C.load(str(f), trust_modules=True).env.id == "evilmod:Evil-v0"
    assert evil_module.exists()  # confirmed: imported (the preset is chosen from the env's action space)


def test_only_env_classes_or_registered_functions_are_called_as_envs():
    from types import SimpleNamespace

    from rlbalance.config.user_modules import import_user_modules

    with pytest.raises(C.ConfigError, match="neither a registered env id, an env class"):
        import_user_modules(SimpleNamespace(id="os:system", imports=()))
    with pytest.raises(C.ConfigError, match="neither"):
        import_user_modules(SimpleNamespace(id="subprocess:Popen", imports=()))  # a class, but no env
    assert import_user_modules(SimpleNamespace(id="custom_envs:Corridor", imports=())) == "custom_envs.Corridor"
    assert import_user_modules(SimpleNamespace(id="custom_envs:make_corridor", imports=())) == "custom_envs.make_corridor"

    def unregistered():
        return None

    unregistered.__module__, unregistered.__qualname__ = "custom_envs", "unregistered"
    with pytest.raises(C.ConfigError, match="registers it"):
        C.build({"env": {"id": unregistered}})
