"""The throughput model on synthetic calibrations with known answers, and the catalog's validation."""

import pytest

from rlbalance.analysis.catalog import GpuSpec, Machine, load_catalog, parse_catalog
from rlbalance.analysis.planner import best_ratios, interp, predict, speed_for
from rlbalance.core.errors import ConfigError


def calibration(env_us=100.0, train_ms=10.0, infer_ms=1.0, torch_threads=1):
    """K=10 envs, T=10, B=10: one update trains 100 steps; inference flat in batch size."""
    return {
        "workload": {"env": "synthetic", "model": "mlp", "frames_per_step": 1, "obs_bytes": 0, "num_actions": 2,
                     "unroll_length": 10, "envs_per_actor": 10, "env_groups": 2, "batch_size": 10,
                     "forward_flops_per_obs": 1000},
        "torch_threads": torch_threads, "env_step_us": {"10": env_us}, "smt": {"factor": None},
        "inference_ms": {"10": infer_ms, "1000": infer_ms * 100}, "train_step_ms": {"10": train_ms},
        "pipe_round_trip_us": 0.0, "copy_ns_per_byte": 0.0,
        "hardware": {"cpu_model": "x", "physical_cores": 8, "logical_cpus": 8, "usable_cpus": 8},
    }


GPU = GpuSpec("G", fp32_tflops=10.0, tdp_w=300, idle_w=50)


def box(threads=16, gpus=1):
    return Machine("box", "test", threads, threads, gpus, GPU if gpus else None, 200.0, 100.0, 2.0)


SAME = {"inference": 1.0, "training": 1.0}  # the GPU runs as fast as the calibrated device


def test_env_bound_known_answer():
    cal = calibration(env_us=1000.0, train_ms=1.0, infer_ms=0.01)  # 1 ms per env step: 1k SPS per thread
    p = predict(cal, box(), actor_threads=4, speed=SAME)
    assert p["verdict"] == "actor-bound"
    assert p["sps"] == pytest.approx(4 * 1000, rel=1e-6)
    assert p["source"] == "modeled"


def test_learner_bound_known_answer():
    cal = calibration(env_us=1.0, train_ms=100.0, infer_ms=0.01)  # 100 ms per 100 steps: 1k SPS
    p = predict(cal, box(), actor_threads=8, speed=SAME)
    assert p["verdict"] == "learner-bound"
    # device time per step: 1000 us training + 1 us inference (0.01 ms / 10 envs)
    assert p["sps"] == pytest.approx(1e6 / (1000 + 1), rel=1e-6)


def test_balanced_knee_is_where_the_sides_meet():
    cal = calibration(env_us=1000.0, train_ms=25.0, infer_ms=0.0001)  # learner 4k SPS, 1k SPS per thread
    r = best_ratios(cal, box(threads=16), speed=SAME)
    # FPS rises by 1k per actor thread until 4 threads saturate the learner: the knee is at R = 4
    assert r["throughput_optimal_R"] == 4
    assert r["at_knee"]["verdict"] in ("actor-bound", "learner-bound")
    assert predict(cal, box(), 8, speed=SAME)["verdict"] == "learner-bound"
    assert predict(cal, box(), 2, speed=SAME)["verdict"] == "actor-bound"


def test_two_gpus_double_the_learner_side():
    cal = calibration(env_us=1.0, train_ms=100.0, infer_ms=0.01)
    one = predict(cal, box(gpus=1), 8, speed=SAME)["sps"]
    two = predict(cal, box(gpus=2), 8, speed=SAME)["sps"]
    assert two == pytest.approx(2 * one, rel=1e-6)


def test_r2d2_learner_side_is_its_gradient_steps_at_the_replay_ratio():
    """R2D2: a gradient step on B sequences is due for every B x T / replay_ratio env steps, so its time per env
    step is the step time over that (not over B x T as V-trace's update, which trains on each step once)."""
    cal = calibration(env_us=1.0, train_ms=100.0, infer_ms=0.01)
    cal["workload"].update(agent="r2d2", env_steps_per_train_step=25.0, rows_per_sample=31)  # B=10, T=10, ratio 4
    p = predict(cal, box(), actor_threads=8, speed=SAME)
    assert p["verdict"] == "learner-bound"
    assert p["sps"] == pytest.approx(1e6 / (100e3 / 25 + 1), rel=1e-6)  # 4,000 us training + 1 us inference
    # an agent that trains on one device (the calibration's max_learner_devices): more GPUs in the machine do not make
    # its learner side faster; without that cap (R2D2 now runs one learner process per device) they do
    one = {**cal, "workload": {**cal["workload"], "max_learner_devices": 1}}
    assert predict(one, box(gpus=8), actor_threads=8, speed=SAME)["sps"] == pytest.approx(p["sps"], rel=1e-6)
    assert predict(cal, box(gpus=8), actor_threads=8, speed=SAME)["sps"] > 4 * p["sps"]


def test_every_device_serves_inference_to_its_own_share_of_the_actors():
    """One inference server per learner device: with a forward pass whose cost does not depend on the batch, two
    devices each batch half the actors' requests, at twice the cost per step, so the learner side gains nothing
    from the second device while it is inference-bound."""
    cal = calibration(env_us=1.0, train_ms=1e-4, infer_ms=1.0)
    cal["inference_ms"] = {"10": 1.0, "1000": 1.0}  # 1 ms per forward pass at any batch
    one, two = predict(cal, box(gpus=1), 8, speed=SAME), predict(cal, box(gpus=2), 8, speed=SAME)
    assert one["inference_batch_per_device"] == 80 and two["inference_batch_per_device"] == 40  # 8 x 10 x 2 / 2
    assert one["verdict"] == two["verdict"] == "inference-bound"
    assert two["learner_sps"] == pytest.approx(one["learner_sps"], rel=1e-3)


def test_cpu_learner_shares_threads():
    cal = calibration(env_us=100.0, train_ms=1.0, infer_ms=0.001)
    p = predict(cal, box(threads=2, gpus=0), actor_threads=2)
    assert p["shared_cores"]
    # a step costs 100 us of env on a thread + 10 us of learning (1 ms per 100-step update): 2 threads share
    assert p["sps"] == pytest.approx(2 * 1e6 / (100 + 10), rel=1e-3)


def test_pipeline_round_trip_limits_few_actors():
    """With the measured pipeline loop, an actor's K=10 envs wait one round trip per step: 2 groups of
    10 envs, env 10 us (100 us per group-step), round trip 900 us: each group steps every 1000 us."""
    cal = calibration(env_us=10.0, train_ms=0.1, infer_ms=0.001)
    cal["pipeline"] = {"points": {"1": {"group_cycle_us": 900.0, "actor_cpu_us_per_step": 0.0,
                                        "learner_cpu_us_per_step": 1.0}}, "free_env_step_us": 0.0}
    p = predict(cal, box(threads=64, gpus=0), actor_threads=1)
    assert p["verdict"] == "actor-bound"
    assert p["sps"] == pytest.approx(2 * 10 * 1e6 / 1000, rel=1e-6)
    # more actors: more groups in flight at once, until the threads are used up; the pipeline terms
    # between measured actor counts are linear in the count, and flat past the last one
    cal["pipeline"]["points"]["3"] = {"group_cycle_us": 1900.0, "actor_cpu_us_per_step": 0.0,
                                      "learner_cpu_us_per_step": 1.0}
    two = predict(cal, box(threads=64, gpus=0), actor_threads=2)["sps"]
    assert two == pytest.approx(2 * 2 * 10 * 1e6 / (1400 + 100), rel=1e-6)
    del cal["pipeline"]["points"]["3"]
    assert predict(cal, box(threads=64, gpus=0), actor_threads=4)["sps"] == pytest.approx(4 * p["sps"], rel=1e-6)


def test_the_pipeline_throughput_with_free_actors_caps_the_cpu_learner_side():
    """The learner process (learner and inference server threads under one GIL) saturates below the machine's
    threads: its CPU per step says 2 threads could train 2e6 / 100 = 20k steps/s, but the pipeline loop with free
    actors measured 8k at 2 actor processes and 6k at 4, so that is the learner side's ceiling there; 3 actor
    processes (more than the 2 threads, as the loop measured) lie between."""
    cal = calibration(env_us=1.0, train_ms=0.1, infer_ms=0.001)
    point = {"group_cycle_us": 10.0, "actor_cpu_us_per_step": 1.0, "learner_cpu_us_per_step": 100.0}
    cal["pipeline"] = {"points": {"1": {**point, "sps": 5000.0}, "2": {**point, "sps": 8000.0},
                                  "4": {**point, "sps": 6000.0}}, "free_env_step_us": 0.0}
    two = Machine("this machine", "x", 2, 2, 0, None, 20.0, 100.0)
    assert predict(cal, two, actor_threads=2)["learner_sps"] == pytest.approx(8000.0)
    p3 = predict(cal, two, actor_threads=3)
    assert p3["actor_threads"] == 3 and p3["learner_sps"] == pytest.approx(7000.0)
    assert not any("pipeline" in why for why in p3["extrapolation"])
    p8 = predict(cal, two, actor_threads=8)  # past the loop's 4: held at the edge, and said so
    assert p8["learner_sps"] == pytest.approx(6000.0)
    assert "actor threads in the pipeline loop at 8, measured 1..4" in p8["extrapolation"]


def test_an_actor_round_waits_for_each_request_less_what_its_other_groups_step_meanwhile():
    """2 groups of K=10 envs; a step costs 10 us of env over the free env's and 5 us of actor loop: a group's turn
    is 150 us. With a measured wait of 400 us per request, each group waits 400 - 150 us after the other's turn: a
    round takes 2 x 150 + 2 x 250 = 800 us for 20 steps. With 100 us the other group's turn hides it: 300 us."""
    cal = calibration(env_us=10.0, train_ms=1e-4, infer_ms=1e-4)
    cal["env_step_us"] = {"10": 10.0}
    point = {"group_cycle_us": 1.0, "actor_cpu_us_per_step": 5.0, "learner_cpu_us_per_step": 0.01, "sps": 1e9}
    cal["pipeline"] = {"points": {"1": {**point, "request_wait_us": 400.0}}, "free_env_step_us": 0.0}
    big = Machine("big", "x", 64, 64, 0, None, 200.0, 100.0)
    p = predict(cal, big, actor_threads=1)
    assert p["verdict"] == "actor-bound" and p["sps"] == pytest.approx(20 * 1e6 / 800, rel=1e-6)
    cal["pipeline"]["points"]["1"]["request_wait_us"] = 100.0
    assert predict(cal, big, actor_threads=1)["sps"] == pytest.approx(20 * 1e6 / 300, rel=1e-6)


def test_pipeline_cpu_capacity_caps_many_actors():
    """2 threads; a step costs 10 us of env + 40 us of actor loop + 30 us in the learner process."""
    cal = calibration(env_us=10.0, train_ms=0.1, infer_ms=0.001)
    cal["pipeline"] = {"points": {"1": {"group_cycle_us": 0.0, "actor_cpu_us_per_step": 40.0,
                                        "learner_cpu_us_per_step": 30.0}}, "free_env_step_us": 0.0}
    p = predict(cal, box(threads=2, gpus=0), actor_threads=8)
    assert p["shared_cores"]
    assert p["sps"] == pytest.approx(2 * 1e6 / (10 + 40 + 30), rel=1e-6)  # below the learner's 1e6 / 30
    assert p["verdict"] == "actor-bound"  # the actor side takes more of the CPU: 50 us against 30 us


def test_gpu_calibration_file_gives_a_measured_speed():
    cal = calibration(env_us=1.0, train_ms=100.0, infer_ms=0.01)
    gpu_cal = calibration(env_us=1.0, train_ms=25.0, infer_ms=0.005)  # the same workload, 4x/2x faster
    gpu_cal.update(device="cuda", hardware={"gpus": [{"name": "NVIDIA G-SXM 80GB"}]})
    speed = speed_for(cal, box(), [gpu_cal])
    assert speed["training"] == pytest.approx(4.0) and speed["inference"] == pytest.approx(2.0)
    assert speed["source"].startswith("measured")
    assert speed_for(cal, box(gpus=0), [gpu_cal]) is None  # no GPU: nothing to scale
    other = Machine("other", "t", 16, 16, 1, GpuSpec("T4", 8.1, 70, 10), 200.0, 100.0)
    assert speed_for(cal, other, [gpu_cal]) is None  # another GPU model: the roofline applies
    p = predict(cal, box(), 8, speed=speed)
    assert p["sps"] == pytest.approx(4 * predict(cal, box(), 8, speed=SAME)["sps"], rel=0.01)
    gpu_cal["workload"] = {**gpu_cal["workload"], "env": "CartPole-v1"}
    with pytest.raises(ConfigError, match="workload.env"):
        speed_for(cal, box(), [gpu_cal])


def test_a_prediction_inside_the_calibration_is_not_flagged_and_carries_the_validated_band():
    from rlbalance.analysis.planner import VALIDATED_ERROR

    cal = calibration(env_us=100.0, train_ms=1.0, infer_ms=0.01)
    here = Machine("this machine", "x", 8, 8, 0, None, 80.0, 100.0)  # the calibrated one (see calibration())
    p = predict(cal, here, actor_threads=4)  # K=10 measured, inference batch 40 within 10..1000, B=10 measured
    assert not p["extrapolated"] and p["extrapolation"] == []
    assert p["fps_range"] == pytest.approx([p["fps"] * (1 - VALIDATED_ERROR), p["fps"] * (1 + VALIDATED_ERROR)])


def test_past_the_measured_env_counts_the_prediction_says_so_and_spans_edge_and_trend():
    """Env cost per step measured at K=1 (50 us) and K=10 (100 us); asked at K=40: held at the edge it costs 100 us,
    along the trend 266 us, kept within twice the edge: 200 us. Actor-bound on a GPU box, so FPS is 1e6 / cost per
    actor thread, and the range spans both (widened by the validated error); the point follows the trend."""
    from rlbalance.analysis.planner import VALIDATED_ERROR

    cal = calibration(env_us=100.0, train_ms=1e-3, infer_ms=1e-4)
    cal["env_step_us"] = {"1": 50.0, "10": 100.0}
    cal["workload"]["envs_per_actor"] = 40
    p = predict(cal, box(), actor_threads=4, speed=SAME)
    assert p["verdict"] == "actor-bound" and p["extrapolated"]
    assert "envs per actor at 40, measured 1..10" in p["extrapolation"]
    assert p["fps"] == pytest.approx(4 * 1e6 / 200, rel=1e-6)
    lo, hi = p["fps_range"]
    assert lo == pytest.approx(4 * 1e6 / 200 * (1 - VALIDATED_ERROR), rel=1e-6)
    assert hi == pytest.approx(4 * 1e6 / 100 * (1 + VALIDATED_ERROR), rel=1e-6)


def test_a_gpu_without_its_calibration_is_flagged_as_roofline_with_a_wider_range():
    from rlbalance.analysis.planner import VALIDATED_ERROR

    cal = calibration(env_us=1.0, train_ms=100.0, infer_ms=0.01)  # learner-bound: the GPU's speed decides
    p = predict(cal, box(), actor_threads=8)
    assert p["extrapolated"] and any("roofline" in why for why in p["extrapolation"])
    assert any("8-thread machine" in why for why in p["extrapolation"])  # calibrated on 8 threads, box has 16
    lo, hi = p["fps_range"]
    assert lo < p["fps"] * (1 - VALIDATED_ERROR) and hi > p["fps"] * (1 + VALIDATED_ERROR)


def test_power_and_cost_are_modeled_and_positive():
    p = predict(calibration(), box(), 4, speed=SAME)
    assert p["node_power_w"] > 100 and p["fps_per_watt"] > 0 and p["cost_per_billion_frames"] > 0


def test_interp_is_linear_and_extrapolates():
    assert interp({"10": 1.0, "20": 3.0}, 15) == pytest.approx(2.0)
    assert interp({"10": 1.0, "20": 3.0}, 30) == pytest.approx(5.0)


def test_builtin_catalog_reads_and_has_the_dgx_systems():
    cat = load_catalog()
    for name in ("dgx-1", "dgx-2", "dgx-a100", "dgx-h100"):
        assert name in cat and cat[name].gpus >= 8
    assert cat["dgx-a100"].gpu.name == "A100" and cat["dgx-a100"].threads == 256


@pytest.mark.parametrize("entry, message", [
    ({"cores": 8, "threads": 4, "gpus": 0, "cpu_tdp_w": 100, "base_w": 50}, "cores=8, threads=4"),
    ({"cores": 8, "threads": 16, "gpus": 1, "gpu": "Z100", "cpu_tdp_w": 100, "base_w": 50}, "unknown GPU"),
    ({"cores": 8, "threads": 16, "gpus": 0, "base_w": 50}, "missing field 'cpu_tdp_w'"),
    ({"cores": "eight", "threads": 16, "gpus": 0, "cpu_tdp_w": 1, "base_w": 1}, "systems.bad.cores"),
])
def test_bad_catalog_entries_get_clear_errors(entry, message):
    with pytest.raises(ConfigError, match=message):
        parse_catalog({"gpus": {"V100": {"fp32_tflops": 15.7, "tdp_w": 300, "idle_w": 40}},
                       "systems": {"bad": entry}})


def test_bad_catalog_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("systems: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_catalog(f)


@pytest.mark.slow
def test_calibrate_plan_and_validate_cli(tmp_path, capsys):
    import json

    from rlbalance.analysis.sweep import parse_axes, run_sweep
    from rlbalance.cli import main

    cal_path = tmp_path / "cal.json"
    assert main(["calibrate", "--quick", "--out", str(cal_path)]) == 0
    cal = json.loads(cal_path.read_text())
    assert cal["format"] == "rlbalance-calibration-v1"
    assert all(v > 0 for v in cal["env_step_us"].values()) and cal["pipe_round_trip_us"] > 0
    assert cal["workload"]["forward_flops_per_obs"] > 0 and cal["hardware"]["logical_cpus"] >= 1
    assert main(["plan", "--calibration", str(cal_path), "--systems", "dgx-a100,dgx-1", "--out",
                 str(tmp_path / "plan"), "--machine", "mine:cores=4,threads=8,gpus=1,gpu=A100,cpu_tdp_w=65,"
                 "base_w=50,price_per_hour=1.5"]) == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert [p["machine"] for p in plan] == ["dgx-a100", "dgx-1", "mine"]
    assert all(p["prediction"]["source"] == "modeled" and p["prediction"]["fps"] > 0 for p in plan)
    assert plan[2]["prediction"]["cost_per_billion_frames"] > 0
    for p in plan:  # catalog GPUs without a GPU calibration: the roofline, flagged, with a range about the point
        lo, hi = p["prediction"]["fps_range"]
        assert p["prediction"]["extrapolated"] and lo < p["prediction"]["fps"] < hi
    assert "extrapolated past what the calibration measured" in capsys.readouterr().out
    rows = run_sweep("v", {"telemetry": {"warmup_s": 0.5}}, parse_axes(["actors.num_actors=1,2"]), 8000,
                     tmp_path / "s.db", str(tmp_path / "runs"))
    capsys.readouterr()
    assert main(["plan", "--calibration", str(cal_path), "--validate", str(tmp_path / "s.db")]) == 0
    out = capsys.readouterr().out
    assert "median absolute error" in out and len(rows) == 2


@pytest.mark.slow
def test_an_r2d2_workload_is_calibrated_and_planned(tmp_path, capsys):
    """Calibration of an R2D2 workload times its gradient steps on stored sequences (from a replay of one batch)
    and records how many env steps each is due for; the planner predicts from it."""
    import json

    from rlbalance.cli import main

    cal_path = tmp_path / "cal.json"
    assert main(["calibrate", "--quick", "--learner.agent", "r2d2", "--out", str(cal_path)]) == 0
    cal = json.loads(cal_path.read_text())
    w = cal["workload"]
    # the classic-control R2D2 preset: B=32 sequences of 10 burn-in + 20 rows (+1), T=10, replay ratio 4
    assert (w["agent"], w["batch_size"], w["rows_per_sample"]) == ("r2d2", 32, 31)
    assert w["env_steps_per_train_step"] == pytest.approx(32 * 10 / 4)
    assert set(cal["train_step_ms"]) == {"16", "32"} and all(v > 0 for v in cal["train_step_ms"].values())
    assert cal["pipeline"]["points"]["1"]["sps"] > 0
    assert main(["plan", "--calibration", str(cal_path), "--systems", "dgx-a100", "--out", str(tmp_path / "plan")]) == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan[0]["prediction"]["fps"] > 0 and plan[0]["prediction"]["verdict"] in (
        "actor-bound", "learner-bound", "inference-bound")


def test_unknown_system_is_named(tmp_path):
    import json

    from rlbalance.cli import main

    cal = tmp_path / "c.json"
    cal.write_text(json.dumps({"format": "rlbalance-calibration-v1", **calibration()}))
    assert main(["plan", "--calibration", str(cal), "--systems", "dgx-z"]) == 2


def _loop_point(k_cost: float) -> dict:
    """A pipeline-loop point whose actor CPU per step is ``k_cost``; the learner side free, no wait."""
    return {"group_cycle_us": 1.0, "actor_cpu_us_per_step": k_cost, "learner_cpu_us_per_step": 0.01, "sps": 1e9,
            "request_wait_us": 0.0}


def _k_calibration() -> dict:
    """K0 = 10 envs in one group; the loop measured at K = 5, 10, 20 (1 actor): actor CPU per step 10 + 100 / K."""
    cal = calibration()
    cal["workload"].update(envs_per_actor=10, env_groups=1)
    cal["env_step_us"] = {"1": 10.0, "64": 10.0}
    cal["pipeline"] = {"points": {"1": _loop_point(20.0)}, "free_env_step_us": 0.0, "envs_actors": 1,
                       "envs_points": {"5": {**_loop_point(30.0), "free_env_step_us": 0.0},
                                       "20": {**_loop_point(15.0), "free_env_step_us": 0.0}}}
    return cal


def test_envs_per_actor_carry_over_through_the_loop_measured_at_other_counts():
    """The actor's CPU per step measured by the pipeline loop at K = 5, 10, 20 envs per actor is 10 + 100 / K (per-step
    work plus a per-request cost shared by K envs); the env costs 10 us a step at any K and one group waits for
    nothing, so an actor makes 1e6 / (10 + 10 + 100 / K) steps/s. Between and past the measured K the term goes on
    linearly in 1 / K, and past them the prediction says so and spans holding the edge value."""
    cal = _k_calibration()
    big = Machine("this machine", "x", 8, 8, 0, None, 80.0, 100.0)  # the calibrated one
    for k in (5, 10, 20):
        p = predict(cal, big, actor_threads=1, envs_per_actor=k)
        assert p["sps"] == pytest.approx(1e6 / (20 + 100 / k), rel=1e-6)
        assert not any("envs per actor" in why for why in p["extrapolation"])
    p = predict(cal, big, actor_threads=1, envs_per_actor=8)  # 1/8 between 1/10 and 1/5: linear in 1/K
    assert p["sps"] == pytest.approx(1e6 / (20 + 100 / 8), rel=1e-6)
    p = predict(cal, big, actor_threads=1, envs_per_actor=40)
    assert p["sps"] == pytest.approx(1e6 / (20 + 100 / 40), rel=1e-6)
    assert "envs per actor at 40, the pipeline loop measured 5..20" in p["extrapolation"]
    from rlbalance.analysis.planner import VALIDATED_ERROR

    lo, hi = p["fps_range"]  # the edge (the term as at K=20) is the slower way on
    assert lo == pytest.approx(1e6 / 25 * (1 - VALIDATED_ERROR), rel=1e-6) and hi > p["fps"]
    # the shift applies at other actor counts too: a second actor with the same terms doubles it
    cal["pipeline"]["points"]["2"] = _loop_point(20.0)
    assert predict(cal, big, actor_threads=2, envs_per_actor=20)["sps"] == pytest.approx(2e6 / 25, rel=1e-6)


def test_a_calibration_without_the_loop_at_other_counts_says_its_terms_are_held():
    cal = calibration()
    cal["workload"].update(envs_per_actor=10, env_groups=1)
    cal["env_step_us"] = {"1": 10.0, "64": 10.0}
    cal["pipeline"] = {"points": {"1": _loop_point(20.0)}, "free_env_step_us": 0.0}
    big = Machine("big", "x", 64, 64, 0, None, 200.0, 100.0)
    same = predict(cal, big, actor_threads=1)
    other = predict(cal, big, actor_threads=1, envs_per_actor=20, env_groups=2)
    assert other["sps"] == pytest.approx(same["sps"], rel=1e-6)  # one group's turn hides the other's zero wait
    assert any("ran only 10" in why for why in other["extrapolation"])
    assert "env groups at 2, the pipeline loop ran 1" in other["extrapolation"]


def _row(key: str, env_id: str, fps: float, actors: int = 1, k: int = 10) -> dict:
    import json

    return {"key": key, "point_key": key, "sweep": "s", "point": {"actors.num_actors": actors}, "fps": fps,
            "verdict": "actor-bound", "fps_per_watt": None, "actor_cores": actors,
            "config": json.dumps({"env": {"id": env_id}, "actors": {"num_actors": actors, "envs_per_actor": k,
                                                                    "env_groups": 1}})}


def test_validation_predicts_each_point_with_its_own_envs_and_leaves_out_other_workloads():
    from rlbalance.analysis.planner import validate

    cal = _k_calibration()
    v = validate(cal, [_row("a", "synthetic", 1e6 / 40, k=5), _row("b", "synthetic", 1e6 / 25, k=20),
                       _row("c", "CartPole-v1", 1234.0)])
    assert [p["key"] for p in v["points"]] == ["a", "b"] and v["worst_abs_error"] == pytest.approx(0.0, abs=1e-9)
    assert v["skipped"] == [{"key": "c", "sweep": "s",
                             "why": "env.id is 'CartPole-v1', the calibration's is 'synthetic'"}]
    with pytest.raises(ConfigError, match="none of the 1 sweep points ran the calibrated workload"):
        validate(cal, [_row("c", "CartPole-v1", 1234.0)])


def test_calibration_runs_the_loop_at_envs_counts_the_batch_allows():
    """About K/4 and 4K, among the divisors of learner.batch_size for V-trace (an actor buffer holds K unrolls)."""
    from rlbalance import config as C
    from rlbalance.analysis.calibrate import envs_counts

    def counts(k, b, agent="vtrace"):
        return envs_counts(C.build({"actors": {"envs_per_actor": k}, "learner": {"batch_size": b, "agent": agent},
                                    "run": {"preset": "none"}}))

    assert counts(8, 16) == [2, 16]
    assert counts(16, 32) == [4, 32]
    assert counts(1, 16) == [4]
    assert counts(6, 6) == [1]
    assert counts(8, 16, "r2d2") == [2, 16]
    cfg = C.build({"actors": {"envs_per_actor": 8}, "learner": {"batch_size": 64}, "inference": {"max_batch": 16},
                   "run": {"preset": "none"}})
    assert envs_counts(cfg) == [2, 16]  # within inference.max_batch


def test_plan_takes_another_envs_per_actor_and_refuses_options_that_do_not_fit(tmp_path, capsys):
    import json

    from rlbalance.cli import main

    cal = _k_calibration()
    cal["config"] = {"learner": {"batch_size": 20}, "env": {"id": "synthetic"}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "rlbalance-calibration-v1", **cal}))
    assert main(["plan", "--calibration", str(path), "--systems", "dgx-a100", "--envs-per-actor", "20",
                 "--out", str(tmp_path / "plan")]) == 0
    assert "20 envs per actor group" in capsys.readouterr().out
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())[0]["prediction"]["fps"] > 0
    assert main(["plan", "--calibration", str(path), "--envs-per-actor", "3"]) == 2  # 3 does not divide 20
    assert "must be >= 1 and divide the calibrated learner.batch_size=20" in capsys.readouterr().err
    assert main(["plan", "--calibration", str(path), "--sweep", "s"]) == 2
    assert "give --validate too" in capsys.readouterr().err
