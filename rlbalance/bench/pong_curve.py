"""Pong learning curve with the Atari preset: train ALE/Pong-v5 for N frames (10M by default) and record
the mean return of the last 100 games, the policy entropy and the policy lag against frames and against
wall time, the frames and minutes to pass -15 and +18, and the final policy's weights.

``run_curve`` trains and then calls ``write_curve``; ``write_curve`` alone turns any finished (or
interrupted) run directory into the same files, so a run started with ``rlbalance train`` can be
reported the same way. Writes pong-curve.json, .csv, .png and ``policy/`` (the run's config and its final model weights, no
optimizer state), which ``rlbalance eval`` plays like any run directory.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

from rlbalance.bench.trainer import workload_config
from rlbalance.telemetry.metrics import with_gaps

MILESTONES = (-15.0, 18.0)


def _train_curve(cfg, steps: int, seed: int, out: Path, name: str) -> Path:
    """Train ``cfg`` for ``steps`` env steps under ``out``/runs, logging every 10 s; returns the run directory."""
    from rlbalance.runtime.train import train

    cfg = replace(cfg, run=replace(cfg.run, total_steps=steps, seed=seed, out_dir=str(out / "runs"),
                                   name=f"{name}-seed{seed}-{int(time.time())}", checkpoint_interval_s=300.0),
                  telemetry=replace(cfg.telemetry, tensorboard=True, log_interval_s=10.0))
    return Path(train(cfg)["run_dir"])


def run_curve(frames: int, seed: int, out: Path, extra: dict | None = None) -> dict:
    cfg = workload_config("pong", extra)
    return write_curve(_train_curve(cfg, frames // cfg.env.frameskip, seed, out, "pong-curve"), out)


def run_mujoco_curve(steps: int, seed: int, out: Path, workload: str = "halfcheetah",
                     extra: dict | None = None) -> dict:
    """A MuJoCo learning curve with the continuous preset: ``steps`` env steps; writes curve.json, .csv, .png."""
    run = _train_curve(workload_config(workload, extra), steps, seed, out, workload)
    return write_curve(run, out, milestones=(), stem="curve")


def _records(run: Path) -> list[dict]:
    recs = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill: the rest of the file is still good
            continue
    return recs


def _finite(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def write_curve(run: Path, out: Path, milestones: tuple[float, ...] = MILESTONES, stem: str = "pong-curve") -> dict:
    """Curve files (``stem``.json, .csv, .png) for run directory ``run`` in folder ``out``; returns the result
    without the curve. ``milestones``: the returns whose first crossing (frames, minutes) is recorded."""
    import torch

    recs = _records(run)
    cfg = json.loads((run / "config.json").read_text())
    # Wall time counted on across resumed sessions (each session's time_s starts at 0), as the report counts it.
    recs = [r for r in with_gaps(recs) if not r.get("gap")]
    rows = [{"frames": r["frames"], "wall_s": r["time_s"], "return": _finite(r.get("episode_return")),
             "entropy": _finite(r.get("loss/entropy")), "policy_lag": _finite(r.get("policy_lag")),
             "q_mean": _finite(r.get("loss/q_mean")), "td_abs": _finite(r.get("loss/td_abs")),
             "fps": _finite(r.get("fps"))} for r in recs]
    # R2D2: the mean of the last 100 games of the envs that explore at most 1% of the time (14 of 32 on the Atari
    # preset), apart from the exploring ones: what SEED and the R2D2 paper report is their least-exploring play.
    greedy = [_finite(r.get("episode_return_greedy")) for r in recs]
    if any(g is not None for g in greedy):
        for row, g in zip(rows, greedy):
            row["return_greedy"] = g
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    result = {
        "env": cfg["env"]["id"], "preset": cfg["run"].get("preset"), "seed": cfg["run"]["seed"],
        "agent": cfg["learner"].get("agent", "vtrace"), **curve_summary(rows, milestones),
        **greedy_summary(rows, milestones),
        "outcome": summary.get("outcome", "unfinished"), "run_dir": run.name,
        "learner": cfg["learner"], "actors": cfg["actors"], "env_config": cfg["env"],
        "curve": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, allow_nan=False))
    columns = {"return": "mean_return_last100", "entropy": "entropy", "q_mean": "q_mean", "td_abs": "td_abs",
               "policy_lag": "policy_lag"}
    if "final_return_greedy_last100" in result:
        columns["return_greedy"] = "greedy_mean_return_last100"
    cols = tuple(columns)
    (out / f"{stem}.csv").write_text(",".join(("frames", "wall_s", *columns.values())) + "\n" + "".join(
        f"{r['frames']},{r['wall_s']:.1f}," + ",".join(_csv(r[c]) for c in cols) + "\n" for r in rows))
    ckpts = sorted((run / "checkpoints").glob("ckpt-*.pt"))
    if ckpts:  # the final policy as a minimal run directory (config + model-only checkpoint) for `rlbalance eval`
        from rlbalance.core.jsonio import atomic_write_json
        from rlbalance.runtime.rundir import CHECKPOINT_FORMAT

        state = torch.load(ckpts[-1], map_location="cpu", weights_only=True)
        policy = out / "policy"
        (policy / "checkpoints").mkdir(parents=True, exist_ok=True)
        for old in (policy / "checkpoints").glob("ckpt-*.pt"):
            old.unlink()
        atomic_write_json(policy / "config.json", {**cfg, "run": {**cfg["run"], "out_dir": "runs"}})  # no host path
        name = ckpts[-1].name
        torch.save({"format": CHECKPOINT_FORMAT, "model": state["model"], "steps": state["steps"],
                    "updates": state["updates"], "identity": state.get("identity")}, policy / "checkpoints" / name)
        (policy / "checkpoints" / "latest").write_text(name)
        result["policy_dir"] = "policy"  # beside this file (a path of this machine would not travel)
        (out / f"{stem}.json").write_text(json.dumps(result, indent=1, allow_nan=False))
    _plot(rows, result, out / f"{stem}.png", milestones)
    return {k: v for k, v in result.items() if k not in ("curve", "learner", "actors", "env_config")}


def curve_summary(rows: list[dict], milestones: tuple[float, ...] = ()) -> dict:
    """What a curve file says of its rows (``frames``, ``wall_s``, ``return``, ``fps``): where it ended, its final
    and best mean return, the first crossing (frames, minutes) of each milestone, and its median FPS."""
    with_return = [row["return"] for row in rows if row["return"] is not None]
    crossed = {}
    for m in milestones:
        hit = next((row for row in rows if row["return"] is not None and row["return"] >= m), None)
        crossed[f"{m:+g}"] = {"frames": hit["frames"], "minutes": round(hit["wall_s"] / 60, 1)} if hit else None
    fps = sorted(row["fps"] for row in rows if row["fps"])
    return {"frames": rows[-1]["frames"] if rows else 0,
            "wall_minutes": round(rows[-1]["wall_s"] / 60, 1) if rows else 0.0,
            "final_return_last100": with_return[-1] if with_return else None,
            "best_return_last100": max(with_return, default=None), "milestones": crossed,
            "fps_median": fps[len(fps) // 2] if fps else None}


def greedy_summary(rows: list[dict], milestones: tuple[float, ...] = ()) -> dict:
    """For a run that kept its near-greedy envs' returns apart (R2D2, ``return_greedy``): their final and best mean
    of the last 100 games and the first crossing of each milestone; nothing for other runs."""
    if not any("return_greedy" in row for row in rows):
        return {}
    part = curve_summary([{**row, "return": row.get("return_greedy")} for row in rows], milestones)
    return {"final_return_greedy_last100": part["final_return_last100"],
            "best_return_greedy_last100": part["best_return_last100"], "milestones_greedy": part["milestones"]}


def _csv(x) -> str:
    return "" if x is None else f"{x:.4g}"


def _plot(rows: list[dict], result: dict, path: Path, milestones: tuple[float, ...] = MILESTONES) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pong = "Pong" in result["env"]
    from rlbalance.config.env_ids import is_atari

    # an Atari curve counts frames (4 per agent step), any other env's its env steps
    xlabel = "frames (millions)" if is_atari(result["env"]) else "env steps (millions)"
    rate = "FPS" if is_atari(result["env"]) else "steps/s"
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ret = [(r["frames"] / 1e6, r["wall_s"] / 60, r["return"]) for r in rows if r["return"] is not None]
    greedy = [(r["frames"] / 1e6, r["wall_s"] / 60, r["return_greedy"]) for r in rows
              if r.get("return_greedy") is not None]
    for ax, xi, label in ((axes[0][0], 0, xlabel),
                          (axes[0][1], 1, "wall time (minutes)")):
        ax.plot([p[xi] for p in ret], [p[2] for p in ret], color="C0", label="all envs")
        if greedy:
            ax.plot([p[xi] for p in greedy], [p[2] for p in greedy], color="C4",
                    label="envs exploring at most 1% (R2D2's least-exploring play)")
            ax.legend(loc="lower right", fontsize=8)
        for m in milestones:
            ax.axhline(m, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(label)
        ax.set_ylabel("mean return, last 100 games" if pong else "mean return, last 100 episodes")
        if pong:
            ax.set_ylim(-21.5, 21.5)
        ax.grid(alpha=0.3)
    axes[0][0].set_title(f"{result['env']}, {result.get('agent', 'vtrace')}, preset {result['preset']}, "
                         f"seed {result['seed']}")
    axes[0][1].set_title(f"median {result['fps_median'] or 0:,.0f} {rate} on this machine")
    ent = [(r["frames"] / 1e6, r["entropy"]) for r in rows if r["entropy"] is not None]
    if ent or not any(r.get("q_mean") is not None for r in rows):  # a policy-gradient agent: its entropy
        axes[1][0].plot([p[0] for p in ent], [p[1] for p in ent], color="C1")
        axes[1][0].set_ylabel("policy entropy (max ln 6 = 1.79)" if pong else "policy entropy (nats)")
    else:  # a value-based agent (R2D2): the mean Q of the batch and its mean absolute TD error, per update
        q = [(r["frames"] / 1e6, r["q_mean"]) for r in rows if r.get("q_mean") is not None]
        td = [(r["frames"] / 1e6, r["td_abs"]) for r in rows if r.get("td_abs") is not None]
        axes[1][0].plot([p[0] for p in q], [p[1] for p in q], color="C1", label="mean Q (rescaled)")
        axes[1][0].plot([p[0] for p in td], [p[1] for p in td], color="C3", label="mean |TD error|")
        axes[1][0].set_ylabel("learner batch (rescaled value units)")
        axes[1][0].legend(loc="best", fontsize=8)
    axes[1][0].set_xlabel(xlabel)
    axes[1][0].grid(alpha=0.3)
    lag = [(r["frames"] / 1e6, r["policy_lag"]) for r in rows if r["policy_lag"] is not None]
    axes[1][1].plot([p[0] for p in lag], [p[1] for p in lag], color="C2")
    axes[1][1].set_xlabel(xlabel)
    axes[1][1].set_ylabel("policy lag (learner updates)")
    axes[1][1].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _overshoot(result: dict, budget: float) -> float:
    """How far past a frame budget a run that stopped at it may log its last point: one batch of frames, from its
    recorded learner and env settings (0.1% of the budget where those are not recorded, or more)."""
    lrn, env = result.get("learner") or {}, result.get("env_config") or {}
    batch = (lrn.get("batch_size") or 0) * (lrn.get("unroll_length") or 0) * (env.get("frameskip") or 1)
    return max(batch, 0.001 * budget)


def plot_seeds(results: list[Path], path: Path, names: list[str] | None = None,
               title: str = "Pong with the Atari preset: seeds side by side", max_frames: float | None = None
               ) -> list[str]:
    """The curves of several pong-curve results (their pong-curve.json) on one figure: return against frames and
    against wall time, one line per seed (or per ``names``), with the +18 and -15 marks; ``max_frames``: cut the
    curves there (to compare runs of different lengths on the same budget; a run stopped at that budget logs its last
    point up to a batch past it, so a run's final point that close past the cut is kept, and its label reads the
    value its table does). Returns the legend's labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8 + 0.25 * len(results)), sharey=True)
    for i, p in enumerate(results):
        r = json.loads(Path(p).read_text())
        pts = [c for c in r["curve"] if c["return"] is not None]
        if max_frames is not None and pts:
            ended = pts[-1]["frames"] <= max_frames + _overshoot(r, max_frames)  # it stopped at this budget
            pts = [c for c in pts[:-1] if c["frames"] <= max_frames] + pts[-1:] if ended else \
                [c for c in pts if c["frames"] <= max_frames]
        name = names[i] if names else f"seed {r['seed']}"
        if max_frames is not None:
            low = r["milestones"].get("-15")
            label = f"{name} (-15 at {low['frames'] / 1e6:.2f}M frames; {pts[-1]['return']:+.1f} at " \
                    f"{pts[-1]['frames'] / 1e6:.1f}M)" if low and low["frames"] <= pts[-1]["frames"] else \
                    f"{name} ({pts[-1]['return']:+.1f} at {pts[-1]['frames'] / 1e6:.1f}M)"
        elif "+18" in r["milestones"]:
            hit = r["milestones"]["+18"]
            final = r["final_return_last100"]
            label = f"{name} (" + (f"+18 at {hit['frames'] / 1e6:.2f}M frames)" if hit else
                                   f"+18 not reached; {'-' if final is None else f'{final:+.1f}'} at the end)")
        else:  # a game without milestones: where it ended
            label = f"{name} ({pts[-1]['return']:,.1f} at {pts[-1]['frames'] / 1e6:.1f}M)" if pts else name
        a.plot([c["frames"] / 1e6 for c in pts], [c["return"] for c in pts], label=label)
        b.plot([c["wall_s"] / 60 for c in pts], [c["return"] for c in pts], label=name)
    marks = any("+18" in json.loads(Path(p).read_text())["milestones"] for p in results)
    for ax in (a, b):
        if marks:
            ax.axhline(18, color="gray", ls="--", lw=0.8)
            ax.axhline(-15, color="gray", ls=":", lw=0.8)
        ax.grid(alpha=0.3)
    a.set_xlabel("env frames (millions)")
    b.set_xlabel("wall time (minutes, this 2-vCPU machine)")
    a.set_ylabel("mean return, last 100 games")
    # the legend under both panels: a long label (an experiment's settings) would cover the curves or the axis
    handles, labels = a.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=1, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, min(0.45, 0.045 * len(labels) + 0.02), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return labels
