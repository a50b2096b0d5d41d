"""The HTML report loads in a real headless browser with no console errors and shows its plots."""

import os
import re
import shutil
import subprocess

import pytest

from rlbalance.cli import main
from rlbalance.runtime.train import train


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
    assert n >= 5  # throughput/return, learning, stage breakdown, utilization, power (and batch sizes)
    for title in ("Learning", "Stage breakdown", "Utilization over time", "Power over time"):
        assert f'alt="{title}"' in dom, title
    assert "Bottleneck:" in dom and "modeled" in dom
    # units in the table, words in the evidence, nothing about a GPU this machine does not have
    assert "node power (W)" in dom and "sustained FPS (env frames/s, after warm-up)" in dom
    assert "learner waiting for unrolls" in dom and "learner_wait_data" not in dom
    import torch

    if not torch.cuda.is_available():
        assert "GPU power (W)" not in dom and "GPU energy" not in dom
        assert "copying to and from the device" not in dom
    evidence = re.findall(r"<li>[^<:]+: ([^<]*)</li>", dom)
    assert evidence and all(v.endswith("%") for v in evidence), evidence  # one unit in the list


def test_report_learning_figure_has_every_panel(cfg_factory):
    """The learning figure draws return against frames and wall time, then losses, entropy, policy lag,
    gradient norm and learning rate, from a run's own metrics; a short run still gives a curve."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlbalance.telemetry.report import _learning_figure

    s = train(cfg_factory(run={"total_steps": 30_000, "name": "learnfig"},
                          telemetry={"tensorboard": False, "report": False, "log_interval_s": 60.0}))
    m = [json.loads(line) for line in open(os.path.join(s["run_dir"], "metrics.jsonl"))]
    assert len(m) >= 50  # a record every 1% of run.total_steps, though the log interval is longer than the run
    fig = _learning_figure(m, [r["frames"] for r in m], plt)
    titles = [ax.get_title() for ax in fig.axes]
    for want in ("mean return (last 100)", "policy entropy (nats)", "policy loss", "value loss",
                 "gradient norm (before clipping)", "learning rate", "policy lag (updates)"):
        assert want in titles, titles
    assert [ax.get_xlabel() for ax in fig.axes].count("wall time (minutes)") == 1
    assert all(len(ax.lines[0].get_xdata()) == len(m) for ax in fig.axes)
    plt.close(fig)


def test_report_cli_and_csv(cfg_factory):
    s = train(cfg_factory(run={"total_steps": 8_000, "name": "rep2"}, telemetry={"tensorboard": False,
                          "report": False}))
    assert not os.path.exists(os.path.join(s["run_dir"], "report.html"))
    assert main(["report", s["run_dir"]]) == 0
    assert os.path.exists(os.path.join(s["run_dir"], "report.html"))
    html = open(os.path.join(s["run_dir"], "report.html")).read()
    # (issue 48 item 4: the wall time, the steps with separators, and which FPS the page calls sustained)
    assert "wall time" in html and f"({s['wall_s']:,.0f} s)" in html and f"{s['steps']:,}" in html
    assert "sustained FPS (env frames/s, after warm-up)" in html
    rows = open(os.path.join(s["run_dir"], "stage_shares.csv")).read().splitlines()
    assert rows[0] == "role,stage,stage_in_words,share" and any(r.startswith("actor,env_step,stepping envs,")
                                                                    for r in rows)


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
