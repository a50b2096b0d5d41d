"""Run directories on a shared filesystem cannot be turned against their user (issue 44, item 3): no write follows
a symbolic link, temporary files are made new under unguessable names, a new run never reuses a directory, the
checkpoint pointer stays in checkpoints/, resuming another user's run is refused unless asked, and a checkpoint
that would not fit on the disk is refused before it is written."""

import json
import os
from collections import namedtuple

import pytest
import torch

from rlbalance import config as C
from rlbalance.cli import main
from rlbalance.core.errors import DiskWriteError
from rlbalance.core.jsonio import atomic_write_json, open_nofollow
from rlbalance.runtime.rundir import RunDir


def _run_dir(tmp_path, name="run"):
    run = tmp_path / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(C.build({"run": {"out_dir": str(tmp_path)}}).to_dict()))
    torch.save({"format": "rlbalance-checkpoint-v1", "steps": 1000, "model": {}},
               run / "checkpoints" / "ckpt-000000001000.pt")
    return run


def _victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_text("precious")
    return v


def test_a_lock_link_is_refused_on_resume_and_its_target_untouched(tmp_path, capsys):
    run, victim = _run_dir(tmp_path), _victim(tmp_path)
    (run / ".lock").symlink_to(victim)
    assert main(["train", "--resume", str(run), "--run.total_steps", "2000"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ".lock is a symbolic link" in err, err
    assert victim.read_text() == "precious"
    # planted between the check and the open: O_NOFOLLOW still refuses it
    rd = RunDir(run)
    rd.check_links = lambda: None
    with pytest.raises(C.ConfigError, match="cannot open its .lock"):
        rd.lock()
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("name", ["checkpoints", "metrics.jsonl", "summary.json", "tb"])
def test_any_link_in_a_run_directory_is_refused_before_anything_is_written(tmp_path, name):
    run, victim = _run_dir(tmp_path), _victim(tmp_path)
    target = victim if name.endswith((".jsonl", ".json")) else tmp_path / "elsewhere"
    if not target.exists():
        target.mkdir()
    if name == "checkpoints":
        (run / "checkpoints" / "ckpt-000000001000.pt").rename(target / "ckpt-000000001000.pt")
        (run / "checkpoints").rmdir()
    (run / name).symlink_to(target)
    with pytest.raises(C.ConfigError, match=f"{name} is a symbolic link"):
        RunDir(run).lock()
    assert victim.read_text() == "precious"
    assert not (run / ".lock").exists()


def test_a_planted_tmp_link_is_not_written_through(tmp_path):
    run, victim = _run_dir(tmp_path), _victim(tmp_path)
    (run / "config.json.tmp").symlink_to(victim)
    atomic_write_json(run / "config.json", {"a": 1})
    assert victim.read_text() == "precious"
    assert json.loads((run / "config.json").read_text()) == {"a": 1}
    # and a link at the destination itself is replaced, not followed
    (run / "summary.json").symlink_to(victim)
    atomic_write_json(run / "summary.json", {"b": 2})
    assert victim.read_text() == "precious" and not (run / "summary.json").is_symlink()
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]  # none left behind
    (run / "report.html").symlink_to(victim)
    with pytest.raises(DiskWriteError, match="is a symbolic link"):
        open_nofollow(run / "report.html", "w")
    assert victim.read_text() == "precious"


def test_a_new_run_never_reuses_a_directory(tmp_path, monkeypatch):
    cfg = C.build({"run": {"out_dir": str(tmp_path), "name": "mine"},
                   "telemetry": {"progress": False, "tensorboard": False}})
    (tmp_path / "mine").mkdir()  # exists, no config.json: still not ours to write into
    with pytest.raises(C.ConfigError, match="already exists; it is not a run of yours"):
        RunDir.create(cfg)
    (tmp_path / "mine").rmdir()
    (tmp_path / "mine").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(C.ConfigError, match="already exists"):
        RunDir.create(cfg)
    assert not (tmp_path / "elsewhere").exists()
    # a generated name that is taken (two runs started in the same second) gets a suffix instead
    import rlbalance.runtime.rundir as R

    monkeypatch.setattr(R.time, "strftime", lambda fmt, *a: "20261207-120000")
    auto = C.build({"run": {"out_dir": str(tmp_path / "runs")}})
    a, b = RunDir.create(auto), RunDir.create(auto)
    assert a.path.name == "CartPole-v1-20261207-120000" and b.path.name == "CartPole-v1-20261207-120000-2"
    assert (b.path / "config.json").is_file()
    a.unlock()
    b.unlock()


def test_the_latest_pointer_stays_in_checkpoints(tmp_path):
    run, victim = _run_dir(tmp_path), _victim(tmp_path)
    rd = RunDir(run)
    (run / "checkpoints" / "latest").write_text("../../victim.txt")
    assert rd.latest_checkpoint() == run / "checkpoints" / "ckpt-000000001000.pt"
    (run / "checkpoints" / "latest").write_text(str(victim))
    assert rd.latest_checkpoint() == run / "checkpoints" / "ckpt-000000001000.pt"
    (run / "checkpoints" / "ckpt-000000009999.pt").symlink_to(victim)
    assert rd.latest_checkpoint() == run / "checkpoints" / "ckpt-000000001000.pt"  # a link is no checkpoint


def test_resuming_another_users_run_is_refused_unless_asked(tmp_path, capsys, monkeypatch):
    run = _run_dir(tmp_path)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(run).st_uid + 4242)
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "belongs to another user" in err and "--allow-other-owner" in err and len(err.splitlines()) == 1
    assert not (run / ".lock").exists()
    RunDir(run).check_owner(allow_other_owner=True)  # asked: no refusal


def test_a_checkpoint_that_does_not_fit_is_refused_before_it_is_written(tmp_path, monkeypatch):
    import shutil

    run = _run_dir(tmp_path)
    rd = RunDir(run)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(DiskWriteError, match="MiB free .* free some space, then resume from"):
        rd.save_checkpoint({"steps": 2000, "model": {"w": torch.zeros(1000)}})
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt-000000001000.pt"]
