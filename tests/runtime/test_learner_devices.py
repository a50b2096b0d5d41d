"""Several learner devices with actors in the learner's own process (run.mode=serial): one learner process per
device, each stepping its own share of the envs, and the sweep axis over learner.devices."""

import json


def test_serial_runs_have_learner_ranks_too_and_the_sweep_divides_r_by_them(tmp_path):
    """A sweep of learner.devices=1,2 in serial mode: the 2-device point runs two learner processes (gloo), each
    with its own envs, records both ranks' figures, and R divides by the devices."""
    from rlbalance import config as C
    from rlbalance.analysis.ratio import analyse
    from rlbalance.analysis.sweep import parse_axes, run_sweep

    base = {"env": {"id": "synthetic", "synthetic_step_us": 20.0}, "run": {"mode": "serial"},
            "telemetry": {"warmup_s": 0.5, "hardware_interval_s": 0.5}}
    rows = run_sweep("devices", base, parse_axes(["learner.devices=1,2"]), 20_000, tmp_path / "s.db",
                     str(tmp_path / "runs"))
    assert sorted(r["accelerators"] for r in rows) == [1, 2]
    a = analyse(rows)
    by_acc = {p["accelerators"]: p for p in a["points"]}
    assert by_acc[2]["R"] == by_acc[1]["R"] / 2
    assert all(p["fps"] > 0 for p in a["points"])
    assert C.from_dict(json.loads(by_acc[2]["config"])).learner.devices == 2
    two = next(r for r in rows if r["accelerators"] == 2)
    assert set(two["learner_ranks"]) == {"0", "1"}  # both ranks trained, each on its own envs
    assert all(v["stage_shares"]["learner"]["fwd_bwd"] > 0 for v in two["learner_ranks"].values())
