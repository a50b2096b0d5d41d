"""Chaos: a fault-injection soak. One training run (30 minutes of training by default) has its actors
killed (SIGKILL), hung (SIGSTOP) and crashed (an exception raised at a random point, by SIGUSR1) on a
random schedule, and its learner killed with SIGKILL once, mid-run, then resumed with ``--resume``. An
undisturbed run of the same training time on the same config is the reference.

It reports the faults injected, the restarts, the actor-seconds lost, the final return of both runs,
and checks that nothing was lost or leaked: every metrics line is strict JSON and the lines of each
session follow one another; the resume started from the last checkpoint written before the kill; no
checkpoint is a partial (``.tmp``) file and every one loads; every process of the run's tree has exited
and every shared-memory file it mapped is gone. Writes chaos.json, chaos.md and chaos.png.

The run is a child process (``python -m rlbalance train``), so the learner can be killed like any
other process; actors learn that SIGUSR1 is an injected crash from RLBALANCE_FAULT_INJECTION=1.

Three runtime paths (``path``): ``local`` (actor processes of the learner), ``ray`` (Ray actors on a two-node
cluster on 127.0.0.1 that the bench starts; the worker node is killed once and a new one joins; actors are killed
and hung, Ray restarts them; the learner is killed and the run resumed on the same cluster) and ``ddp`` (two
learner processes with their own actors; learner rank 1 is killed once: rank 0 stops the run cleanly, and it
resumes from the last checkpoint with one learner process, learner.devices=1).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from rlbalance.bench.chaos_faults import _actors, _leaf_processes, _learner_rank, _ray_actors, _RayCluster, _Tree

KINDS = ("kill", "hang", "crash")
PATHS = ("local", "ray", "ddp")
PATH_WORDS = {"local": "local actor processes", "ray": "Ray actors on a two-node cluster on 127.0.0.1",
              "ddp": "two learner processes"}


def _strict_json(text: str):
    def bad(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(text, parse_constant=bad)


def _metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [_strict_json(line) for line in path.read_text().splitlines()] if path.exists() else []


def _checkpoints(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("ckpt-*.pt"))


def _train_cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "rlbalance", "train", *args]


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def run_chaos(minutes: float, out: Path, seed: int = 0, fault_every_s: float | None = None,
              heartbeat_s: float = 10.0, env_id: str = "CartPole-v1", extra: list[str] | None = None,
              baseline: bool = True, path: str = "local") -> dict:
    """The chaos run and (``baseline``) its undisturbed reference on runtime ``path`` (local, ray or ddp, see the
    module's docstring); returns the result written to chaos.json."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}")
    seconds = minutes * 60
    fault_every_s = fault_every_s or max(2.0, seconds / 90)  # ~90 faults in a run by default
    # Faults hit running actors: one restarted moments ago is not hit again before it could step (with
    # faults faster than actors start, no unroll is ever made and the learner rightly stops the run).
    min_age_s = min(5.0, fault_every_s)
    ckpt_s = max(5.0, seconds / 12)
    log_s = max(1.0, min(10.0, seconds / 60))
    out.mkdir(parents=True, exist_ok=True)
    runs = out / "runs"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    common = ["--env.id", env_id, "--run.total_steps", str(10**12), "--run.out_dir", str(runs),
              "--run.seed", str(seed), "--run.checkpoint_interval_s", str(ckpt_s),
              "--actors.heartbeat_timeout_s", str(heartbeat_s), "--actors.max_restarts", "1000000",
              "--telemetry.log_interval_s", str(log_s), "--telemetry.progress", "false", *(extra or [])]
    cluster = _RayCluster() if path == "ray" else None
    if cluster is not None:
        common += ["--ray.address", cluster.address]
    if path == "ddp":
        common += ["--learner.devices", "2", "--actors.num_actors", "2"]
    rng = random.Random(seed)
    env = dict(os.environ, RLBALANCE_FAULT_INJECTION="1")
    name = f"chaos-{stamp}"
    run = runs / name
    runs.mkdir(parents=True, exist_ok=True)
    log = open(runs / f"{name}.log", "w")  # (beside the run directory: console output, with host paths)
    tree = _Tree()
    faults: list[dict] = []
    stopped: set[int] = set()
    sessions: list[dict] = []
    hung = False
    t_kill = seconds * rng.uniform(0.4, 0.6)
    t_node = seconds * rng.uniform(0.15, 0.3) if cluster is not None else None  # the Ray worker node's death
    node_events: list[dict] = []
    trained = 0.0  # training seconds done by finished sessions
    t_wall0 = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[chaos {time.monotonic() - t_wall0:7.0f}s] {msg}", flush=True)

    try:
        for session in (0, 1):
            if session == 0:
                cmd = _train_cmd([*common, "--run.name", name, "--run.max_seconds", str(seconds)])
            else:  # (after a learner rank's death, on one learner process: a checkpoint resumes on any number)
                cmd = _train_cmd(["--resume", str(run), "--run.max_seconds", str(max(1.0, seconds - trained)),
                                  *(["--learner.devices", "1"] if path == "ddp" else [])])
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            root = psutil.Process(proc.pid)
            t_start = time.monotonic()
            t_train0 = None  # when this session's first metrics line appeared, less its time_s
            next_fault = None
            last_shown = 0.0
            ckpts_at_kill: list[str] = []
            killed = False
            limit = t_start + 300 + 3 * heartbeat_s + (seconds - trained)  # start-up, shutdown and stall margin
            while proc.poll() is None:
                now = time.monotonic()
                tree.poll(root)
                if now > limit:
                    hung = True
                    progress(f"session {session} did not end by its limit: a hang; killing it")
                    proc.kill()
                    break
                if t_train0 is None:
                    recs = [r for r in _metrics(run) if r["session"] == session] if run.exists() else []
                    if recs:
                        t_train0 = now - recs[0]["time_s"]
                        next_fault = now + rng.expovariate(1 / fault_every_s)
                elif now >= next_fault:
                    targets = {"local": _actors, "ddp": _leaf_processes}[path](root, min_age_s) if path != "ray" \
                        else _ray_actors(min_age_s)
                    if path == "ray":  # a Ray actor's crash is its process dying: Ray knows no SIGUSR1 of ours
                        targets = targets if rng.random() < 2 / 3 else []
                        kinds = ("kill", "hang")
                    else:
                        kinds = KINDS
                    if targets:
                        kind, p = rng.choice(kinds), rng.choice(targets)
                        sig = {"kill": signal.SIGKILL, "hang": signal.SIGSTOP, "crash": signal.SIGUSR1}[kind]
                        try:
                            os.kill(p.pid, sig)
                            faults.append({"session": session, "t_train_s": round(now - t_train0 + trained, 2),
                                           "kind": kind, "pid": p.pid})
                            if kind == "hang":
                                stopped.add(p.pid)
                        except ProcessLookupError:
                            pass
                    next_fault = now + rng.expovariate(1 / fault_every_s)
                t_now = now - t_train0 + trained if t_train0 is not None else trained  # training seconds so far
                if t_node is not None and t_train0 is not None and t_now >= t_node:
                    t_node = None
                    cluster.kill_worker()
                    node_events.append({"t_train_s": round(t_now, 2), "kind": "node_kill"})
                    faults.append({"session": session, "t_train_s": node_events[-1]["t_train_s"], "kind": "node_kill",
                                   "pid": None})
                    progress("Ray worker node killed; a new one joins in 20 s")
                    t_add = now + 20
                if cluster is not None and node_events and len(node_events) == 1 and now >= t_add:
                    cluster.add_worker()
                    node_events.append({"t_train_s": round(t_now, 2), "kind": "node_added"})
                    progress("a new Ray worker node joined")
                if path == "ddp" and session == 0 and t_train0 is not None and now - t_train0 >= t_kill \
                        and _checkpoints(run) and not killed:
                    victim = _learner_rank(root, 1)
                    if victim is not None:
                        for pid in stopped:  # a hung actor of that rank must see its learner die, as below
                            try:
                                os.kill(pid, signal.SIGCONT)
                            except ProcessLookupError:
                                pass
                        os.kill(victim.pid, signal.SIGKILL)
                        killed = True
                        trained = now - t_train0
                        faults.append({"session": 0, "t_train_s": round(trained, 2), "kind": "learner_kill",
                                       "pid": victim.pid})
                        progress(f"learner rank 1 (pid {victim.pid}) killed with SIGKILL after {trained:.0f} s of "
                                 "training; rank 0 must stop the run")
                if path != "ddp" and session == 0 and t_train0 is not None and now - t_train0 >= t_kill \
                        and _checkpoints(run):
                    ckpts_at_kill = [c.name for c in _checkpoints(run)]
                    for pid in stopped:  # a hung actor would outlive any learner; let it see its learner die
                        try:
                            os.kill(pid, signal.SIGCONT)
                        except ProcessLookupError:
                            pass
                    proc.kill()
                    proc.wait()
                    killed = True
                    trained = now - t_train0
                    faults.append({"session": 0, "t_train_s": round(trained, 2), "kind": "learner_kill",
                                   "pid": proc.pid})
                    progress(f"learner (pid {proc.pid}) killed with SIGKILL after {trained:.0f} s of training")
                    break
                if now - last_shown >= 30:
                    last_shown = now
                    recs = [r for r in _metrics(run) if r["session"] == session] if run.exists() else []
                    progress(f"session {session}: {now - t_start:.0f} s since its start, "
                             f"{recs[-1]['steps'] if recs else 0:,} steps, {len(faults)} faults injected")
                time.sleep(0.25)
            rc = proc.wait()
            if killed and path == "ddp":  # rank 0 stopped the run; its last checkpoint is where it resumes
                ckpts_at_kill = [c.name for c in _checkpoints(run)]
            if killed:  # the orphaned actors must notice and leave by themselves
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and tree.alive():
                    time.sleep(0.5)
            elif t_train0 is not None:
                trained += time.monotonic() - t_train0
            sessions.append({"session": session, "exit_code": rc, "learner_killed": killed,
                             "checkpoints_at_kill": ckpts_at_kill,
                             "orphans_after_kill": tree.alive() if killed else []})
            if not killed:
                break
    finally:  # (the cluster's processes go with it, whatever stopped the run)
        log.close()
        if cluster is not None:
            cluster.shutdown()

    # What the run left behind.
    deadline = time.monotonic() + 15  # the run's helpers (resource tracker) leave just after the learner
    while time.monotonic() < deadline and tree.alive():
        time.sleep(0.5)
    leaked_procs = tree.alive()
    for pid in leaked_procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    leaked_shm = sorted(n for n in tree.shm if os.path.exists(n))
    checks = _check_run(run, sessions)
    summary = _strict_json((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    recs = _metrics(run)
    by_session: dict[int, dict] = {}
    for r in recs:
        if "actors/restarts" in r:
            by_session[r["session"]] = r
    restarts = sum(int(r["actors/restarts"]) for r in by_session.values())
    lost = sum(float(r.get("actors/lost_seconds", 0.0)) for r in by_session.values())
    result = {
        "minutes": minutes, "seed": seed, "env_id": env_id, "path": path, "fault_every_s": fault_every_s,
        "ray_node_events": node_events,
        "heartbeat_timeout_s": heartbeat_s, "min_actor_age_s": min_age_s, "checkpoint_interval_s": ckpt_s, "extra": extra or [],
        "run_dir": str(run), "sessions": sessions, "hang": hung,
        "faults": {k: sum(f["kind"] == k for f in faults) for k in (*KINDS, "learner_kill", "node_kill")},
        "fault_log": faults,
        "actor_restarts": restarts, "actor_seconds_lost": round(lost, 2),
        "steps": summary.get("steps"), "final_return_last100": summary.get("episode_return_last100"),
        "processes_seen": len(tree.seen), "processes_leaked": [f"{p}: {tree.what.get(p, '?')}" for p in leaked_procs], "shm_files_seen": len(tree.shm),
        "shm_files_leaked": leaked_shm, "checks": checks,
        "curve": [(r["time_s"], r["session"], r["steps"], r.get("episode_return")) for r in recs],
    }
    if baseline:  # (Ray: on a cluster of its own, the chaos run's is gone)
        fresh = _RayCluster() if cluster is not None else None
        try:
            base = [fresh.address if fresh is not None and a == cluster.address else a for a in common]
            result["baseline"] = _baseline(base, runs, f"undisturbed-{stamp}", seconds, out, progress)
        finally:
            if fresh is not None:
                fresh.shutdown()
    result["ok"] = (not hung and not leaked_procs and not leaked_shm and all(c["ok"] for c in checks.values())
                    and sessions[-1]["exit_code"] == 0
                    # two learner processes: rank 0 stopped the run itself (an error naming the dead rank)
                    and (path != "ddp" or sessions[0]["exit_code"] not in (0, None, -signal.SIGKILL)))
    _write(result, out)
    return result


def _check_run(run: Path, sessions: list[dict]) -> dict:
    """Nothing lost: metrics lines, the resume point, checkpoints."""
    checks: dict[str, dict] = {}
    lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
    broken = []
    recs = []
    for i, line in enumerate(lines):
        try:
            recs.append(_strict_json(line))
        except ValueError:
            broken.append(i + 1)
    order = [r["session"] for r in recs]
    ordered = order == sorted(order) and all(
        b["steps"] >= a["steps"] and b["time_s"] >= a["time_s"]
        for a, b in zip(recs, recs[1:]) if a["session"] == b["session"])
    checks["metrics"] = {"ok": not broken and ordered and len(set(order)) == len(sessions),
                         "lines": len(recs), "broken_lines": broken, "sessions": sorted(set(order)),
                         "in_order": ordered}
    meta = _strict_json((run / "meta.json").read_text()) if (run / "meta.json").exists() else {}
    killed = [s for s in sessions if s["learner_killed"]]
    if killed:
        last = killed[0]["checkpoints_at_kill"][-1] if killed[0]["checkpoints_at_kill"] else None
        want = int(last.split("-")[1].split(".")[0]) if last else None
        got = meta.get("resumed_from_steps") if isinstance(meta, dict) else None
        checks["resume"] = {"ok": want is not None and got == want, "last_checkpoint_before_kill": last,
                            "resumed_from_steps": got}
    from rlbalance.runtime.rundir import RunDir

    tmp = sorted(p.name for p in (run / "checkpoints").glob("*.tmp")) if (run / "checkpoints").exists() else []
    unreadable = []
    for c in _checkpoints(run):
        try:
            RunDir(run).load_checkpoint(c)  # the loader training resumes with (weights_only, the format checked)
        except Exception as e:  # noqa: BLE001 - any failure to load is what we look for
            unreadable.append(f"{c.name}: {type(e).__name__}")
    checks["checkpoints"] = {"ok": not tmp and not unreadable and bool(_checkpoints(run)),
                             "count": len(_checkpoints(run)), "tmp_files": tmp, "unreadable": unreadable}
    return checks


def _baseline(common: list[str], runs: Path, name: str, seconds: float, out: Path, progress) -> dict:
    progress(f"undisturbed reference run: {seconds:.0f} s of training")
    with open(runs / f"{name}.log", "w") as log:
        try:
            rc = subprocess.call(_train_cmd([*common, "--run.name", name, "--run.max_seconds", str(seconds)]),
                                 stdout=log, stderr=subprocess.STDOUT, timeout=seconds + 600)
        except subprocess.TimeoutExpired:
            rc = None
    run = runs / name
    s = _strict_json((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    recs = _metrics(run)
    return {"run_dir": str(run), "exit_code": rc, "steps": s.get("steps"),
            "final_return_last100": s.get("episode_return_last100"),
            "actor_restarts": s.get("actor_restarts"),
            "curve": [(r["time_s"], r["session"], r["steps"], r.get("episode_return")) for r in recs]}


def _fmt(x, spec=",.1f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _write(r: dict, out: Path) -> None:
    (out / "chaos.json").write_text(json.dumps(r, indent=2, allow_nan=False))
    f = r["faults"]
    b = r.get("baseline") or {}
    rows = "\n".join(f"| {k} | {'yes' if c['ok'] else 'NO'} | "
                     f"{json.dumps({kk: vv for kk, vv in c.items() if kk != 'ok'})} |" for k, c in r["checks"].items())
    (out / "chaos.md").write_text(
        f"# Chaos: fault-injection soak ({r['minutes']:g} minutes of training, {r['env_id']}, seed {r['seed']}, "
        f"{PATH_WORDS[r.get('path', 'local')]})\n\n"
        f"Config overrides: {' '.join(r['extra']) or 'none'}.\n\n"
        f"Faults on a random schedule (one every {r['fault_every_s']:.1f} s on average): actors killed "
        f"{f['kill']}, hung {f['hang']}, crashed {f['crash']}; "
        + (f"learner rank 1 killed with SIGKILL {f['learner_kill']} time(s), rank 0 stopping the run, which resumed "
           "from its last checkpoint with one learner process"
           if r.get("path") == "ddp" else f"learner killed with SIGKILL and resumed {f['learner_kill']} time(s)")
        + (f"; Ray worker node killed {f.get('node_kill', 0)} time(s) (a new one joined 20 s later)"
           if r.get("path") == "ray" else "")
        + f". Heartbeat timeout {r['heartbeat_timeout_s']:g} s.\n\n"
        f"- verdict: **{'passed' if r['ok'] else 'FAILED'}**; hang: {r['hang']}; exit codes "
        f"{[s['exit_code'] for s in r['sessions']]}\n"
        f"- actor restarts {r['actor_restarts']}, actor-seconds lost {r['actor_seconds_lost']:,.1f}\n"
        f"- steps {_fmt(r['steps'], ',')} against {_fmt(b.get('steps'), ',')} undisturbed; final return "
        f"(last 100 episodes) {_fmt(r['final_return_last100'])} against {_fmt(b.get('final_return_last100'))} "
        f"undisturbed\n"
        f"- processes seen {r['processes_seen']}, leaked {len(r['processes_leaked'])}; shared-memory files "
        f"mapped {r['shm_files_seen']}, left behind {len(r['shm_files_leaked'])}\n\n"
        f"| check | ok | detail |\n|---|---|---|\n{rows}\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    off = 0.0
    xs, ys = [], []
    prev_session, prev_t = 0, 0.0
    for t, s, _, ret in r["curve"]:
        if s != prev_session:  # sessions restart time_s: lay them end to end
            off, prev_session = off + prev_t, s
        prev_t = t
        if ret is not None:
            xs.append((t + off) / 60)
            ys.append(ret)
    ax.plot(xs, ys, color="tab:red", label="with faults")
    if b.get("curve"):
        ax.plot([t / 60 for t, _, _, ret in b["curve"] if ret is not None],
                [ret for _, _, _, ret in b["curve"] if ret is not None], color="tab:gray", label="undisturbed")
    colors = {"kill": "tab:purple", "hang": "tab:orange", "crash": "tab:brown", "learner_kill": "black",
              "node_kill": "tab:blue"}
    for kind, c in colors.items():
        ts = [x["t_train_s"] / 60 for x in r["fault_log"] if x["kind"] == kind]
        if ts:
            ax.vlines(ts, 0, 0.06, transform=ax.get_xaxis_transform(), color=c, lw=2 if kind == "learner_kill" else 0.8,
                      label=f"{kind.replace('_', ' ')} ({len(ts)})")
    ax.set_xlabel("training time (minutes)")
    ax.set_ylabel("episode return (mean of recent episodes)")
    ax.set_title(f"Chaos soak: {r['env_id']}, {PATH_WORDS[r.get('path', 'local')]}"
                 + (", faults against an undisturbed run" if b.get("curve") else ""))
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "chaos.png", dpi=110)
    plt.close(fig)
