"""The bottleneck verdict: which role limits throughput, the evidence, and what to change.

Input: per-role stage shares (fraction of each role's wall time spent in each stage, from the stage
timers) and the hardware summary. Rules, in order:

1. learner-bound: the learner is busy (waits for data < 15% of its time) or actors wait for free
   buffers (> 25%): batches are produced faster than they are consumed.
2. inference-bound (central inference only): actors wait for actions most of their time (> 50%)
   while the inference server is busy (waits for requests < 30%); transfer-bound instead when
   host-device copies take more of the server's busy time than the forward pass.
3. actor/env-bound otherwise: the learner and the server wait for the actors, which spend their
   time stepping environments.
"""

from __future__ import annotations

VERDICTS = ("actor-bound", "inference-bound", "learner-bound", "transfer-bound")

ADVICE = {
    "actor-bound": "add actor cores (actors.num_actors, with cores for them), raise actors.envs_per_actor, or use a "
                   "faster env backend (env.backend=envpool)",
    "inference-bound": "raise the inference batch (inference.max_batch, inference.max_wait_ms), put inference on a "
                       "GPU (learner.device=cuda), or raise actors.envs_per_actor so each request carries more envs",
    "learner-bound": "add learner devices or a faster one, raise learner.batch_size (fewer, larger updates), or use "
                     "fewer actor cores: extra actors only add policy lag",
    "transfer-bound": "raise the inference batch so each copy carries more, keep observations uint8, and keep the "
                      "inference server on the same device as the learner",
}


def advise(verdict: str, machine: dict | None, central: bool, cpu_util: float | None = None) -> str:
    """What to change, for the machine the run was on: ``machine`` has ``gpus`` (how many the node has) and
    ``learner_device`` ('cpu', 'cuda:0', ...). Without it, the general advice (ADVICE)."""
    if not machine:
        return ADVICE[verdict]
    gpus = int(machine.get("gpus") or 0)
    on_gpu = str(machine.get("learner_device", "cpu")).startswith("cuda")
    saturated = cpu_util is not None and cpu_util > 0.9
    if verdict == "actor-bound":
        if saturated:
            return ("every core is busy, so more actor processes would only share them: use a cheaper env backend "
                    "(env.backend=envpool), fewer optimizer steps per frame if the learner shares the cores "
                    "(learner.epochs), or a machine with more cores per " + ("GPU" if gpus else "learner"))
        return ADVICE[verdict]
    if verdict == "inference-bound":
        if on_gpu:
            return ("raise the inference batch (inference.max_batch, inference.max_wait_ms) or actors.envs_per_actor "
                    "so each forward pass carries more envs")
        if gpus:
            return f"put the learner and inference on this node's GPU (learner.device=cuda; {gpus} here)"
        return ("this machine has no GPU: raise the inference batch (inference.max_batch, inference.max_wait_ms) or "
                "actors.envs_per_actor, or run the policy in the actors (inference.mode=actor) to spread forward "
                "passes over the actor cores" if central else ADVICE[verdict])
    if verdict == "learner-bound":
        if on_gpu:
            return ("add learner devices (learner.devices) or a faster GPU, raise learner.batch_size (fewer, larger "
                    "updates), or use fewer actor cores: extra actors only add policy lag")
        if gpus:
            return f"train on this node's GPU (learner.device=cuda; {gpus} here): the learner runs on the CPU now"
        return ("this machine has no GPU, so the learner shares the CPU with the actors: give it more threads "
                "(learner.torch_threads) and fewer actors, fewer optimizer steps per frame (learner.epochs, "
                "learner.minibatches), or a larger learner.batch_size; a GPU learner is what would help most")
    if verdict == "transfer-bound" and not on_gpu:
        return ("the copies are host-memory copies here (no GPU learner): raise the inference batch so each copy "
                "carries more, and keep observations uint8")
    return ADVICE[verdict]


def _get(shares: dict, role: str, stage: str) -> float:
    return float(shares.get(role, {}).get(stage, 0.0))


def decide(shares: dict[str, dict[str, float]], central: bool, hardware: dict | None = None,
           machine: dict | None = None) -> dict:
    """Return {"verdict", "evidence", "advice", "figures"} from role stage shares; the advice fits ``machine``
    (see ``advise``) where it is given."""
    learner_wait = _get(shares, "learner", "wait_data")
    actor_wait_buffer = _get(shares, "actor", "wait_buffer")
    actor_wait_action = _get(shares, "actor", "wait_action")
    actor_env = _get(shares, "actor", "env_step")
    inf_wait = _get(shares, "inference", "batch_wait")
    inf_copy = _get(shares, "inference", "h2d") + _get(shares, "inference", "d2h")
    inf_fwd = _get(shares, "inference", "forward")
    figures = {"learner_wait_data": learner_wait, "learner_busy": 1.0 - learner_wait,
               "actor_env_step": actor_env, "actor_wait_action": actor_wait_action,
               "actor_wait_buffer": actor_wait_buffer}
    if central:
        figures.update(inference_wait=inf_wait, inference_forward=inf_fwd, inference_copy=inf_copy)
    if hardware:
        if "cpu_util_mean" in hardware:
            figures["cpu_util_mean"] = hardware["cpu_util_mean"]
        if "gpu_util_mean" in hardware:
            figures["gpu_util_mean"] = hardware["gpu_util_mean"]["value"]
    if learner_wait < 0.15 or actor_wait_buffer > 0.25:
        verdict = "learner-bound"
        evidence = (f"the learner waits for data only {learner_wait:.0%} of its time and actors wait for free "
                    f"buffers {actor_wait_buffer:.0%} of theirs")
    elif central and actor_wait_action > 0.5 and inf_wait < 0.3:
        if inf_copy > inf_fwd:
            verdict = "transfer-bound"
            evidence = (f"actors wait for actions {actor_wait_action:.0%} of their time; the inference server is "
                        f"busy {1 - inf_wait:.0%} of its time, more of it copying ({inf_copy:.0%}) than "
                        f"computing ({inf_fwd:.0%})")
        else:
            verdict = "inference-bound"
            evidence = (f"actors wait for actions {actor_wait_action:.0%} of their time while the inference server "
                        f"is busy {1 - inf_wait:.0%} of its time (forward pass {inf_fwd:.0%})")
    else:
        verdict = "actor-bound"
        evidence = (f"the learner waits for data {learner_wait:.0%} of its time"
                    + (f" and the inference server waits for requests {inf_wait:.0%} of its" if central else "")
                    + f"; actors step environments {actor_env:.0%} of their time"
                    + (f" and wait for actions {actor_wait_action:.0%} (the round trip to the server)"
                       if central and actor_wait_action > actor_env else ""))
    cpu = figures.get("cpu_util_mean")
    if cpu is not None and cpu > 0.9:
        evidence += f"; the CPU is saturated ({cpu:.0%} of all cores busy), so more cores help every role"
    return {"verdict": verdict, "evidence": evidence, "advice": advise(verdict, machine, central, cpu),
            "figures": figures}
