"""A run that balances itself (issue 46): the controller against a modeled plant (no wall clock: a fake clock and a
throughput model with seeded noise), the actor pool growing and shrinking under a learner without losing an unroll,
and a real run with run.balance=auto that records what it did and leaves a config the next run takes."""

import json
import multiprocessing as mp
import random
import time

import pytest
import torch

from rlbalance import config as C
from rlbalance.core.errors import ConfigError
from rlbalance.runtime.balance import Balancer
from rlbalance.telemetry.balance_model import Layout, Window, neighbours, predict


class Plant:
    """A machine as the model sees it: ``cores`` shared by actors (``per_actor`` steps/s each, ``actor_cost`` core-s
    a step) and a learner (``learner`` steps/s at one thread, ``learner_cost`` core-s a step), throughput the least
    of the three ceilings, times seeded noise; the inference wait helps by ``wait_gain``."""

    def __init__(self, cores=2, per_actor=4000.0, learner=11000.0, actor_cost=1e-4, learner_cost=6e-5,
                 thread_gain=0.8, wait_gain=1.0, noise=0.05, seed=0):
        self.cores, self.per_actor, self.learner, self.actor_cost = cores, per_actor, learner, actor_cost
        self.learner_cost, self.thread_gain, self.wait_gain, self.noise = learner_cost, thread_gain, wait_gain, noise
        self.rng = random.Random(seed)
        self.layout_ = Layout(1, 1, 0.0)
        self.fault_count = 0
        self.t = 0.0
        self.steps = 0
        self.actor_cpu = self.learner_cpu = 0.0
        self.applied: list[Layout] = []

    def true_sps(self, lay: Layout) -> float:
        learner = self.learner * (self.thread_gain if lay.threads > 1 else 1.0) * (self.wait_gain if lay.wait_ms else 1)
        cpu = self.cores / (self.actor_cost + self.learner_cost)
        return min(lay.actors * self.per_actor, learner, cpu)

    # Knobs
    def layout(self):
        return self.layout_

    def apply(self, to):
        self.layout_ = to
        self.applied.append(to)

    def settled(self):
        return True

    def cpu_seconds(self):
        return self.actor_cpu, self.learner_cpu

    def faults(self):
        return self.fault_count

    def run(self, bal: Balancer, seconds: float, dt: float = 0.5):
        """Updates every ``dt`` seconds of fake time for ``seconds``."""
        end = self.t + seconds
        while self.t < end:
            sps = self.true_sps(self.layout_) * (1 + self.rng.uniform(-self.noise, self.noise))
            n = int(sps * dt)
            self.t += dt
            self.steps += n
            self.actor_cpu += n * self.actor_cost
            self.learner_cpu += n * self.learner_cost
            lay = self.layout_
            held_back = max(0.0, 1 - sps / (lay.actors * self.per_actor))
            bal.feed("actor", {"wall_s": dt * lay.actors, "seconds": {"wait_buffer": held_back * dt * lay.actors}})
            learner_cap = self.learner * (self.thread_gain if lay.threads > 1 else 1.0)
            bal.step(self.steps, max(0.0, 1 - sps / learner_cap) * dt)


def make(plant, start, **kw):
    plant.layout_ = start
    opts = dict(cores=plant.cores, window_s=5.0, max_actors=8, max_threads=2, clock=lambda: plant.t)
    opts.update(kw)
    return Balancer(plant, **opts)


def test_from_one_actor_it_adds_actors_to_the_best_layout_and_holds_it():
    plant = Plant(cores=8, per_actor=3000.0)  # actor-bound at 1..3 actors, learner-bound (11,000) from 4
    bal = make(plant, Layout(1, 1, 0.0))
    plant.run(bal, 600)
    best = max((Layout(n, h, w) for n in range(1, 9) for h in (1, 2) for w in (0.0, 1.0)), key=plant.true_sps)
    final = plant.layout_
    assert plant.true_sps(final) >= 0.95 * plant.true_sps(best), (final, best)
    assert bal.phase == "hold"
    kept = [m for m in bal.moves if m.get("outcome") == "kept"]
    assert kept and all(m["measured_sps"] > m["base_sps"] * (1 + m["margin"]) for m in kept)
    # every move names what moved, the prediction, its evidence and what was measured
    for m in (m for m in bal.moves if m.get("event") == "move"):
        assert m["moved"] and m["predicted_sps"] > 0 and m["why"] and m["outcome"] in ("kept", "undone")
    s = bal.summary()
    assert s["start"] == {"actors": 1, "threads": 1, "wait_ms": 0.0, "envs": 0} and s["final"] == final.to_dict()
    assert s["gain"] > 1.0  # 1 actor at 3,000 against the learner's 11,000
    json.dumps(s, allow_nan=False)  # strict JSON


def test_the_ga3c_baseline_moves_one_knob_a_step_every_period_and_moves_back_when_throughput_fell():
    """run.balance=ga3c (issue 46 item 6): GA3C's method on the same plant and knobs: a random one-step move every
    20 s, kept when the period after it measured at least the period before, else moved back; its summary and moves
    take our controller's form (the report and balanced.json read both)."""
    from rlbalance.runtime.balance_ga3c import GA3CBalancer

    plant = Plant(cores=8, per_actor=3000.0, noise=0.0)
    plant.layout_ = Layout(1, 1, 0.0)
    bal = GA3CBalancer(plant, max_actors=8, max_threads=2, knob_names=("actors", "threads"), seed=3,
                       clock=lambda: plant.t)
    plant.run(bal, 20 * 40)
    moves = [m for m in bal.moves if m.get("event") == "move"]
    assert len(moves) >= 25  # about one every other period (a move undone is measured a period before the next)
    for m in moves:
        frm, to = Layout(**m["from"]), Layout(**m["to"])
        assert len(m["moved"]) == 1 and abs(getattr(to, m["moved"][0]) - getattr(frm, m["moved"][0])) == 1
        assert m["outcome"] == ("kept" if m["measured_sps"] >= m["base_sps"] else "undone")
        assert m["judged_t"] - m["t"] == pytest.approx(20.0, abs=0.6)
    undone = [m for m in moves if m["outcome"] == "undone"]
    pairs = set(zip(plant.applied, plant.applied[1:]))
    assert undone and all((Layout(**m["to"]), Layout(**m["from"])) in pairs for m in undone)  # moved straight back
    # without noise the climb reaches the learner's ceiling (4+ actors, one thread: 11,000) and never leaves it
    assert plant.true_sps(plant.layout_) == pytest.approx(11000.0)
    s = bal.summary()
    assert s["method"] == "ga3c" and s["start"]["actors"] == 1 and s["final"] == plant.layout_.to_dict()
    json.dumps(s, allow_nan=False)
    from rlbalance.telemetry.balance_report import balance_rows

    rows = balance_rows(s)
    assert any("GA3C: one count moved" in text for _, text in rows)


def test_a_move_that_measures_worse_is_undone_and_not_tried_again():
    plant = Plant(cores=8, per_actor=20000.0, thread_gain=0.6)  # learner-bound: a second learner thread costs 40%
    bal = make(plant, Layout(2, 1, 0.0), knob_names=("threads",))
    plant.run(bal, 400)
    undone = [m for m in bal.moves if m.get("outcome") == "undone"]
    assert len(undone) == 1 and undone[0]["moved"] == ["threads"] and undone[0]["gain"] < 0
    assert plant.layout_ == Layout(2, 1, 0.0) and bal.phase == "hold"
    assert plant.applied == [Layout(2, 2, 0.0), Layout(2, 1, 0.0)]  # tried once, undone once: no oscillation


def test_a_gain_inside_the_noise_is_not_kept():
    plant = Plant(per_actor=20000.0, wait_gain=1.02, noise=0.25, seed=3)  # +2% under +-25% noise
    bal = make(plant, Layout(2, 1, 0.0), knob_names=("wait",))
    plant.run(bal, 300)
    assert not [m for m in bal.moves if m.get("outcome") == "kept"]
    assert plant.layout_ == Layout(2, 1, 0.0)


def test_it_rechecks_when_the_workload_drifts_or_an_actor_fails():
    plant = Plant(cores=8, per_actor=3000.0)
    bal = make(plant, Layout(4, 1, 0.0))
    plant.run(bal, 200)
    assert bal.phase == "hold"
    plant.per_actor = 1000.0  # episodes got costlier: a third of the throughput at the held layout
    plant.run(bal, 300)
    assert any(m.get("event") == "recheck" and "moved" in m["why"] for m in bal.moves)
    assert plant.layout_.actors > 4  # and it went on to add actors
    plant.fault_count += 1
    plant.run(bal, 10)
    assert bal.moves[-1]["event"] == "recheck" or any(m["why"] == "an actor failed" for m in bal.moves
                                                      if m.get("event") == "recheck")


def test_the_model_names_its_bound_and_uses_what_it_measured():
    w = Window(sps=6000.0, layout=Layout(2, 1, 0.0), cores=4, actor_cpu=0.5, learner_cpu=0.3, learner_wait=0.5,
               actor_wait=0.0)
    more = predict(w, Layout(3, 1, 0.0))
    assert more.bound == "actors" and more.sps == pytest.approx(9000.0)  # 3 x 3,000, under the learner's 12,000
    assert predict(w, Layout(5, 1, 0.0)).bound == "learner"
    assert predict(w, Layout(3, 1, 0.0), measured={Layout(3, 1, 0.0): 5000.0}).sps == 5000.0
    assert Layout(2, 1, 0.0) not in neighbours(Layout(2, 1, 0.0), 8, 2, ("actors", "threads", "wait"))
    assert all(1 <= n.actors <= 8 for n in neighbours(Layout(1, 1, 0.0), 8, 2, ("actors",)))


def test_balance_refuses_what_it_cannot_move_before_anything_starts():
    with pytest.raises(ConfigError, match="run.balance.*run.mode=parallel"):
        C.build({"run": {"balance": "auto", "mode": "serial"}})
    with pytest.raises(ConfigError, match="run.balance='sometimes'"):
        C.build({"run": {"balance": "sometimes"}})
    with pytest.raises(ConfigError, match="run.balance.*learner.devices"):
        C.build({"run": {"balance": "auto"}, "learner": {"devices": 2}})


def _pool(cfg, active, ledger=None):
    from rlbalance.agents import registry
    from rlbalance.envs.batch import probe_spec
    from rlbalance.runtime.actor import ActorShared
    from rlbalance.runtime.actor_pool import ActorPool
    from rlbalance.runtime.buffers import RolloutBuffers, SharedWeights

    spec = probe_spec(cfg.env)
    model = registry.build_model(cfg.learner, spec)
    sh = ActorShared(
        buffers=RolloutBuffers.allocate(cfg.num_buffers, cfg.learner.unroll_length, cfg.actors.envs_per_actor, spec,
                                        shared=True, record=registry.step_record(cfg, spec)),
        stop=torch.zeros(1, dtype=torch.uint8).share_memory_(),
        heartbeat=torch.zeros(cfg.actors.num_actors, dtype=torch.float64).share_memory_(),
        slots=None, weights=SharedWeights.allocate(model))
    sh.weights.publish(model, 0)
    return ActorPool(mp.get_context("spawn"), cfg, sh, active=active, ledger=ledger), sh


def test_a_pool_built_anew_keeps_the_runs_fault_ledger():
    """Actors rebuilt at other envs per actor (a balanced run's controlled restart) count their restarts and lost
    actor-seconds with the pools before them, within one actors.max_restarts; an actor still down when its pool
    was drained stops losing time there."""
    import time

    from rlbalance.runtime.roles import ActorFailure, FaultLedger

    cfg = C.build({"env": {"id": "CartPole-v1"}, "inference": {"mode": "actor"},
                   "actors": {"num_actors": 2, "envs_per_actor": 4, "max_restarts": 2}})
    ledger = FaultLedger(cfg.actors.max_restarts)
    ledger.fault(0, "exited with code -9", last_alive=time.monotonic() - 1.0)
    pool, _ = _pool(cfg, 2, ledger)
    assert pool.ledger is ledger and ledger.restarts == 1 and not ledger.down and ledger.lost_seconds >= 1.0
    lost = ledger.pending_lost_seconds()
    assert ledger.pending_lost_seconds() == lost  # (no actor counted down any more)
    pool.ledger.fault(1, "exited with code -9", last_alive=time.monotonic())
    with pytest.raises(ActorFailure, match="the 2 restarts allowed"):
        pool.ledger.fault(0, "exited with code -9", last_alive=time.monotonic())
    assert _pool(cfg, 2)[0].ledger.restarts == 0  # (a run's first pool starts its own)


def test_the_pool_grows_and_shrinks_under_the_learner_without_losing_an_unroll(tmp_path):
    cfg = C.build({"env": {"id": "CartPole-v1"}, "inference": {"mode": "actor"},
                   "actors": {"num_actors": 3, "envs_per_actor": 4, "env_groups": 2},
                   "learner": {"batch_size": 8, "unroll_length": 8},
                   "run": {"out_dir": str(tmp_path)}, "telemetry": {"progress": False}})
    pool, sh = _pool(cfg, active=1)
    seen: dict[int, list[int]] = {}  # env group -> unroll numbers the learner got, in order
    total = cfg.num_buffers

    def batches(n):
        for _ in range(n):
            idx = pool.take_full(cfg.buffers_per_batch)
            for j in idx:
                seen.setdefault(int(sh.buffers.client[j]), []).append(int(sh.buffers.unroll[j]))
            # every buffer is somewhere: full, at an actor, spare, or with the learner (idx)
            assert len(pool.full) + len(pool.holder) + len(pool.spare) + len(idx) == total
            pool.give_back(idx)
            pool.poll()

    try:
        pool.start_all()
        batches(4)
        assert pool.running() == 1 and len(pool.pids()) == 1
        pool.resize(3)
        batches(20)
        deadline = time.monotonic() + 120
        while not pool.settled() and time.monotonic() < deadline:
            batches(1)
        assert pool.settled() and pool.running() == 3
        retired = pool.procs[1:]
        pool.resize(1)
        while pool.retiring and time.monotonic() < deadline:
            batches(1)
        assert not pool.retiring and pool.running() == 1
        assert all(p.exitcode == 0 for p in retired)  # they finished and left; nothing was killed
        batches(4)
        pool.resize(2)  # a slot used before runs again, as a new incarnation
        batches(10)
    finally:
        pool.stop()
    assert pool.ledger.restarts == 0
    for client, unrolls in seen.items():
        # each env group's unrolls reach the learner in order and none is missing, retired groups' last ones too
        by_life: dict[int, list[int]] = {}
        for u in unrolls:
            by_life.setdefault(u >> 40, []).append(u & ((1 << 40) - 1))
        for life, us in by_life.items():
            assert us == list(range(len(us))), (client, life, us)
    assert {c // 2 for c in seen} == {0, 1, 2}  # every slot's groups trained


def test_an_auto_run_records_its_moves_and_leaves_a_config_the_next_run_takes(cfg_factory, tmp_path):
    from rlbalance.runtime.train import train

    s = train(cfg_factory(run={"balance": "auto", "balance_window_s": 1.0, "max_seconds": 45,
                               "total_steps": 10_000_000, "name": "auto"},
                          actors={"num_actors": 1, "envs_per_actor": 1}))  # one env per request: far from best
    b = s["balance"]
    assert b["start"]["actors"] == 1 and set(b["final"]) == {"actors", "threads", "wait_ms", "envs"}
    assert s["actor_restarts"] == 0  # moving actors is not a fault
    moves = [m for m in b["moves"] if m.get("event") == "move"]
    assert moves, b["moves"]  # 45 s of 1 s windows: at least one move measured (a K move restarts the actors)
    for m in moves:
        assert m["outcome"] in ("kept", "undone") and len(m["trial_windows"]) >= 2
    recs = [json.loads(line) for line in open(f"{s['run_dir']}/metrics.jsonl")]
    assert all("balance/actors" in r for r in recs[1:])
    logged = [m for r in recs for m in r.get("balance_moves", [])]
    assert [m for m in logged if m.get("event") == "move"] == moves
    found = C.read_file(b["config_file"])
    cfg = C.build(found)
    assert cfg.actors.num_actors == b["final"]["actors"] and cfg.learner.torch_threads == b["final"]["threads"]
    assert cfg.run.name == "" and cfg.env.id == "CartPole-v1"


class ScriptedBalancer:
    """Moves the layout on a script (update number -> layout change), to test the runner's moves themselves."""

    script = {}

    def __init__(self, knobs, cores, window_s, **kw):
        self.knobs, self.updates, self.moves, self.seen = knobs, 0, [], []

    def feed(self, role, snap):
        pass

    def step(self, steps, waited_s):
        self.updates += 1
        self.seen.append((self.updates, self.knobs.layout(), self.knobs.pool.cfg.actors.envs_per_actor))
        change = self.script.get(self.updates)
        if change:
            import dataclasses

            self.knobs.apply(dataclasses.replace(self.knobs.layout(), **change))

    def restart_wanted(self):
        return self.knobs.restart_pending()

    def scalars(self):
        return {}

    def summary(self):
        return {"final": self.knobs.layout().to_dict(), "seen": [(u, lay.to_dict(), k) for u, lay, k in self.seen]}


@pytest.mark.parametrize("agent", ["vtrace", "r2d2"])
def test_the_runner_moves_actors_and_envs_per_actor_live_without_losing_an_unroll(cfg_factory, monkeypatch, agent):
    """Envs per actor 4 -> 8 (the actors drained and built anew), an actor more, back to 4: the run goes on, every
    unroll made is trained on, and for R2D2 the replayed Q still equals the Q the actions were chosen by."""
    from rlbalance.runtime import balance_ga3c
    from rlbalance.runtime.train import train

    ScriptedBalancer.script = {5: {"envs": 8}, 12: {"actors": 2}, 20: {"envs": 4}}
    monkeypatch.setattr(balance_ga3c, "controller", lambda cfg, knobs, cores, **kw: ScriptedBalancer(knobs, cores, 0))
    extra = {"learner": {"agent": "r2d2", "learning_rate": 1e-12}} if agent == "r2d2" else {}
    s = train(cfg_factory(**C.merge({"run": {"balance": "auto", "total_steps": 30_000, "name": f"scripted-{agent}"},
                                     "actors": {"num_actors": 1, "envs_per_actor": 4},
                                     "learner": {"batch_size": 16},
                                     "telemetry": {"tensorboard": False, "report": False}}, extra)))
    assert s["outcome"] == "completed" and s["steps"] >= 30_000 and s["actor_restarts"] == 0
    seen = s["balance"]["seen"]
    by_update = {u: (lay, k) for u, lay, k in seen}
    assert by_update[4][1] == 4 and by_update[6][1] == 8  # built anew at 8 envs per actor
    assert by_update[6][0]["envs"] == 8 and by_update[13][0]["actors"] == 2
    assert seen[-1][2] == 4 and seen[-1][1]["actors"] == 2  # back at 4, with two actors
    found = C.read_file(s["balance"].get("config_file") or f"{s['run_dir']}/balanced.json")
    assert found["actors"]["envs_per_actor"] == 4 and found["actors"]["num_actors"] == 2
    if agent == "r2d2":
        recs = [json.loads(line) for line in open(f"{s['run_dir']}/metrics.jsonl")]
        gaps = [r["loss/q_gap"] for r in recs if "loss/q_gap" in r]
        assert gaps and max(gaps) < 1e-4, gaps


def test_on_the_planners_model_of_other_machines_it_settles_at_the_best_actor_count():
    """The controller against the planner's model of catalog machines (Pong's committed calibration, +-10% noise):
    from one actor it reaches the modeled best on a small cloud machine and on an 8-GPU DGX."""
    from pathlib import Path

    from rlbalance.analysis.catalog import load_catalog
    from rlbalance.bench.balance_sim import simulate

    cal = json.loads((Path(__file__).parents[2] / "bench/results/planner/calibration-pong.json").read_text())
    machines = load_catalog()
    for name in ("aws-g5.xlarge", "dgx-1"):
        r = simulate(cal, machines[name], noise=0.1, seed=1, minutes=10)
        assert r["of_best"] >= 0.95, r
        assert r["phase"] == "hold" and r["settle_windows"] <= 60, r
        assert r["windows_to_95"] is not None and r["windows_to_95"] <= r["settle_windows"]
        assert 0 < r["ga3c_of_best"] <= 1.0 and 1 <= r["ga3c_actors"] <= r["most_actors"]  # the anchor, same model


def test_from_far_off_a_move_may_reach_the_most_actors_allowed():
    assert Layout(80, 1, 0.0) in neighbours(Layout(64, 1, 0.0), 80, 1, ("actors",))
    assert Layout(96, 1, 0.0) in neighbours(Layout(64, 1, 0.0), 200, 1, ("actors",))


def test_the_bench_reads_when_a_run_came_within_5_percent_of_the_best_and_stayed():
    from rlbalance.bench.balance import time_to

    curve = [(t, 100.0 if t < 40 else 200.0) for t in range(0, 120, 5)] + [(125, None)]
    assert time_to(curve, 190.0) == 40 and time_to(curve, 150.0) == 40  # where it got there, not before
    assert time_to(curve, 250.0) is None
    noisy = [(t, 200.0) for t in range(0, 120, 5)]
    noisy[3] = (15, 120.0)  # one low record does not hold it back, one high one does not count alone
    assert time_to(noisy, 190.0) == 0
    spike = [(t, 300.0 if t == 10 else 100.0) for t in range(0, 120, 5)]
    assert time_to(spike, 190.0) is None
    assert time_to([(0, 300.0), (10, 300.0)], 100.0) is None  # no whole 30 s span measured
