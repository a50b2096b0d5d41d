"""Actors on a Ray cluster (issue 6): a two-node cluster on 127.0.0.1 started by the tests themselves
(Ray's own test utility, ray.cluster_utils.Cluster: a head and a second node, each a raylet process).

Must show: CartPole learns with actors spread on both nodes as in the trainer's CartPole test (held, like
its parallel runner, to the learning shape: low at first, then up by a large factor); killing the second
node mid-run, training goes on, its actors are restarted where resources allow, and nothing written
before is lost.
"""

import json
import os
import statistics
import threading
import time

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback: 127.0.0.1 stays 127.0.0.1
ray = pytest.importorskip("ray", reason="Ray is part of the test extra: pip install -e '.[test]'")
from ray.cluster_utils import Cluster  # noqa: E402

from rlbalance import config as C  # noqa: E402
from rlbalance.bench.seeds import learning_curve  # noqa: E402
from rlbalance.runtime.train import train  # noqa: E402

NODE = {"num_cpus": 2, "object_store_memory": 100 * 2**20, "node_ip_address": "127.0.0.1"}


@pytest.fixture
def cluster():
    """A head node and a second node, 2 CPUs each; the learner (this process) uses no Ray resources."""
    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    second = c.add_node(**NODE)
    c.wait_for_nodes()
    c.second = second
    yield c
    ray.shutdown()
    c.shutdown()


def _records(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def _nodes_of(summary_or_tel):
    return {p["node_id"] for p in summary_or_tel["ray"]["placement"] if "node_id" in p}


@pytest.mark.slow
def test_cartpole_learns_with_actors_on_two_nodes(cluster, cfg_factory):
    cfg = cfg_factory(ray={"address": cluster.address}, actors={"num_actors": 2},
                      run={"total_steps": 500_000, "name": "ray-learn"}, telemetry={"tensorboard": False})
    s = train(cfg)
    tel = json.load(open(os.path.join(s["run_dir"], "telemetry.json")))
    assert s["actors_on"] == "ray" and s["outcome"] == "completed"
    assert len(_nodes_of(tel)) == 2, tel["ray"]["placement"]  # spread over head and second node
    assert len(s["nodes"]) == 2 and all(n["actor_cpu_seconds"] > 0 for n in s["nodes"].values())
    curve = learning_curve(s["run_dir"])
    assert s["steps"] <= 500_000 + cfg.learner.batch_size * cfg.learner.unroll_length  # rounded up to one batch
    # Held to the standard of the trainer's parallel runner (tests/learning/test_learning.py): its timing makes every
    # run differ, so the 400 bar belongs to the deterministic serial runner; a parallel or Ray run must show
    # the learning shape. (A best-400 assertion here failed once in a clean-clone run: best 371.7; the
    # single-pass defaults of the time reached 475 on 7 of 8 seeds, bench/results/seeds-vtrace/.)
    early = [r for st, r in curve if st <= 5_000] or [curve[0][1]]  # the first few updates: near random play
    late = [r for st, r in curve if st >= 400_000]
    assert max(early) < 100 and statistics.mean(late) > 3 * statistics.mean(early), curve
    assert max(r for _, r in curve) >= 200, curve  # random play scores about 22
    recs = _records(s["run_dir"])
    assert any(any(k.startswith("ray/node1_") for k in r) for r in recs), "per-node CPU figures for both nodes"
    page = open(os.path.join(s["run_dir"], "report.html")).read()
    assert "Ray nodes: CPU utilisation" in page and page.count("Ray node 127.0.0.1/") == 2


@pytest.mark.slow
def test_second_node_killed_mid_run_training_goes_on(cluster, cfg_factory):
    cfg = cfg_factory(env={"id": "synthetic", "synthetic_step_us": 20.0},
                      ray={"address": cluster.address}, actors={"num_actors": 2, "heartbeat_timeout_s": 20.0},
                      run={"total_steps": 200_000, "name": "ray-kill", "checkpoint_interval_s": 1.0},
                      telemetry={"tensorboard": False})
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("summary", train(cfg)))
    thread.start()
    run_dir = os.path.join(cfg.run.out_dir, "ray-kill")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and thread.is_alive():  # wait until it trains on both nodes
        if os.path.exists(metrics) and any(r["steps"] >= 40_000 for r in _records(run_dir)):
            break
        time.sleep(0.2)
    before = open(metrics).read().splitlines()
    ckpts_before = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
    assert before and thread.is_alive()
    cluster.remove_node(cluster.second)  # kill the second node's raylet and its actor
    thread.join(timeout=300)
    assert not thread.is_alive(), "training did not finish after the node was killed"
    s = out["summary"]
    assert s["outcome"] == "completed" and s["steps"] >= 200_000
    assert s["actor_restarts"] >= 1 and s["actor_seconds_lost"] > 0, s["actor_faults"]
    tel = json.load(open(os.path.join(run_dir, "telemetry.json")))
    placement = tel["ray"]["placement"]
    assert len(_nodes_of(tel)) == 1 and any(p.get("restarted") for p in placement), placement  # moved to the head
    after = open(metrics).read().splitlines()
    assert after[: len(before)] == before  # nothing written before the kill is lost
    steps = [json.loads(line)["steps"] for line in after]
    assert steps == sorted(steps) and steps[-1] >= 200_000
    assert len(after) > len(before)  # and it went on logging
    assert ckpts_before, "a checkpoint was written before the kill"
    ckpts_after = os.listdir(os.path.join(run_dir, "checkpoints"))
    assert ckpts_after, "checkpoints are still there"


@pytest.mark.slow
def test_two_learner_ranks_each_serve_their_own_ray_actors(cluster, cfg_factory):
    """learner.devices=2 with Ray actors: each learner process joins the cluster and serves its own share of the
    actors (one each); both ranks train, the summary has each rank's figures, and the per-node CPU figures count
    every rank's actors under the run's actor numbers."""
    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 20.0}, ray={"address": cluster.address},
                          learner={"devices": 2}, actors={"num_actors": 2},
                          run={"total_steps": 40_000, "name": "ray-ddp"},
                          telemetry={"tensorboard": False, "warmup_s": 0.5}))
    assert s["outcome"] == "completed" and s["steps"] >= 40_000
    tel = json.load(open(os.path.join(s["run_dir"], "telemetry.json")))
    assert tel["data_parallel"]["kind"] == "ddp" and tel["data_parallel"]["ranks"] == 2
    assert set(tel["learner_ranks"]) == {"0", "1"}
    for rank in tel["learner_ranks"].values():
        assert rank["inference_batch_mean"] > 0 and rank["stage_shares"]["actor"]["env_step"] > 0
    actors = sorted(a for n in s["nodes"].values() for a in n["actors"])
    assert actors == [0, 1], s["nodes"]  # rank 1's actor 0 is the run's actor 1


HANG_TIMEOUT = 8.0  # short enough for a quick test, long enough that load rarely makes a healthy actor look hung


def _fault_actors(fault: str) -> dict:
    """A hang is seen only when the run is still going heartbeat_timeout_s after it: with a second actor the run
    could finish first on a quiet machine (a clean-clone CI run did: no fault recorded). With one actor the run
    cannot go on until the hung actor is found and restarted."""
    if fault.startswith("hang"):
        return {"num_actors": 1, "heartbeat_timeout_s": HANG_TIMEOUT}
    return {"heartbeat_timeout_s": 30.0}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill:300", "hang:300"])
def test_ray_actor_fault_is_restarted(cfg_factory, fault):
    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 20.0, "synthetic_fault": fault},
                          ray={"address": "local", "num_cpus": 2},
                          actors=_fault_actors(fault),
                          run={"total_steps": 60_000, "name": fault.split(":")[0]}, telemetry={"tensorboard": False}))
    assert s["outcome"] == "completed" and s["steps"] >= 60_000
    # the fault is armed in actor 0's first life: that actor is restarted, for the right reason
    mine = [f for f in s["actor_faults"] if f["actor"] == 0]
    assert mine and ("hung" in mine[0]["reason"]) == fault.startswith("hang"), s["actor_faults"]
    if fault.startswith("kill"):
        assert s["actor_restarts"] == 1, s["actor_faults"]
    else:
        # A healthy Ray actor can also go silent past a short timeout on a 2-core machine loaded by other work
        # (seen once: 15.6 s, with a Pong run beside the suite); those restarts are the mechanism working.
        assert all("hung" in f["reason"] for f in s["actor_faults"]), s["actor_faults"]
    assert s["actor_seconds_lost"] > (HANG_TIMEOUT if fault.startswith("hang") else 0.0)


@pytest.mark.slow
def test_actor_side_inference_on_ray(cfg_factory):
    s = train(cfg_factory(inference={"mode": "actor"}, ray={"address": "local", "num_cpus": 2},
                          actors={"env_groups": 1, "buffers_per_actor": 2},
                          run={"total_steps": 40_000, "name": "ray-actor"}, telemetry={"tensorboard": False}))
    assert s["outcome"] == "completed" and s["steps"] >= 40_000 and s["episodes"] > 50
    assert s["policy_lag_mean"] is None or s["policy_lag_mean"] < 10
    tel = json.load(open(os.path.join(s["run_dir"], "telemetry.json")))
    assert tel["stage_shares"]["actor"]["env_step"] > 0 and "weight_sync" in tel["stage_shares"]["actor"]


@pytest.mark.slow
def test_custom_env_from_the_cli_with_ray_actors(tmp_path, monkeypatch):
    """The README's own-env route with Ray actors: `--env.id custom_envs:Target-v0` (Box actions, so the
    continuous preset and a Gaussian policy); the Ray workers import the module from where the learner found it."""
    from rlbalance.cli import main

    monkeypatch.delenv("PYTHONPATH", raising=False)  # the workers must not find it by inheritance alone
    rc = main(["train", "--env.id", "custom_envs:Target-v0", "--ray.address", "local", "--ray.num_cpus", "2",
               "--run.total_steps", "30000", "--run.out_dir", str(tmp_path), "--run.name", "ray-target",
               "--telemetry.progress", "false", "--telemetry.tensorboard", "false", "--telemetry.report", "false"])
    assert rc == 0
    s = json.load(open(tmp_path / "ray-target" / "summary.json"))
    assert s["outcome"] == "completed" and s["actors_on"] == "ray" and s["preset"] == "continuous"
    assert s["episode_return_last100"] >= -7.0, s  # a random policy scores about -13


def test_ray_config_errors_name_the_field():
    with pytest.raises(C.ConfigError, match="run.mode"):
        C.build({"ray": {"address": "local"}, "run": {"mode": "serial"}})
    with pytest.raises(C.ConfigError, match="actors.cpu_affinity"):
        C.build({"ray": {"address": "local"}, "actors": {"cpu_affinity": "0"}})
    with pytest.raises(C.ConfigError, match="ray.address"):
        C.build({"ray": {"address": "nonsense"}})
    with pytest.raises(C.ConfigError, match="ray.cpus_per_actor"):
        C.build({"ray": {"cpus_per_actor": 0}})


@pytest.mark.slow
def test_sweep_and_ratio_with_ray_actors(tmp_path):
    # A Ray point's actor cores are the CPUs its actors reserve: 2 actors x 0.5 and x 1 CPU -> R = 1 and 2
    from rlbalance.analysis.ratio import analyse
    from rlbalance.analysis.sweep import parse_axes, run_sweep

    base = {"env": {"id": "synthetic", "synthetic_step_us": 20.0}, "ray": {"address": "local", "num_cpus": 2},
            "actors": {"num_actors": 2}, "telemetry": {"warmup_s": 0.5, "log_interval_s": 0.5}}
    rows = run_sweep("ray", base, parse_axes(["ray.cpus_per_actor=0.5,1"]), steps=30_000, db_path=tmp_path / "r.db",
                     out_dir=str(tmp_path / "runs"))
    assert sorted(r["actor_cores"] for r in rows) == [1, 2]
    assert all(r["fps"] > 0 and r["verdict"] for r in rows), rows
    for r in rows:
        s = json.load(open(os.path.join(r["run_dir"], "summary.json")))
        assert s["actors_on"] == "ray" and sorted(i for n in s["nodes"].values() for i in n["actors"]) == [0, 1]
    a = analyse(rows)
    assert [p["R"] for p in a["curve"]] == [1, 2] and a["best_R_swept"] in (1, 2)


class _ScriptedRay:
    """Moves the Ray actor count on a script (update -> actors), to test the Ray runner's moves themselves; notes
    each running actor's node while the most run."""

    script: dict = {}
    nodes_at = 0

    def __init__(self, knobs, cores, window_s, **kw):
        self.knobs, self.cores, self.updates, self.moves, self.seen, self.nodes = knobs, cores, 0, [], [], {}

    def feed(self, role, snap):
        pass

    def step(self, steps, waited_s):
        import dataclasses

        self.updates += 1
        a = self.knobs.actors
        self.seen.append((self.updates, a.active, [i for i, h in enumerate(a.handles) if h is not None]))
        if self.updates == self.nodes_at:
            self.nodes = {i: ray.get(h.info.remote(), timeout=60)["node_id"] for i, h in enumerate(a.handles)
                          if h is not None}
        if self.updates in self.script:
            self.knobs.apply(dataclasses.replace(self.knobs.layout(), actors=self.script[self.updates]))

    def restart_wanted(self):
        return False

    def scalars(self):
        return {}

    def summary(self):
        return {"final": self.knobs.layout().to_dict()}


@pytest.mark.slow
def test_a_balanced_ray_run_adds_actors_on_the_second_node_and_retires_them_losing_no_unroll(cluster, cfg_factory,
                                                                                            monkeypatch):
    """Issue 46 item 4 on Ray: from one Ray actor, two more started live (the second node takes some: the head has
    2 CPUs), then two retired; each retired actor's env groups finish the unroll they began, every unroll made is
    trained on (each env group's unroll numbers follow on within each of its lives), no actor fault, and the
    retired actors' Ray processes are ended."""
    from rlbalance.runtime import balance_ga3c
    from rlbalance.runtime.buffers import RolloutBuffers

    _ScriptedRay.script, _ScriptedRay.nodes_at = {4: 3, 14: 1}, 12
    made: list[_ScriptedRay] = []
    monkeypatch.setattr(balance_ga3c, "controller",
                        lambda cfg, knobs, cores, **kw: made.append(_ScriptedRay(knobs, cores, 0)) or made[-1])
    seen: dict[int, list[int]] = {}
    gather = RolloutBuffers.gather

    def recording(self, idx):
        out = gather(self, idx)
        for c, u in zip(out["client"].tolist(), out["unroll"].tolist()):
            seen.setdefault(c, []).append(u)
        return out

    monkeypatch.setattr(RolloutBuffers, "gather", recording)
    s = train(cfg_factory(ray={"address": cluster.address}, actors={"num_actors": 1, "envs_per_actor": 4},
                          learner={"batch_size": 8}, run={"balance": "auto", "balance_max_actors": 3,
                                                          "total_steps": 40_000, "name": "ray-balance"},
                          telemetry={"tensorboard": False, "report": False}))
    assert s["outcome"] == "completed" and s["actor_restarts"] == 0 and s["actors_on"] == "ray"
    (b,) = made
    by_update = {u: (n, running) for u, n, running in b.seen}
    assert by_update[3] == (1, [0]) and by_update[5][0] == 3 and by_update[13] == (3, [0, 1, 2])
    assert b.seen[-1][1] == 1 and b.seen[-1][2] == [0]  # the two retired actors ended
    assert sorted(b.nodes) == [0, 1, 2] and len(set(b.nodes.values())) == 2, b.nodes  # both nodes
    assert b.cores == 4  # (the cluster's CPUs: what the balancer's CPU ceiling counts)
    assert set(seen) >= {0, 1, 2}  # every actor's env group delivered (one group per actor)
    for client, unrolls in seen.items():
        for life in {u >> 40 for u in unrolls}:
            mine = sorted(u for u in unrolls if u >> 40 == life)
            assert mine == list(range(mine[0], mine[0] + len(mine))), (client, life, mine)


@pytest.mark.slow
def test_an_actor_bound_ray_run_with_balance_auto_adds_ray_actors(cluster, cfg_factory):
    """The real controller on Ray: one Ray actor stepping an env that costs 300 us a step keeps the learner waiting
    (actor-bound), so the first move it measures adds actors; the moves are in metrics.jsonl and the summary, and
    balanced.json names the Ray actor count found."""
    s = train(cfg_factory(env={"id": "synthetic", "synthetic_step_us": 300.0}, ray={"address": cluster.address},
                          actors={"num_actors": 1, "envs_per_actor": 4}, learner={"batch_size": 8},
                          run={"balance": "auto", "balance_window_s": 1.0, "balance_max_actors": 4,
                               "total_steps": 10**9, "max_seconds": 45, "name": "ray-auto"},
                          telemetry={"tensorboard": False, "report": False}))
    assert s["outcome"] == "completed" and s["actors_on"] == "ray"
    b = s["balance"]
    moves = [m for m in b["moves"] if m.get("event") == "move"]
    assert moves, b["moves"]
    assert moves[0]["to"]["actors"] > moves[0]["from"]["actors"] and moves[0]["bound"] == "actors", moves[0]
    recs = _records(s["run_dir"])
    assert all("balance/actors" in r for r in recs[1:])
    assert C.build(C.read_file(b["config_file"])).actors.num_actors == b["final"]["actors"]
