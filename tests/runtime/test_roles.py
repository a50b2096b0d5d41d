"""The roles' interfaces (issue 45, item 1): one fault ledger for local and Ray actors, the actor sets and sessions
behind their protocols, and the one learner loop every runner runs."""

import threading

import pytest

from rlbalance import config as C
from rlbalance.core.timing import StageTimer
from rlbalance.runtime.roles import ActorFailure, ActorSet, FaultLedger, RunSession, learn


def test_one_fault_ledger_counts_restarts_and_lost_time_within_the_limit():
    ledger = FaultLedger(max_restarts=2)
    ledger.fault(0, "exited with code -9", last_alive=100.0)
    ledger.fault(0, "silent for 31.0 s (hung)", last_alive=150.0)  # failed again before it was back: still down
    assert ledger.restarts == 2 and ledger.down == {0: 100.0}
    ledger.back(0, at=130.0)
    assert ledger.lost_seconds == 30.0 and not ledger.down
    with pytest.raises(ActorFailure, match=r"actor 1 exited with code 1, and the 2 restarts allowed "
                                           r"\(actors.max_restarts\) are used up"):
        ledger.fault(1, "exited with code 1", last_alive=200.0)
    assert [e["actor"] for e in ledger.events] == [0, 0]
    with pytest.raises(ActorFailure, match="^Ray actor 3 "):  # the same rule and words on Ray
        FaultLedger(0, what="Ray actor").fault(3, "lost its node", last_alive=0.0)


def test_the_actor_sets_and_sessions_are_what_the_runners_take():
    from rlbalance.runtime.actor_pool import ActorPool
    from rlbalance.runtime.ddp_runner import RankSession
    from rlbalance.runtime.local import SerialActors

    cfg = C.build({})
    assert isinstance(ActorPool(None, cfg, None), ActorSet)
    assert isinstance(SerialActors([], None, 3), ActorSet)
    rank = RankSession(cfg, 1, learner=None, model_lock=threading.Lock())
    assert isinstance(rank, RunSession)
    from rlbalance.runtime import ray_runner, session

    for cls in (ray_runner.RayActors,):
        missing = [m for m in ("take_full", "give_back", "poll", "report", "stop") if not hasattr(cls, m)]
        assert not missing, (cls, missing)
    missing = [m for m in ("done", "after_update", "role_snapshot", "attach_actors", "node_figures", "watch_process",
                           "set_scalars", "add_batch_sizes", "note_info") if not hasattr(session.Session, m)]
    assert not missing



class _Actors:
    def __init__(self, log, fail_at=None):
        self.log, self.fail_at, self.ledger = log, fail_at, FaultLedger(0)
        self.taken = 0

    def take_full(self, nb):
        self.taken += 1
        if self.taken == self.fail_at:
            raise RuntimeError("an actor set failed")
        self.log.append(("take_full", nb))
        return list(range(nb))

    def give_back(self, idx):
        self.log.append(("give_back", tuple(idx)))

    def poll(self):
        self.log.append(("poll",))

    def report(self, session, final=False):
        self.log.append(("report", final))

    def stop(self):
        self.log.append(("stop",))


class _Session:
    def __init__(self, log, updates):
        self.log, self.left = log, updates
        self.timer, self.gpu_timer = StageTimer(), StageTimer()

    def done(self):
        self.left -= 1
        return self.left < 0

    def after_update(self, batch, stats):
        self.log.append(("after_update", stats["n"]))


class _Learner:
    steps = updates = 0

    def __init__(self, log):
        self.log = log

    def train(self, batch):
        self.updates += 1
        self.log.append(("train", batch["idx"]))
        return {"n": self.updates}


class _Buffers:
    def gather(self, idx):
        return {"idx": tuple(idx)}


def test_the_one_learner_loop_in_order_and_its_actors_stopped_however_it_ends():
    log: list = []
    session = _Session(log, updates=2)
    learn(session, _Learner(log), _Actors(log), _Buffers(), 3, publish=lambda: log.append(("publish",)))
    one = [("take_full", 3), ("give_back", (0, 1, 2)), ("train", (0, 1, 2)), ("publish",), ("poll",),
           ("report", False)]
    assert log == [*one, ("after_update", 1), *one, ("after_update", 2), ("stop",), ("report", True)]
    assert session.timer.snapshot()["seconds"].keys() >= {"wait_data", "weight_publish"}
    log.clear()
    with pytest.raises(RuntimeError, match="an actor set failed"):
        learn(_Session(log, updates=5), _Learner(log), _Actors(log, fail_at=2), _Buffers(), 1)
    assert log[-2:] == [("stop",), ("report", True)]  # a failure still stops the actors and drains their figures
