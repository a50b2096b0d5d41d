"""The report and the headline figures as a reader takes them: stages in words, no GPU where there is none, gaps
where a run was resumed, the headline SPS of a short run the rate its updates ran at."""

import csv
import json

from rlbalance.telemetry import metrics as M
from rlbalance.telemetry.metrics import with_gaps
from rlbalance.telemetry.report import stage_words, write_csv


def test_stage_names_are_words_and_no_device_copy_without_a_gpu():
    assert stage_words("fwd_bwd", gpu=False) == "forward and backward pass"
    assert stage_words("h2d", gpu=True) == "copying to the GPU"
    assert "GPU" not in stage_words("h2d", gpu=False) and "device" not in stage_words("d2h", gpu=False)


def test_a_resumed_run_leaves_a_gap_and_counts_wall_time_on():
    m = [{"session": 0, "time_s": t, "steps": 100 * t, "fps": 10.0} for t in (1, 2, 3)]
    m += [{"session": 1, "time_s": t, "steps": 300 + 100 * t, "fps": 10.0} for t in (1, 2)]
    out = with_gaps(m)
    assert [r.get("gap", False) for r in out] == [False, False, False, True, False, False]
    assert [r["time_s"] for r in out if not r.get("gap")] == [1, 2, 3, 4, 5]  # no line back to zero
    assert out[3]["fps"] != out[3]["fps"]  # NaN: nothing is drawn across the stop
    # records written before they carried a session number: a clock that goes back starts a session too
    old = [{k: v for k, v in r.items() if k != "session"} for r in m]
    assert [r["time_s"] for r in with_gaps(old) if not r.get("gap")] == [1, 2, 3, 4, 5]


def test_hardware_csv_has_no_gpu_columns_without_a_gpu(tmp_path):
    d = {"telemetry": {"hardware_timeline": [{"t": 0.5, "cpu_per_core": [0.5, 1.0], "cpu_power_w": 30.0,
                                              "cpu_power_source": "modeled", "gpu_power_w": 0.0,
                                              "gpu_power_source": "none", "gpu_util": []}],
                       "stage_shares": {"learner": {"fwd_bwd": 0.9, "h2d": 0.1}}},
         "meta": {"hardware": {"gpus": []}}, "summary": {"device": "cpu"}}
    write_csv(tmp_path, d)
    header = next(csv.reader(open(tmp_path / "hardware.csv")))
    assert header == ["t_s", "cpu_util_mean", "cpu_power_w", "cpu_power_source"]
    rows = list(csv.reader(open(tmp_path / "stage_shares.csv")))
    assert rows[0] == ["role", "stage", "stage_in_words", "share"]
    assert ["learner", "h2d", "gathering the batch", "0.100000"] in rows


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_headline_sps_ends_at_the_last_update(tmp_path, monkeypatch):
    """A short run's sustained SPS is the rate its updates ran at: the final checkpoint and shutdown after the last
    update are not counted (a 564 SPS headline under records of 3-10k); its final record repeats the last rate."""
    clock = _Clock()
    monkeypatch.setattr(M.time, "perf_counter", clock)
    log = M.MetricsLogger(tmp_path, tensorboard=False, frames_per_step=1, warmup_s=1.0)
    for i in range(1, 11):  # 1,000 steps a second for 10 s
        clock.t = float(i)
        log.note_steps(1000 * i)
        if i % 5 == 0:
            log.log(1000 * i, {})
    clock.t = 30.0  # 20 s of final checkpoint, report and shutdown
    assert abs(log.sustained_sps(10_000) - 1000.0) < 1e-6
    rec = log.log(10_000, {}, final=True)
    assert abs(rec["sps"] - 1000.0) < 1e-6
    log.close()
    lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert [round(r["sps"]) for r in lines] == [1000, 1000, 1000]
