"""The HTML report loads in a real headless browser with no console errors and shows its plots."""

import os
import re
import shutil
import subprocess

import pytest

from rlbalance.cli import main
from rlbalance.train import train


def _chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/run installs Debian's chromium package")
        pytest.skip("no chromium here (CI installs it): apt-get install chromium")
    return path


def test_report_in_headless_chromium(cfg_factory, tmp_path):
    s = train(cfg_factory(run={"total_steps": 30_000, "name": "report"},
                          telemetry={"tensorboard": False, "hardware_interval_s": 0.3, "warmup_s": 0.5}))
    page = os.path.join(s["run_dir"], "report.html")
    browser = _chromium()
    out = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=3000", "--dump-dom", f"file://{page}"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    console = [line for line in out.stderr.splitlines() if "CONSOLE" in line]
    assert not [c for c in console if re.search(r"error|uncaught", c, re.I)], console
    dom = out.stdout
    assert 'data-plots-loaded="true"' in dom, dom[-3000:]
    n = int(re.search(r'data-plots="(\d+)"', dom).group(1))
    assert n >= 4  # throughput/return, stage breakdown, utilization, power (and batch sizes)
    assert "Bottleneck:" in dom and "modeled" in dom


def test_report_cli_and_csv(cfg_factory):
    s = train(cfg_factory(run={"total_steps": 8_000, "name": "rep2"}, telemetry={"tensorboard": False,
                          "report": False}))
    assert not os.path.exists(os.path.join(s["run_dir"], "report.html"))
    assert main(["report", s["run_dir"]]) == 0
    assert os.path.exists(os.path.join(s["run_dir"], "report.html"))
    rows = open(os.path.join(s["run_dir"], "stage_shares.csv")).read().splitlines()
    assert rows[0] == "role,stage,share" and any(r.startswith("actor,env_step,") for r in rows)


def test_profile_groups_kernels(tmp_path, capsys):
    rc = main(["profile", "--steps", "3", "--run.total_steps", "3000", "--run.out_dir", str(tmp_path),
               "--run.name", "prof", "--telemetry.progress", "false", "--telemetry.tensorboard", "false"])
    assert rc == 0
    import json

    prof = json.load(open(tmp_path / "prof" / "profile.json"))
    for phase in ("inference", "training"):
        kinds = prof["phases"][phase]["by_kind_ms"]
        assert kinds.get("GEMM", 0) > 0, kinds
        assert prof["phases"][phase]["achieved_flops"] > 0
    assert prof["phases"]["training"]["by_kind_ms"].get("optimizer", 0) > 0
    assert "Kernel breakdown" in open(tmp_path / "prof" / "report.html").read()
