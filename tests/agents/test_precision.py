"""learner.torso_precision=auto's per-machine rule, the learner's once-per-batch image preparation, fused Adam, the
gradient clip without torch's per-call grouping."""

import copy

import pytest
import torch

from rlbalance import config as C
from rlbalance.agents import precision, registry
from rlbalance.agents.nets import (clear_grads, clip_grads, load_optimizer, make_adam, prepared_frames, scaled_input,
                                   select_columns)
from rlbalance.envs.batch import probe_spec


@pytest.fixture
def flags(monkeypatch):
    """Pretend the CPU has the given flags (the rule's caches cleared before and after)."""
    def set_flags(*names):
        monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(names))
        precision.native_bf16.cache_clear()
    yield set_flags
    precision.native_bf16.cache_clear()


@pytest.mark.parametrize("cpu, image, want", [
    (("avx512f", "avx512_bf16"), True, "bf16"),
    (("avx512f", "amx_tile", "amx_bf16"), True, "bf16"),
    (("avx512f", "avx2"), True, "fp32"),  # bfloat16 would be emulated
    (("avx512_bf16",), False, "fp32"),  # an MLP torso stays float32
])
def test_auto_follows_the_cpu_flags(flags, cpu, image, want):
    flags(*cpu)
    assert precision.resolve("auto", "cpu", image) == want
    c = precision.choice("auto", "cpu", image)
    assert c["torso_precision"] == want and c["asked"] == "auto"
    assert c["image_layout"] == ("channels_last" if image else "n/a")
    if image:  # the reason names the flags it went by
        assert ("avx512_bf16" in c["why"]) or ("amx_bf16" in c["why"])


def test_explicit_precision_is_kept(flags):
    flags()
    assert precision.resolve("bf16", "cpu", True) == "bf16"
    flags("amx_bf16")
    assert precision.resolve("fp32", "cpu", True) == "fp32"
    assert "was set" in precision.choice("fp32", "cpu", True)["why"]


def test_config_refuses_an_unknown_precision():
    with pytest.raises(C.ConfigError, match="learner.torso_precision"):
        C.build({"learner": {"torso_precision": "fp16"}})


def test_atari_preset_stays_at_float32_until_bfloat16_is_shown_to_learn_the_same():
    # bench/results/pong-bf16/, pong-bf16-seed1/: bfloat16 took 1.37x and 1.04x float32's frames to +18 (seeds 2, 1)
    assert C.build({"env": {"id": "ALE/Pong-v5"}}).learner.torso_precision == "fp32"
    assert C.build({"env": {"id": "ALE/Pong-v5"}, "learner": {"agent": "r2d2"}}).learner.torso_precision == "fp32"
    asked = C.build({"env": {"id": "ALE/Pong-v5"}, "learner": {"torso_precision": "auto"}})
    assert asked.learner.torso_precision == "auto"


@pytest.mark.parametrize("prec", ["fp32", "bf16"])
def test_prepared_frames_are_the_rows_scaled_input_makes(prec):
    g = torch.Generator().manual_seed(0)
    obs = torch.randint(0, 256, (5, 6, 4, 12, 12), dtype=torch.uint8, generator=g)
    cols = torch.tensor([4, 1, 3])
    ready = select_columns(prepared_frames(obs, prec), 1, cols)
    rows = ready.reshape(-1, *ready.shape[2:])
    assert rows.is_contiguous(memory_format=torch.channels_last)  # no reorder left for the torso to make
    want = scaled_input(obs[:, cols].reshape(-1, 4, 12, 12), prec)
    assert rows.dtype == want.dtype == (torch.bfloat16 if prec == "bf16" else torch.float32)
    assert torch.equal(rows, want)
    assert scaled_input(rows, prec).data_ptr() == rows.data_ptr() or prec == "fp32"  # taken as it is


def test_minibatch_loss_unchanged_by_the_prepared_batch():
    """The learner's minibatch (columns selected from the once-prepared batch) gives the loss the raw columns give."""
    cfg = C.build({"env": {"id": "rlbalance/Catch-v0"}, "actors": {"envs_per_actor": 4}, "learner": {"minibatches": 2, "batch_size": 4,
                                                                    "unroll_length": 5}})
    spec = probe_spec(cfg.env)
    torch.manual_seed(0)
    learner = registry.make_learner(registry.build_model(cfg.learner, spec), cfg, spec, torch.device("cpu"))
    t1, n = 6, 4
    b = {"obs": torch.randint(0, 256, (t1, n, *spec.obs_shape), dtype=torch.uint8),
         "action": torch.randint(0, spec.num_actions, (t1, n)), "logits": torch.randn(t1, n, spec.num_actions),
         "reward": torch.randn(t1, n), "done": torch.zeros(t1, n, dtype=torch.bool),
         "truncated": torch.zeros(t1, n, dtype=torch.bool),
         "final_obs": torch.zeros(t1, n, *spec.obs_shape, dtype=torch.uint8)}
    cols = torch.tensor([2, 0])
    raw = {k: v[:, cols] for k, v in b.items()}
    prepared = {**b, "obs": prepared_frames(b["obs"], "fp32")}
    mb = learner._columns(prepared, cols, targets_needed=True)
    assert "final_obs" not in mb  # no time limit in these columns: the large tensor is not copied
    want, _, _ = learner.loss(raw)
    got, _, _ = learner.loss(mb)
    assert torch.allclose(got, want, atol=1e-6)


def test_fused_adam_takes_the_plain_adam_step_and_its_checkpoint():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 3), torch.nn.Linear(8, 3)
    b.load_state_dict(a.state_dict())
    plain = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5)
    x = torch.randn(16, 8)
    a(x).square().mean().backward()
    plain.step()
    fused = make_adam(b.parameters(), 1e-2, 1e-5, torch.device("cpu"))
    assert fused.defaults["fused"]
    b(x).square().mean().backward()
    fused.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    # a checkpoint written by the plain Adam (runs before fused Adam) resumes in the fused one, still fused
    load_optimizer(fused, copy.deepcopy(plain.state_dict()))
    assert fused.param_groups[0]["fused"]
    for m in (a, b):
        m.zero_grad()
        m(x).square().mean().backward()
    plain.step()
    fused.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


@pytest.mark.parametrize("scale", [0.01, 3.0])  # under the bound (left as is) and over it (scaled down)
def test_clip_grads_is_torchs_clip(scale):
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(x) for x in (torch.randn(5, 3), torch.randn(7), torch.ones(2))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for ps in (ours, theirs):
        (scale * sum((p[:4] ** 2).sum() for p in ps[:2])).backward()  # the third has no gradient
    want = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    got = clip_grads(ours, 0.5)
    assert torch.allclose(got, want)
    assert ours[2].grad is None
    assert all(torch.allclose(a.grad, b.grad) for a, b in zip(ours[:2], theirs[:2]))
    after = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ours[:2]]))
    assert torch.isclose(after, torch.clamp(want, max=0.5), rtol=1e-4)  # scaled down to the bound only when over it
    clear_grads(ours)
    assert all(p.grad is None for p in ours)
