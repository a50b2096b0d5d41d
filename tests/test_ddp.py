"""The learner on torch.distributed (issue 17): one learner process per device, gradients all-reduced by DDP.
On CPU with gloo, two ranks each training on half a batch make the same update as one learner on the whole."""

import copy

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from rlbalance import config as C
from rlbalance.envs import EnvSpec
from rlbalance.learner import Learner
from rlbalance.model import build_model

T, N = 5, 8
CFG = dict(batch_size=N, normalize_advantages=False, normalize_observations=True, max_grad_norm=0.5,
           learning_rate=1e-2)


def _spec():
    return EnvSpec((4,), np.dtype(np.float32), 2, 1)


def _batch():
    g = torch.Generator().manual_seed(1)
    return {"obs": 3 + 2 * torch.randn(T + 1, N, 4, generator=g), "action": torch.randint(0, 2, (T + 1, N), generator=g),
            "logits": torch.randn(T + 1, N, 2, generator=g), "reward": torch.randn(T + 1, N, generator=g),
            "done": torch.rand(T + 1, N, generator=g) < 0.2, "truncated": torch.rand(T + 1, N, generator=g) < 0.1,
            "final_obs": torch.randn(T + 1, N, 4, generator=g)}


def _model(seed: int):
    torch.manual_seed(seed)
    return build_model(C.LearnerConfig(**CFG), _spec())


def _rank(rank: int, world: int, port: int, updates: int, out: dict) -> None:
    from rlbalance import distributed

    torch.set_num_threads(1)
    distributed.init(rank, world, torch.device("cpu"), port=port, timeout_s=60)
    try:
        # rank 1 starts from other weights: DDP gives every rank rank 0's at the start
        learner = Learner(_model(seed=rank), C.LearnerConfig(**CFG), torch.device("cpu"), total_steps=10**6,
                          distributed=True)
        cols = torch.arange(N).chunk(world)[rank]  # this rank's unrolls: an equal share of the batch
        shard = {k: v[:, cols] for k, v in _batch().items()}
        losses = [learner.train(shard)["total_loss"] for _ in range(updates)]
        out[rank] = {"state": {k: v.clone() for k, v in learner.model.state_dict().items()}, "losses": losses,
                     "steps": learner.steps}
    finally:
        distributed.close()


def test_two_gloo_ranks_make_the_one_learner_update():
    from rlbalance.distributed import free_port

    updates = 2  # twice: both ranks must start the second update from the same new weights
    one = Learner(copy.deepcopy(_model(seed=0)), C.LearnerConfig(**CFG), torch.device("cpu"), total_steps=10**6)
    batch = _batch()
    one_losses = [one.train(batch)["total_loss"] for _ in range(updates)]

    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        port = free_port()
        procs = [ctx.Process(target=_rank, args=(r, 2, port, updates, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        res = dict(out)
    for r in range(2):
        for name, value in one.model.state_dict().items():  # weights and the observation statistics
            assert torch.allclose(res[r]["state"][name], value, atol=1e-5, rtol=1e-4), (r, name)
        assert res[r]["steps"] == updates * T * N // 2  # each rank counts its own share
    # each rank's loss is over its half; their mean is the whole batch's loss
    assert np.mean([res[r]["losses"][0] for r in range(2)]) == pytest.approx(one_losses[0], rel=1e-4)
    assert torch.equal(res[0]["state"]["obs_norm.mean"], res[1]["state"]["obs_norm.mean"])
