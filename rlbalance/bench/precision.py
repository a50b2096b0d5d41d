"""Learner ceiling by torso precision, against a baseline checkout, in one window.

  python -m rlbalance.bench.precision --baseline ../base-wt --workload pong --rounds 3

Each round measures, each in a fresh process, alternating: the baseline checkout's learner ceiling at its own
defaults (a git worktree of an earlier commit: ``git worktree add ../base-wt <commit>``), then this checkout's at
``learner.torso_precision`` fp32, bf16 and auto. Writes ``precision-<workload>.json``, ``.md`` and ``.png`` to the
output folder, with the CPU's flags and what 'auto' chose on this machine. Never run it while anything else runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

# run in the checkout given (cwd), so it measures that checkout's code
_MEASURE = """
import json, sys
from rlbalance.bench.trainer import workload_config, learner_ceiling
over = json.loads(sys.argv[2])
r = learner_ceiling(workload_config(sys.argv[1], over), float(sys.argv[3]))
print("RESULT " + json.dumps({"sps": r["sps"], "updates_per_s": r["updates_per_s"]}))
"""


def measure(tree: Path, workload: str, overrides: dict, seconds: float) -> dict:
    env = {"PYTHONPATH": str(tree.resolve())}
    import os

    out = subprocess.run([sys.executable, "-c", _MEASURE, workload, json.dumps(overrides), str(seconds)],
                         cwd=tree, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"measuring {workload} {overrides} in {tree} failed:\n{out.stderr[-2000:]}")


def measure_e2e(tree: Path, env_id: str, overrides: dict, seconds: float) -> dict:
    """A real training run of ``seconds`` with the env's preset in checkout ``tree``: its sustained FPS and the
    learner's share of time waiting for data (0: learner-bound)."""
    import os
    import tempfile

    sets = [f"--set={sec}.{k}={v}" for sec, vals in overrides.items() for k, v in vals.items()]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "rlbalance", "train", "--env.id", env_id, "--run.max_seconds", str(seconds),
               "--run.total_steps", "1000000000", "--run.out_dir", tmp, "--run.name", "e2e",
               "--telemetry.progress", "false", "--telemetry.tensorboard", "false", *sets]
        r = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree.resolve())},
                           capture_output=True, text=True, timeout=seconds + 600)
        summary = Path(tmp) / "e2e" / "summary.json"
        if r.returncode != 0 or not summary.is_file():
            raise RuntimeError(f"e2e run in {tree} failed:\n{r.stderr[-2000:]}")
        s = json.loads(summary.read_text())
    return {"fps": s["fps_sustained"], "sps": s["sps_sustained"], "verdict": s["verdict"]}


def run(baseline: Path | None, workload: str, rounds: int, seconds: float, out: Path, progress=print,
        e2e_seconds: float = 0.0, env_id: str = "ALE/Pong-v5") -> dict:
    from rlbalance.agents.precision import choice, cpu_flags
    from rlbalance.core.jsonio import atomic_write_json
    from rlbalance.runtime.rundir import hardware_stamp

    here = Path(__file__).resolve().parents[2]
    variants = ([("baseline", baseline, {})] if baseline else []) + [
        (p, here, {"learner": {"torso_precision": p}}) for p in ("fp32", "bf16", "auto")]
    samples: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    for r in range(rounds):
        for name, tree, over in variants:
            progress(f"round {r + 1}/{rounds}: {name} ...")
            samples[name].append(measure(tree, workload, over, seconds))
            progress(f"  {samples[name][-1]['sps']:,.0f} SPS")
    e2e: dict[str, list[dict]] = {}
    if e2e_seconds:  # end to end, the baseline's defaults against 'auto', alternating
        for r in range(rounds):
            for name, tree, over in [v for v in variants if v[0] in ("baseline", "auto")]:
                progress(f"round {r + 1}/{rounds}: end to end, {name}, {e2e_seconds:g} s ...")
                e2e.setdefault(name, []).append(measure_e2e(tree, env_id, over, e2e_seconds))
                progress(f"  {e2e[name][-1]['fps']:,.0f} FPS ({e2e[name][-1]['verdict']})")
    med = {k: statistics.median(s["sps"] for s in v) for k, v in samples.items()}
    ref = "baseline" if baseline else "fp32"
    stamp = hardware_stamp()
    doc = {"benchmark": "precision", "workload": workload, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "hardware": stamp, "cpu_bf16_flags": sorted(f for f in cpu_flags() if "bf16" in f),
           "auto_chose": choice("auto", "cpu", True), "seconds_per_measurement": seconds, "rounds": rounds,
           "baseline": _commit(baseline) if baseline else None, "samples": samples, "median_sps": med,
           "speedup_over": ref, "speedup": {k: v / med[ref] for k, v in med.items()},
           "e2e": e2e, "e2e_seconds": e2e_seconds,
           "e2e_median_fps": {k: statistics.median(x["fps"] for x in v) for k, v in e2e.items()}}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / f"precision-{workload}.json", doc)
    lines = [f"# Learner ceiling by torso precision: {workload} ({doc['date']})", "",
             f"Machine: {stamp['cpu_model']}, {stamp['usable_cpus']} usable CPUs; bfloat16 flags: "
             f"{', '.join(doc['cpu_bf16_flags']) or 'none'}; 'auto' chose {doc['auto_chose']['torso_precision']} "
             f"({doc['auto_chose']['why']}). Commit {stamp['git_commit']}"
             + (f", baseline {doc['baseline']}" if baseline else "") + ".", "",
             f"{rounds} rounds, alternating, each measurement {seconds:g} s in a fresh process, nothing else running. "
             "SPS: env steps of learner work per second (frames = 4x for Atari).", "",
             "| variant | SPS per round | median SPS | x " + ref + " |", "|---|---|---|---|"]
    for k, v in samples.items():
        per_round = ", ".join(f"{s['sps']:,.0f}" for s in v)
        lines.append(f"| {k} | {per_round} | {med[k]:,.0f} | "
                     f"{doc['speedup'][k]:.2f} |")
    if e2e:
        lines += ["", f"End to end ({env_id}, its preset, {e2e_seconds:g}-s runs, sustained FPS after warm-up, the "
                  "baseline's defaults against this checkout's learner.torso_precision=auto):", "",
                  "| variant | FPS per round | median FPS | verdicts |", "|---|---|---|---|"]
        for k, v in e2e.items():
            per_round = ", ".join(f"{x['fps']:,.0f}" for x in v)
            lines.append(f"| {k} | {per_round} | {doc['e2e_median_fps'][k]:,.0f} | "
                         f"{', '.join(sorted({x['verdict'] for x in v}))} |")
    (out / f"precision-{workload}.md").write_text("\n".join(lines) + "\n")
    _plot(samples, out / f"precision-{workload}.png", workload, stamp["cpu_model"])
    return doc


def _commit(tree: Path) -> str:
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True)
    return r.stdout.strip()


def _plot(samples: dict, path: Path, workload: str, cpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(samples)
    for i, k in enumerate(names):
        ys = [s["sps"] for s in samples[k]]
        ax.bar(i, statistics.median(ys), color="#8fb3d9")
        ax.plot([i] * len(ys), ys, "k.", ms=6)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("learner ceiling, env steps/s")
    ax.set_title(f"{workload}: learner ceiling by precision\n{cpu}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlbalance.bench.precision", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, help="a checkout of an earlier commit to measure alongside")
    p.add_argument("--workload", default="pong", help="a workload of rlbalance.bench.trainer (default pong)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--e2e-seconds", type=float, default=0.0, help="also end-to-end training runs of this long "
                   "(baseline and auto, each round)")
    p.add_argument("--env-id", default="ALE/Pong-v5", help="the env of the end-to-end runs")
    p.add_argument("--out", type=Path, default=Path("bench/results/precision"))
    a = p.parse_args(argv)
    doc = run(a.baseline, a.workload, a.rounds, a.seconds, a.out, e2e_seconds=a.e2e_seconds, env_id=a.env_id)
    print(json.dumps(doc["speedup"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
