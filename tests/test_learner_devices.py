"""Several learner devices (learner.devices, data parallel) and the sweep axis over them (issue 4)."""

import numpy as np
import pytest
import torch


def test_data_parallel_learner_matches_one_device():
    """learner.devices=2 (two CPU replicas, half the batch each) makes the same update as one device:
    the loss is a mean over equal shards, so the averaged gradients are the full batch's."""
    import copy

    from rlbalance import config as C
    from rlbalance.envs import EnvSpec
    from rlbalance.learner import Learner
    from rlbalance.model import build_model

    spec = EnvSpec((4,), np.dtype(np.float32), 2, 1)
    torch.manual_seed(0)
    model = build_model(C.LearnerConfig(), spec)
    t, n = 5, 8
    g = torch.Generator().manual_seed(1)
    batch = {"obs": torch.randn(t + 1, n, 4, generator=g), "action": torch.randint(0, 2, (t + 1, n), generator=g),
             "logits": torch.randn(t + 1, n, 2, generator=g), "reward": torch.randn(t + 1, n, generator=g),
             "done": torch.rand(t + 1, n, generator=g) < 0.2, "truncated": torch.rand(t + 1, n, generator=g) < 0.1,
             "final_obs": torch.randn(t + 1, n, 4, generator=g), "version": torch.zeros(2, dtype=torch.int64)}
    learners = []
    for devices in (1, 2):
        cfg = C.LearnerConfig(devices=devices, batch_size=8, normalize_advantages=False, max_grad_norm=1e9)
        learners.append(Learner(copy.deepcopy(model), cfg, torch.device("cpu"), total_steps=10**6))
    for _ in range(2):  # twice: the replica must have taken the first update's weights
        stats = [lr.train(batch) for lr in learners]
        assert stats[0]["total_loss"] == pytest.approx(stats[1]["total_loss"], rel=1e-5)
    for p1, p2 in zip(learners[0].model.parameters(), learners[1].model.parameters()):
        assert torch.allclose(p1, p2, atol=1e-6)
    for p1, p2 in zip(learners[1].model.parameters(), learners[1].replicas[0].parameters()):
        assert torch.equal(p1, p2)
    assert learners[1].steps == learners[0].steps == 2 * t * n


def test_learner_devices_must_divide_the_batch():
    from rlbalance import config as C

    with pytest.raises(C.ConfigError, match="learner.devices"):
        C.build({"learner": {"devices": 3, "batch_size": 16}})


def test_sweep_over_learner_devices(tmp_path):
    """A sweep axis over learner.devices: each point records its accelerators, and R divides by them."""
    from rlbalance import config as C
    from rlbalance.ratio import analyse
    from rlbalance.sweep import parse_axes, run_sweep

    base = {"env": {"id": "synthetic", "synthetic_step_us": 20.0}, "run": {"mode": "serial"},
            "telemetry": {"warmup_s": 0.5, "hardware_interval_s": 0.5}}
    rows = run_sweep("devices", base, parse_axes(["learner.devices=1,2"]), 8_000, tmp_path / "s.db",
                     str(tmp_path / "runs"))
    assert sorted(r["accelerators"] for r in rows) == [1, 2]
    a = analyse(rows)
    by_acc = {p["accelerators"]: p for p in a["points"]}
    assert by_acc[2]["R"] == by_acc[1]["R"] / 2
    assert all(p["fps"] > 0 for p in a["points"])
    assert C.from_dict(__import__("json").loads(by_acc[2]["config"])).learner.devices == 2
