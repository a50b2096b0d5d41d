"""A report someone opens runs nothing a run directory planted (issue 44, item 5): every field read from the run's
files (meta.json's hardware stamp included) is escaped in report.html."""

import json
import os

from rlbalance.runtime.ddp_runner import launched_by_torchrun
from rlbalance.telemetry.report import write_report

EVIL = "<script>alert(1)</script>"


def test_a_crafted_meta_json_puts_no_markup_in_the_report(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    recs = [{"time_s": float(t), "session": 0, "steps": 1000 * t, "frames": 1000 * t, "sps": 1000.0, "fps": 1000.0,
             "episode_return": float(t), "verdict": EVIL} for t in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    hw = {"cpu_model": EVIL, "physical_cores": EVIL, "logical_cpus": EVIL, "gpus": [{"name": EVIL}],
          "git_commit": EVIL}
    (run / "meta.json").write_text(json.dumps({"hardware": hw}))
    (run / "summary.json").write_text(json.dumps({"env": EVIL, "outcome": EVIL, "mode": EVIL, "inference": EVIL,
                                                  "model": EVIL, "device": EVIL, "steps": 5000, "frames": 5000,
                                                  "actor_faults": [{"actor": EVIL, "at": EVIL, "reason": EVIL}]}))
    (run / "telemetry.json").write_text(json.dumps({"verdict": {"verdict": EVIL, "evidence": EVIL, "advice": EVIL,
                                                                "figures": {EVIL: EVIL}}}))
    page = write_report(run).read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # the report's own (it marks its plots loaded), nothing else


def test_torchrun_variables_are_honoured_only_under_torchrun(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert launched_by_torchrun() is None  # left in a shell: a plain train stays a plain train
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert launched_by_torchrun() == (1, 2, 1)


def test_a_private_ray_keeps_its_files_in_a_folder_of_this_user(monkeypatch, tmp_path):
    import stat
    import tempfile

    from rlbalance.runtime.ray_workers import private_ray_dir

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    (tmp_path / f"rlbalance-ray-{os.getuid()}").mkdir(mode=0o777)
    os.chmod(tmp_path / f"rlbalance-ray-{os.getuid()}", 0o777)  # found open to everyone: closed
    path = private_ray_dir()
    st = os.stat(path)
    assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
