"""Telemetry: verdict scenarios on real runs, power figures marked measured/modeled, readers faked."""

import json
import time

import pytest

from rlbalance.runtime.train import train
from rlbalance.telemetry.hardware import HardwareSampler, PowerModel
from rlbalance.telemetry.verdict import decide


def _scenario(cfg_factory, name, **sections):
    base = {"run": {"total_steps": 10**9, "max_seconds": 12.0, "name": name},
            "telemetry": {"tensorboard": False, "warmup_s": 3.0, "hardware_interval_s": 0.5}}
    from rlbalance import config as C

    s = train(cfg_factory(**C.merge(base, sections)))
    tel = json.load(open(f"{s['run_dir']}/telemetry.json"))
    return s, tel


@pytest.mark.slow
def test_verdict_actor_bound_slow_env_tiny_model(cfg_factory):
    s, tel = _scenario(cfg_factory, "actor-bound",
                       env={"id": "synthetic", "synthetic_step_us": 400.0, "synthetic_obs_shape": [8]},
                       actors={"num_actors": 1}, learner={"hidden_sizes": [8]})
    assert s["verdict"] == "actor-bound", tel["verdict"]
    assert tel["verdict"]["figures"]["learner_wait_data"] > 0.5
    report = open(f"{s['run_dir']}/report.html").read()
    assert "Bottleneck: actor-bound" in report and tel["verdict"]["evidence"] in report


@pytest.mark.slow
def test_verdict_learner_bound_free_env_large_model(cfg_factory):
    s, tel = _scenario(cfg_factory, "learner-bound",
                       env={"id": "synthetic", "synthetic_step_us": 0.0, "synthetic_obs_shape": [64]},
                       actors={"num_actors": 1}, learner={"hidden_sizes": [1024, 1024, 1024], "batch_size": 64})
    assert s["verdict"] == "learner-bound", tel["verdict"]
    assert tel["verdict"]["figures"]["learner_wait_data"] < 0.15
    assert "Bottleneck: learner-bound" in open(f"{s['run_dir']}/report.html").read()


@pytest.mark.slow
def test_verdict_inference_bound_capped_batch_many_envs(cfg_factory):
    s, tel = _scenario(cfg_factory, "inference-bound",
                       env={"id": "synthetic", "synthetic_step_us": 0.0, "synthetic_obs_shape": [16]},
                       actors={"num_actors": 2, "env_groups": 4, "envs_per_actor": 8},
                       inference={"max_batch": 8}, learner={"hidden_sizes": [32], "batch_size": 256})
    assert s["verdict"] == "inference-bound", tel["verdict"]
    assert tel["verdict"]["figures"]["actor_wait_action"] > 0.5
    assert max(int(k) for k in tel["inference_batch_sizes"]) == 8  # the cap held
    assert "Bottleneck: inference-bound" in open(f"{s['run_dir']}/report.html").read()


def test_power_is_modeled_without_gpu_or_rapl(cfg_factory):
    s, tel = _scenario(cfg_factory, "power", run={"max_seconds": 4.0})
    hw = tel["hardware"]
    for key in ("cpu_power_w", "gpu_power_w", "node_power_w", "energy_cpu_j", "energy_gpu_j", "base_power_w"):
        assert hw[key]["source"] == ("measured" if key.startswith(("cpu", "energy_cpu")) and _rapl() else "modeled")
    assert s["outcome"] == "completed" and s["node_power_w"]["source"] == "modeled"
    assert s["fps_per_watt"]["source"] == "modeled"
    assert hw["role_cpu_cores"]["actor"] > 0.05  # the actors' own CPU time was sampled
    assert tel["latency_ms"]["actor_request_latency_ms"] > 0 and tel["latency_ms"]["learner_update_ms"] > 0
    assert tel["transport"]["bytes_per_step"] > 16 and tel["transport"]["bytes_per_s"] > 0


def _rapl():
    from rlbalance.telemetry.hardware import read_rapl_energy_uj

    return read_rapl_energy_uj() is not None


class FakeNvml:
    def __init__(self):
        self.calls = 0

    def read(self):
        self.calls += 1
        return [{"util": 0.5, "mem_used": 1 << 30, "power_w": 250.0, "energy_j": 1000.0 + self.calls}]

    def close(self):
        pass


def test_gpu_and_rapl_paths_with_faked_readers():
    counter = {"v": 0}

    def fake_rapl():
        counter["v"] += 5_000_000  # 5 J per read
        return {"package-0": counter["v"]}

    sampler = HardwareSampler(interval_s=3600, model=PowerModel(), rapl_reader=fake_rapl,
                              nvml_factory=FakeNvml)
    sampler.start()
    for _ in range(3):
        time.sleep(0.02)  # 5 J in 20 ms is 250 W: a physical figure (the sampler drops impossible ones)
        sampler.sample()
    sampler.stop()
    summary = sampler.summary()
    assert summary["cpu_power_w"]["source"] == "measured" and summary["cpu_power_w"]["value"] > 0
    assert summary["gpu_power_w"] == {"value": 250.0, "source": "measured"}
    assert summary["gpu_util_mean"] == {"value": 0.5, "source": "measured"}
    assert summary["energy_cpu_j"]["value"] == pytest.approx(15.0)
    assert summary["node_power_w"]["source"] == "measured"


def test_decide_rules_on_synthetic_shares():
    env = decide({"learner": {"wait_data": 0.8}, "actor": {"env_step": 0.9, "wait_action": 0.05},
                  "inference": {"batch_wait": 0.9}}, central=True)
    assert env["verdict"] == "actor-bound" and "add actor cores" in env["advice"]
    lrn = decide({"learner": {"wait_data": 0.02}, "actor": {"wait_buffer": 0.6}}, central=True)
    assert lrn["verdict"] == "learner-bound"
    inf = decide({"learner": {"wait_data": 0.7}, "actor": {"wait_action": 0.8},
                  "inference": {"batch_wait": 0.1, "forward": 0.7, "h2d": 0.05, "d2h": 0.05}}, central=True)
    assert inf["verdict"] == "inference-bound"
    xfer = decide({"learner": {"wait_data": 0.7}, "actor": {"wait_action": 0.8},
                   "inference": {"batch_wait": 0.1, "forward": 0.2, "h2d": 0.4, "d2h": 0.2}}, central=True)
    assert xfer["verdict"] == "transfer-bound"


def test_sustained_rate_leaves_out_process_start_up(tmp_path):
    # actors take a while to start; the sustained rate counts from the first update, not logger creation
    from rlbalance.telemetry.metrics import MetricsLogger

    log = MetricsLogger(tmp_path, tensorboard=False, frames_per_step=1, warmup_s=60.0)
    assert log.sustained_sps(0) == 0.0  # nothing trained yet
    time.sleep(1.0)  # start-up
    log.note_steps(1000)  # first update
    time.sleep(0.2)
    log.note_steps(2000)
    sps = log.sustained_sps(2000)
    assert 2000 < sps < 5001, sps  # 1000 steps over ~0.2 s; with start-up counted it would be ~1,700
    log.close()


def test_rapl_wrap_uses_the_counters_own_range_and_impossible_figures_are_dropped():
    from rlbalance.telemetry.hardware import rapl_delta_uj

    wrap = 262_143_328_850  # a real max_energy_range_uj (about 2^38 uJ)
    assert rapl_delta_uj(1_000_000, wrap - 4_000_000, wrap) == 5_000_000  # 5 J across the wrap
    assert rapl_delta_uj(1_000_000, 2_000_000, None) is None  # backwards with no known range: untrusted
    readings = iter([wrap - 2_000_000, 3_000_000, 3_000_000 + 10**12, 3_000_000 + 10**12 + 5_000_000])
    sampler = HardwareSampler(interval_s=3600, model=PowerModel(), rapl_reader=lambda: {"pkg": next(readings)},
                              rapl_range_reader=lambda: {"pkg": wrap}, nvml_factory=lambda: None)
    sampler.start()
    samples = []
    for _ in range(3):
        time.sleep(0.02)
        samples.append(sampler.sample())
    sampler.stop()
    assert samples[0].cpu_power_source == "measured" and 0 < samples[0].cpu_power_w < 1000 * 1e6  # wrap handled
    assert samples[1].cpu_power_source == "modeled"  # a million joules in a moment: dropped, not "measured"
    assert samples[2].cpu_power_source == "measured"
    assert sampler.summary()["rapl_samples_dropped"] == 1


def _wandb_records(path):
    """The records of an offline W&B run file: W&B's append-only log (a 7-byte file header, then 32 KiB
    blocks of records with 7-byte headers: checksum, length, kind FULL/FIRST/MIDDLE/LAST), each a protobuf."""
    import struct

    buf = open(path, "rb").read()
    assert buf[:4] == b":W&B", buf[:7]
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(buf):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", buf[pos:pos + 7])
        data = buf[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield data
        elif kind == 2:
            parts = data
        elif kind == 3:
            parts += data
        elif kind == 4:
            yield parts + data


def test_wandb_offline_run_holds_the_tensorboard_scalars(cfg_factory, monkeypatch):
    """telemetry.wandb=offline: the W&B run (read back from its file) has every TensorBoard scalar, at the same
    steps with the same values, plus the config and the summary."""
    import glob
    import json
    import os

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from wandb.proto import wandb_internal_pb2 as pb

    monkeypatch.setenv("WANDB_SILENT", "true")
    s = train(cfg_factory(run={"total_steps": 20_000, "name": "wb"}, telemetry={"wandb": "offline", "report": False}))
    files = glob.glob(os.path.join(s["run_dir"], "wandb", "offline-run-*", "*.wandb"))
    assert len(files) == 1, files

    def read():
        history, config, summary = [], {}, {}
        for data in _wandb_records(files[0]):
            rec = pb.Record()
            rec.ParseFromString(data)
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
            elif kind == "run":
                config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
            elif kind == "summary":
                summary.update({i.key: json.loads(i.value_json) for i in rec.summary.update})
        return history, config, summary

    # W&B's service process may still be writing the file's last records when finish() has returned (seen: the final
    # history row missing one run in five): read it until the final row and the summary are in, 30 s at most
    deadline = time.monotonic() + 30.0
    while True:
        try:
            history, config, summary = read()
        except Exception:  # noqa: BLE001 - a record cut short by the writer: read again
            history, config, summary = [], {}, {}
        if (history and history[-1]["_step"] == s["steps"] and summary.get("outcome")) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(history) >= 5
    tb = EventAccumulator(os.path.join(s["run_dir"], "tb"))
    tb.Reload()
    tags = set(tb.Tags()["scalars"])
    logged = {k for row in history for k in row if not k.startswith("_")}
    assert logged == tags, logged ^ tags
    for row in history:
        for k in (k for k in row if not k.startswith("_")):
            first = next(e for e in tb.Scalars(k) if e.step == row["_step"])
            assert abs(first.value - row[k]) <= 1e-5 * max(1.0, abs(row[k])), (k, row["_step"], first.value, row[k])
    assert history[-1]["_step"] == s["steps"]
    config = {k: v.get("value", v) if isinstance(v, dict) and "value" in v else v for k, v in config.items()}
    assert config["learner"]["batch_size"] == 16 and config["run"]["name"] == "wb", config.get("run")
    assert summary["outcome"] == "completed" and summary["steps"] == s["steps"]


def test_wandb_without_the_package_names_the_fix(monkeypatch):
    import importlib.util

    import pytest

    from rlbalance import config as C

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(C.ConfigError, match=r"telemetry.wandb.*pip install wandb"):
        C.build({"telemetry": {"wandb": "offline"}})
    with pytest.raises(C.ConfigError, match="telemetry.wandb"):
        C.build({"telemetry": {"wandb": "yes"}})


def test_advice_fits_the_machine():
    """No 'put inference on a GPU' on a machine without one; the next thing that would help there instead."""
    learner_bound = {"learner": {"wait_data": 0.02}, "actor": {"wait_buffer": 0.6}}
    inference_bound = {"learner": {"wait_data": 0.7}, "actor": {"wait_action": 0.8},
                       "inference": {"batch_wait": 0.1, "forward": 0.7, "h2d": 0.05, "d2h": 0.05}}
    cpu_only = {"gpus": 0, "learner_device": "cpu"}
    gpu_unused = {"gpus": 2, "learner_device": "cpu"}
    gpu_used = {"gpus": 1, "learner_device": "cuda:0"}
    for shares in (learner_bound, inference_bound):
        a = decide(shares, central=True, machine=cpu_only)["advice"]
        assert "no GPU" in a and "learner.device=cuda" not in a, a
        assert "learner.device=cuda" in decide(shares, central=True, machine=gpu_unused)["advice"]
        assert "learner.device=cuda" not in decide(shares, central=True, machine=gpu_used)["advice"]
    assert "inference.mode=actor" in decide(inference_bound, central=True, machine=cpu_only)["advice"]
    assert "learner.devices" in decide(learner_bound, central=True, machine=gpu_used)["advice"]
    actor_bound = {"learner": {"wait_data": 0.8}, "actor": {"env_step": 0.9, "wait_action": 0.05},
                   "inference": {"batch_wait": 0.9}}
    saturated = decide(actor_bound, central=True, hardware={"cpu_util_mean": 0.97}, machine=cpu_only)
    assert saturated["verdict"] == "actor-bound" and "every core is busy" in saturated["advice"]
    assert "add actor cores" in decide(actor_bound, central=True, hardware={"cpu_util_mean": 0.4},
                                       machine=cpu_only)["advice"]


def test_a_run_shorter_than_one_actor_report_still_has_every_roles_stage_shares(cfg_factory):
    """Actors report their stage times every second and once more when stopped: a run that ends before the first
    report (and before the warm-up) still has actor, inference and learner shares in its summary."""
    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 20.0}, actors={"num_actors": 2},
                          run={"total_steps": 3000, "name": "short"},
                          telemetry={"tensorboard": False, "warmup_s": 0.2}))
    tel = json.load(open(f"{s['run_dir']}/telemetry.json"))
    assert {"actor", "inference", "learner"} <= set(tel["stage_shares"]), tel["stage_shares"]
    assert tel["stage_shares"]["actor"]["env_step"] > 0


def test_role_shares_with_roles_copies_without_sharing_counters():
    from rlbalance.runtime.role_figures import RoleShares

    warm, whole = RoleShares(), RoleShares()
    whole.add("actor", {"wall_s": 2.0, "seconds": {"env_step": 1.0}, "count": {"env_step": 10}})
    whole.add("learner", {"wall_s": 2.0, "seconds": {"fwd_bwd": 1.5}, "count": {"fwd_bwd": 3}})
    warm.add("learner", {"wall_s": 1.0, "seconds": {"fwd_bwd": 0.9}, "count": {"fwd_bwd": 2}})
    merged = warm.with_roles(whole, {"actor"})
    assert merged.shares() == {"learner": {"fwd_bwd": 0.9}, "actor": {"env_step": 0.5}}
    merged.add("actor", {"wall_s": 2.0, "seconds": {"env_step": 1.0}, "count": {"env_step": 10}})
    assert whole.shares()["actor"] == {"env_step": 0.5}  # the source is untouched


def test_the_progress_bar_ends_on_the_summarys_sustained_fps(cfg_factory, monkeypatch):
    """Issue 48 item 4: while the run goes the bar shows the last window's FPS, labelled so; its last line is the
    sustained FPS that summary.json and the report give, not a last window that may hold the shutdown."""
    from rlbalance.telemetry.metrics import Progress

    bar = Progress(100, True)
    bar.update(50, 1988.4, float("nan"))
    assert bar.bar.tasks[0].fields["info"] == "FPS 1,988 (last window) return n/a"
    bar.finish(100, 11314.2, 21.5)
    assert bar.bar.tasks[0].fields["info"] == "sustained FPS 11,314 return 21.5"
    bar.close()
    shown = []
    monkeypatch.setattr(Progress, "finish", lambda self, steps, fps, ret: shown.append(fps))
    s = train(cfg_factory(run={"total_steps": 6_000, "name": "bar"}, telemetry={"progress": True}))
    assert len(shown) == 1 and shown[0] == pytest.approx(s["fps_sustained"], rel=1e-9) and shown[0] > 0
