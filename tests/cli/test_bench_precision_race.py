"""The precision bench and the CartPole race on tiny budgets: they run the real code and write strict JSON, a table
and a plot."""

import json
from pathlib import Path

import pytest

from rlbalance.bench import cartpole_race, precision

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_precision_bench_against_a_baseline_checkout(tmp_path):
    # this checkout as its own baseline: every variant measured in a fresh process, the rule's choice recorded
    doc = precision.run(ROOT, "cartpole", rounds=1, seconds=0.5, out=tmp_path, progress=lambda *a: None)
    saved = json.loads((tmp_path / "precision-cartpole.json").read_text())
    assert set(saved["median_sps"]) == {"baseline", "fp32", "bf16", "auto"}
    assert all(v > 0 for v in saved["median_sps"].values()) and saved["speedup"]["baseline"] == 1.0
    assert saved["auto_chose"]["torso_precision"] in ("fp32", "bf16") and saved["auto_chose"]["why"]
    assert doc["baseline"] and (tmp_path / "precision-cartpole.png").stat().st_size > 0
    assert "| auto |" in (tmp_path / "precision-cartpole.md").read_text()


@pytest.mark.slow
def test_cartpole_race_records_time_to_target_for_both(tmp_path):
    doc = cartpole_race.run(seeds=1, steps=20_000, target=20.0, out=tmp_path, progress=lambda *a: None)
    for name in ("rlbalance", "ppo_envpool"):
        r = doc["runs"][name][0]
        assert r["seconds_to_target"] is not None and r["seconds_to_target"] > 0  # a random policy scores ~22
        assert r["steps_to_target"] <= 20_000 + 8 * 128 and r["curve"]
    assert json.loads((tmp_path / "race.json").read_text())["summary"]["rlbalance"]["reached"] == 1
    assert (tmp_path / "race.png").stat().st_size > 0


def test_seeds_results_written_apart_merge_into_one(tmp_path):
    from rlbalance.bench import seeds

    def run(mode, seed, final):
        curve = [(1000, 20.0), (2000, 420.0), (3000, final)]
        return {"mode": mode, "seed": seed, "best": max(v for _, v in curve), "final": final, "sps": 100.0,
                "steps_to_400": 2000, "steps_to_475": 3000 if final >= 475 else None, "curve": curve}

    seeds.write_results(tmp_path / "a", [run("central", 0, 500.0), run("central", 1, 480.0)], ["central"], 3000)
    seeds.write_results(tmp_path / "b", [run("actor", 0, 450.0)], ["actor"], 3000)
    summary = seeds.merge([tmp_path / "a", tmp_path / "b"], tmp_path / "both")
    assert summary["central"]["reached_475"] == 2 and summary["actor"]["reached_475"] == 0
    doc = json.loads((tmp_path / "both" / "seeds.json").read_text())
    assert [(r["mode"], r["seed"]) for r in doc["runs"]] == [("central", 0), ("central", 1), ("actor", 0)]
    assert (tmp_path / "both" / "seeds.png").stat().st_size > 0
    seeds.write_results(tmp_path / "c", [run("actor", 0, 450.0)], ["actor"], 5000)
    with pytest.raises(ValueError, match="steps per run"):
        seeds.merge([tmp_path / "a", tmp_path / "c"], tmp_path / "bad")
