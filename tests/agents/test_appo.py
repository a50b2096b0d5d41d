"""The learner's update options against known answers: PPO's clipped surrogate (APPO) against the V-trace
policy gradient on-policy, and epochs x minibatches (V-trace lambda: tests/agents/test_vtrace.py)."""

import copy

import numpy as np
import pytest
import torch

from rlbalance import config as C
from rlbalance.agents.registry import build_model
from rlbalance.agents.vtrace.learner import Learner
from rlbalance.envs.batch import EnvSpec


def _batch(t=5, n=8, seed=1, on_policy_model=None):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(t + 1, n, 4, generator=g)
    logits = torch.randn(t + 1, n, 2, generator=g)
    if on_policy_model is not None:
        with torch.no_grad():
            logits = on_policy_model(obs.reshape(-1, 4))[0].reshape(t + 1, n, 2)
    return {"obs": obs, "action": torch.randint(0, 2, (t + 1, n), generator=g), "logits": logits,
            "reward": torch.randn(t + 1, n, generator=g), "done": torch.rand(t + 1, n, generator=g) < 0.2,
            "truncated": torch.zeros(t + 1, n, dtype=torch.bool), "final_obs": torch.zeros(t + 1, n, 4),
            "version": torch.zeros(2, dtype=torch.int64)}


def test_clipped_surrogate_on_policy_makes_the_vtrace_policy_gradient_step():
    """On-policy (behaviour logits = the model's), PPO's ratio is 1 and its gradient is the V-trace policy
    gradient's, so one APPO step equals one V-trace step."""
    spec = EnvSpec((4,), np.dtype(np.float32), 2, 1)
    torch.manual_seed(0)
    model = build_model(C.LearnerConfig(), spec)
    batch = _batch(on_policy_model=model)
    learners = []
    for clip in (0.0, 0.2):
        cfg = C.LearnerConfig(ppo_clip=clip, batch_size=8, normalize_advantages=True, lr_schedule="constant")
        learners.append(Learner(copy.deepcopy(model), cfg, torch.device("cpu"), total_steps=10**6))
    stats = [lr.train(batch) for lr in learners]
    assert stats[1]["clip_fraction"] == 0.0
    assert _same_weights(*learners)


def test_epochs_and_minibatches_take_that_many_optimizer_steps_on_whole_unrolls():
    spec = EnvSpec((4,), np.dtype(np.float32), 2, 1)
    model = build_model(C.LearnerConfig(), spec)
    cfg = C.LearnerConfig(ppo_clip=0.1, epochs=3, minibatches=4, batch_size=8, lr_schedule="constant")
    learner = Learner(copy.deepcopy(model), cfg, torch.device("cpu"), total_steps=10**6)
    calls = []
    real_step = learner.optimizer.step

    def step(*a, **k):
        calls.append(1)
        return real_step(*a, **k)

    learner.optimizer.step = step
    seen = []
    real_loss = learner.loss

    def loss(b, model=None, targets=None):
        seen.append((b["action"].shape, targets is None))
        return real_loss(b, model, targets)

    learner.loss = loss
    stats = learner.train(_batch(n=8))
    assert len(calls) == 12  # 3 epochs x 4 minibatches
    assert all(shape == (6, 2) for shape, _ in seen)  # whole unrolls (T+1 rows), 8 / 4 columns each
    assert [fresh for _, fresh in seen] == [True] * 4 + [False] * 8  # targets from the first pass, then reused
    assert 0.0 <= stats["clip_fraction"] <= 1.0
    assert learner.steps == 5 * 8  # env steps count once, however many passes


def _step_pair(**cfgs):
    """One train() call per named config on copies of one model and one off-policy batch (behaviour logits
    drawn at random, so the importance weights are far from 1); the learners after it."""
    spec = EnvSpec((4,), np.dtype(np.float32), 2, 1)
    torch.manual_seed(0)
    model = build_model(C.LearnerConfig(), spec)
    batch = _batch(seed=3)
    out = {}
    for name, kw in cfgs.items():
        cfg = C.LearnerConfig(batch_size=8, lr_schedule="constant", **kw)
        learner = Learner(copy.deepcopy(model), cfg, torch.device("cpu"), total_steps=10**6)
        out[name] = (learner, learner.train(batch))
    return out


def _same_weights(a, b):
    return all(torch.allclose(p1, p2, atol=1e-6) for p1, p2 in zip(a.model.parameters(), b.model.parameters()))


def test_proximal_clip_reference_starts_at_ratio_one_and_makes_the_vtrace_step_off_policy():
    """Decoupled PPO: in one pass the ratio to the proximal policy (this pass's own) is 1, and the weight
    min(clip_pg_rho, pi/mu) turns the surrogate's gradient into the V-trace policy gradient's, even off-policy.
    Clipping around the behaviour policy instead does not (its ratios start far from 1)."""
    plain = dict(normalize_advantages=False)
    r = _step_pair(vtrace=dict(ppo_clip=0.0, **plain),
                   proximal=dict(ppo_clip=0.1, ppo_clip_reference="proximal", **plain),
                   behaviour=dict(ppo_clip=0.1, ppo_clip_reference="behaviour", **plain))
    assert r["proximal"][1]["clip_fraction"] == 0.0 and r["behaviour"][1]["clip_fraction"] > 0.2
    assert _same_weights(r["proximal"][0], r["vtrace"][0])
    assert not _same_weights(r["behaviour"][0], r["vtrace"][0])


def test_proximal_clip_reference_clips_later_epochs_around_the_first_pass():
    """With several passes the proximal reference is the first pass's policy: its clip fraction counts only
    what the update itself moved (0 in the first pass), far below the behaviour reference's on lagged data."""
    r = _step_pair(proximal=dict(ppo_clip=0.1, ppo_clip_reference="proximal", epochs=3, minibatches=2,
                                 learning_rate=1e-2),
                   behaviour=dict(ppo_clip=0.1, ppo_clip_reference="behaviour", epochs=3, minibatches=2,
                                  learning_rate=1e-2))
    prox, beh = r["proximal"][1]["clip_fraction"], r["behaviour"][1]["clip_fraction"]
    assert prox < beh and beh > 0.2, (prox, beh)
    assert not _same_weights(r["proximal"][0], r["behaviour"][0])


def test_clip_reference_is_checked():
    with pytest.raises(C.ConfigError, match="learner.ppo_clip_reference"):
        C.LearnerConfig(ppo_clip_reference="target")


def test_steps_split_takes_single_steps_from_across_the_batch():
    """learner.minibatch_split='steps': the targets of the whole batch from one pass without gradients, then every
    pass over single steps that together cover the batch's T x N steps once, each part spanning many unrolls."""
    spec = EnvSpec((4,), np.dtype(np.float32), 2, 1)
    torch.manual_seed(0)
    model = build_model(C.LearnerConfig(), spec)
    cfg = C.LearnerConfig(ppo_clip=0.1, epochs=3, minibatches=4, batch_size=8, lr_schedule="constant",
                          minibatch_split="steps")
    learner = Learner(copy.deepcopy(model), cfg, torch.device("cpu"), total_steps=10**6)
    batch = _batch(n=8)
    where = {tuple(batch["obs"][s, j].tolist()): (s, j) for s in range(5) for j in range(8)}  # obs -> (time, unroll)
    seen = []
    real_loss = learner.loss

    def loss(b, model=None, targets=None):
        seen.append((tuple(b["action"].shape), targets is None, torch.is_grad_enabled(),
                     [where.get(tuple(o.tolist())) for o in b["obs"][0]]))
        return real_loss(b, model, targets)

    learner.loss = loss
    stats = learner.train(batch)
    assert seen[0][:3] == ((6, 8), True, False)  # the whole batch's targets, no gradients
    later = seen[1:]
    assert [s[:3] for s in later] == [((1, 10), False, True)] * 12  # 3 passes x 4 parts of 40 / 4 steps
    for p in range(3):  # each pass covers every step of the batch exactly once
        steps = [s for *_, part in later[4 * p:4 * p + 4] for s in part]
        assert sorted(steps) == sorted(where.values())
    assert max(len({j for _, j in part}) for *_, part in later) > 2  # a part of whole unrolls holds 2 unrolls
    assert max(len({s for s, _ in part}) for *_, part in later) > 1
    assert learner.steps == 5 * 8 and 0.0 <= stats["clip_fraction"] <= 1.0


def test_steps_split_loss_on_shuffled_steps_equals_the_loss_on_the_unrolls():
    """The loss on single steps (no bootstrap row, the targets passed along) over all of a batch's steps in a
    shuffled order equals the loss on the unrolls they came from: each step meets its own targets."""
    from rlbalance.agents.nets import select_steps

    spec = EnvSpec((4,), np.dtype(np.float32), 2, 1)
    torch.manual_seed(0)
    model = build_model(C.LearnerConfig(), spec)
    cfg = C.LearnerConfig(ppo_clip=0.1, batch_size=8, lr_schedule="constant")
    learner = Learner(model, cfg, torch.device("cpu"), total_steps=10**6)
    b = _batch(seed=5)
    with torch.no_grad():
        total, stats, targets = learner.loss(b)
        idx = torch.randperm(5 * 8, generator=torch.Generator().manual_seed(2))
        flat = {k: select_steps(b[k], 5, idx) for k in ("obs", "action", "logits", "reward")}
        flat_targets = tuple(x.reshape(-1)[idx].unsqueeze(0) for x in targets)
        total2, stats2, _ = learner.loss(flat, targets=flat_targets)
        wrong = tuple(x.reshape(-1).unsqueeze(0) for x in targets)  # the targets in the unshuffled order
        total3, _, _ = learner.loss(flat, targets=wrong)
    for k in ("pg_loss", "baseline_loss", "entropy"):
        assert torch.allclose(stats[k], stats2[k], atol=1e-6), k
    assert torch.allclose(total, total2, atol=1e-6)
    assert not torch.allclose(total, total3, atol=1e-4)


def test_select_steps_keeps_channels_last_frames():
    from rlbalance.agents.nets import prepared_frames, select_steps

    x = torch.randint(0, 256, (4, 3, 4, 6, 5), dtype=torch.uint8)
    frames = prepared_frames(x, "fp32")
    idx = torch.tensor([7, 0, 4])
    out = select_steps(frames, 3, idx)
    assert out.shape == (1, 3, 4, 6, 5) and out.stride(2) == 1
    want = x[:3].reshape(9, 4, 6, 5)[idx].float() / 255.0
    assert torch.allclose(out[0], want)


def test_steps_split_is_checked():
    with pytest.raises(C.ConfigError, match="learner.minibatch_split"):
        C.LearnerConfig(minibatch_split="rows")
    with pytest.raises(C.ConfigError, match="feed-forward"):
        C.LearnerConfig(minibatch_split="steps", epochs=4, core="lstm")
