"""The agent interface (issue 28): an agent that lives only in tests/ (toy_agents.Reinforce) trains through every
runner by its name, with nothing of rlbalance changed for it; and the registry's refusals name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlbalance import config as C
from rlbalance.agents import registry
from rlbalance.agents.base import Agent
from rlbalance.runtime.train import train

TOY = "toy_agents:Reinforce"


def _toy(cfg_factory, name, **sections):
    return cfg_factory(**C.merge({"learner": {"agent": TOY, "learning_rate": 1e-3, "batch_size": 8,
                                              "unroll_length": 20},
                                  "actors": {"num_actors": 2, "envs_per_actor": 4},
                                  "run": {"total_steps": 6_000, "name": name},
                                  "telemetry": {"tensorboard": False, "report": False}}, sections))


def _check_trained(s: dict) -> None:
    assert s["outcome"] == "completed" and s["agent"] == TOY
    assert s["steps"] >= 6_000 and s["updates"] >= 6_000 // (20 * 8)
    tel = json.loads((Path(s["run_dir"]) / "telemetry.json").read_text())
    # what the actors recorded is what the net gave at those weights (one net, one interface, on every path)
    # (the toy's own per-step record: scores, a float64 log-probability and a float16 temperature, each env's own)
    toy = tel["toy"]
    assert toy["updates"] == s["updates"] and toy["max_logit_gap"] < 1e-4 and toy["max_logp_gap"] < 1e-4, toy
    assert toy["max_temperature_gap"] == 0.0
    ckpt = registry.get(TOY)  # the registry now holds it by that name
    assert isinstance(ckpt, Agent) and ckpt.name == "reinforce"


@pytest.mark.parametrize("mode,inference", [("serial", "central"), ("serial", "actor"),
                                            ("parallel", "central"), ("parallel", "actor")])
def test_a_test_agent_trains_on_the_local_runners(cfg_factory, mode, inference):
    _check_trained(train(_toy(cfg_factory, f"toy-{mode}-{inference}", run={"mode": mode},
                              inference={"mode": inference})))


@pytest.mark.slow
@pytest.mark.parametrize("inference", ["central", "actor"])
def test_a_test_agent_trains_with_ray_actors(cfg_factory, inference):
    pytest.importorskip("ray")
    _check_trained(train(_toy(cfg_factory, f"toy-ray-{inference}", ray={"address": "local", "num_cpus": 2},
                              inference={"mode": inference})))


def test_a_step_record_that_takes_a_transition_name_or_declares_nothing_is_refused(cfg_factory, monkeypatch):
    from rlbalance.agents.base import StepField
    from rlbalance.envs.batch import probe_spec

    cfg = _toy(cfg_factory, "toy-refused")
    spec = probe_spec(cfg.env)
    agent = registry.get(TOY)
    assert set(registry.step_record(cfg, spec)) == {"scores", "logp", "temperature"}
    monkeypatch.setattr(type(agent), "step_record", lambda self, c, s: {"reward": StepField(())})
    with pytest.raises(C.ConfigError, match="learner.agent=.*'reward' is taken by the transition"):
        registry.step_record(cfg, spec)
    monkeypatch.setattr(type(agent), "step_record", lambda self, c, s: {})
    with pytest.raises(C.ConfigError, match="declares no field"):
        registry.step_record(cfg, spec)
    monkeypatch.setattr(type(agent), "step_record", lambda self, c, s: {"x": (3,)})
    with pytest.raises(C.ConfigError, match="StepField"):
        registry.step_record(cfg, spec)


def test_a_test_agent_resumes(cfg_factory):
    s = train(_toy(cfg_factory, "toy-resume", run={"mode": "serial", "total_steps": 3_000}))
    cfg = _toy(cfg_factory, "toy-resume", run={"mode": "serial", "total_steps": 6_000})
    s2 = train(cfg, resume=s["run_dir"])
    assert s2["outcome"] == "completed" and s2["steps"] >= 6_000 and s2["updates"] > s["updates"]


def test_an_unknown_agent_is_refused_naming_the_field(cfg_factory):
    with pytest.raises(C.ConfigError, match="learner.agent"):
        C.build({"learner": {"agent": "ppo"}})
    with pytest.raises(C.ConfigError, match="learner.agent='nosuchmodule:Agent': cannot import"):
        registry.get("nosuchmodule:Agent")
    with pytest.raises(C.ConfigError, match="is not an rlbalance Agent"):
        registry.get("toy_agents:PolicyNet")
