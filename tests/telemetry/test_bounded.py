"""Long runs in bounded memory (issue 44, item 4): hardware samples, verdicts and the report's metrics records are
held evenly thinned past a cap, while the run's means still count every sample."""

import json

from rlbalance.core.thinned import Thinned
from rlbalance.telemetry.hardware import HardwareSampler, PowerModel, Sample
from rlbalance.telemetry.metrics import with_gaps
from rlbalance.telemetry.report import read_metrics


def test_thinned_holds_at_most_its_cap_spread_over_the_whole_run():
    t = Thinned(cap=16)
    for i in range(10_000):
        t.append(i)
        assert len(t) <= 16
    items = t.items()
    assert items[0] == 0 and items[-1] == 9_999  # first and last kept
    gaps = {b - a for a, b in zip(items, items[1:-1])}
    assert len(gaps) == 1  # evenly spaced: one stride between all the items held
    assert t.count == 10_000
    short = Thinned(cap=16, items=range(5))
    assert short.items() == [0, 1, 2, 3, 4]  # a short run keeps everything


def _sample(t: float, busy: float, rss: int) -> Sample:
    return Sample(t, [busy, busy], {"learner": busy}, {"learner": rss}, [], 10.0 + t, "modeled", 0.0, "modeled")


def test_hardware_sampler_memory_is_bounded_and_its_means_count_every_sample(monkeypatch):
    import rlbalance.telemetry.hardware as H

    monkeypatch.setattr(H, "TIMELINE_CAP", 64)
    s = HardwareSampler(model=PowerModel())
    n = 5_000
    for i in range(n):  # a run far longer than the cap, with a rising load
        s._add(_sample(float(i), i / n, 100 + i))
    assert len(s.timeline()) <= 64
    assert s.timeline()[0]["t"] == 0.0 and s.timeline()[-1]["t"] == n - 1
    summ = s.summary()
    assert summ["samples"] == n
    assert abs(summ["cpu_util_mean"] - (n - 1) / 2 / n) < 1e-9  # the mean of every sample, not of those held
    assert summ["role_rss_max"] == {"learner": 100 + n - 1}
    assert abs(summ["cpu_power_w"]["value"] - (10.0 + (n - 1) / 2)) < 1e-6
    assert s.last.t == n - 1


def test_report_reads_metrics_in_bounded_memory_keeping_every_session(tmp_path):
    p = tmp_path / "metrics.jsonl"
    with open(p, "w") as f:
        for session in range(3):
            for i in range(3_000):
                f.write(json.dumps({"session": session, "time_s": float(i), "steps": session * 3_000 + i,
                                    "fps": 1.0}) + "\n")
    recs = read_metrics(p, cap=256)
    assert len(recs) <= 256 + 3  # the cap, plus each session's first record
    steps = [r["steps"] for r in recs]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 8_999
    assert sum(r.get("gap", False) for r in with_gaps(recs)) == 2  # both resumes still show as gaps
