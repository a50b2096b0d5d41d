"""Atari games with the Atari preset, each for N frames (10M by default), against published figures at the same
frame count: one run directory per game and seed, resumed where an earlier invocation left it, its curve files, and
one table and figure over the games.

  rlbalance bench atari                                           # the five games, 10M frames, seed 1
  rlbalance bench atari --games Breakout,Qbert --frames 10000000 --seed 2
  rlbalance bench atari --table-only                              # rewrite the table from the curves there
  rlbalance bench atari-peer --games Pong                         # the PPO-EnvPool peer on the same machine

Long runs: start them from a git worktree at a fixed commit (``git worktree add ../runs-wt <commit>``) so that
edits to the checkout never touch a running job; an interrupted invocation (Ctrl-C, SIGTERM) keeps each run's last
checkpoint, and the next invocation with the same --out resumes it.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

GAMES = ("Pong", "Breakout", "BeamRider", "SpaceInvaders", "Qbert")

# Mean episode return at 10M frames (2.5M agent steps at frameskip 4) in published runs, read off their curves or
# logs (issue 29 lists them): (value, who). The same preset for every game: a game tuned apart is an example config
# (TUNED), whose run the table shows beside the preset's, labelled as tuned.
# Where they come from (checked 2026-12-07): CleanRL's and RLlib's tables are at 10M agent steps = 40M frames, so
# each anchor is its curve at x = 2.5M steps. RLlib IMPALA: one 2018 run per game, ray-project/rl-experiments
# atari-impala progress.csv, episode_reward_mean (Breakout 72 at 2.55M steps, BeamRider 566, SpaceInvaders 400,
# Qbert 850). CleanRL PQN (pqn_atari_envpool.py, 3 seeds, episodic life, full-game returns): read off its docs'
# plot, SpaceInvaders ~540, BeamRider ~2,450 with a wide seed band (~1,840 on the plot of its first version),
# Breakout ~50. CleanRL PPO: the 2022 docs plots of ppo_atari.py (Breakout ~60, BeamRider ~700).
#: games with a run tuned apart: the example config it was made with (its run: OUT/GAME-tuned/curve.json)
TUNED: dict[str, str] = {"SpaceInvaders": "examples/spaceinvaders-tuned.toml"}

ANCHORS: dict[str, list[tuple[float, str]]] = {
    "Pong": [(16.5, "CleanRL PPO")],
    "Breakout": [(60.0, "CleanRL PPO"), (72.0, "RLlib IMPALA, 32 workers"), (50.0, "CleanRL PQN")],
    "BeamRider": [(700.0, "CleanRL PPO"), (570.0, "RLlib IMPALA"), (2000.0, "CleanRL PQN")],
    "SpaceInvaders": [(400.0, "RLlib IMPALA"), (550.0, "CleanRL PQN")],
    "Qbert": [(850.0, "RLlib IMPALA")],
}


def _check_games(games: tuple[str, ...]) -> None:
    for game in games:
        if game not in ANCHORS:
            from rlbalance.core.errors import ConfigError

            raise ConfigError(f"--games: {game!r} has no published anchor here; one of {list(ANCHORS)}")


def env_id(game: str) -> str:
    return f"ALE/{game}-v5"


def game_config(game: str, frames: int, seed: int, runs: Path, extra: dict | None = None):
    from rlbalance import config as C

    cfg = C.build(C.merge({"env": {"id": env_id(game)}, "run": {"seed": seed, "out_dir": str(runs)},
                           "telemetry": {"progress": True, "tensorboard": True, "log_interval_s": 10.0}},
                          extra or {}))
    return replace(cfg, run=replace(cfg.run, total_steps=frames // cfg.env.frameskip, name=f"{game}-seed{seed}",
                                    checkpoint_interval_s=300.0))


def train_game(game: str, frames: int, seed: int, out: Path, progress=print, extra: dict | None = None) -> Path:
    """The game's run directory under ``out``/runs, trained to ``frames`` (a new run, or the unfinished one
    resumed; a finished one is left as it is). ``extra``: config overrides on top of the preset (a new run only;
    a resumed run keeps its own config)."""
    from rlbalance.runtime.train import train

    cfg = game_config(game, frames, seed, out / "runs", extra)
    run = Path(cfg.run.out_dir) / cfg.run.name
    summary = run / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("outcome") == "completed" and \
            json.loads(summary.read_text()).get("steps", 0) >= cfg.run.total_steps:
        progress(f"[{game}] already trained to {frames:,} frames: {run}")
        return run
    if (run / "config.json").is_file():
        progress(f"[{game}] resuming {run}")
        from rlbalance import config as C
        from rlbalance.runtime.rundir import RunDir

        base = RunDir(run).read_config().to_dict()
        train(C.build(C.merge(base, {"run": {"total_steps": cfg.run.total_steps}})), resume=run)
    else:
        progress(f"[{game}] training {frames:,} frames, seed {seed}: {run}")
        train(cfg)
    return run


def write_table(out: Path, games: tuple[str, ...] = GAMES) -> dict:
    """atari.json, atari.md and atari.png from the games' curve files in ``out``/GAME/curve.json; where the peer
    ran on a game (``out``/../atari-peer/GAME/curve.json, ``rlbalance bench atari-peer``), its result at the
    frames it reached beside ours."""
    from rlbalance.core.jsonio import atomic_write_json

    rows, curves = [], []  # curves: (ours, the peer's or None) per row, for the figure
    for game in games:
        peer_path = out.parent / "atari-peer" / game / "curve.json"
        peer = json.loads(peer_path.read_text()) if peer_path.is_file() else None
        for folder, setting in ((game, "preset"), (f"{game}-tuned", f"tuned: {TUNED.get(game, '?')}")):
            path = out / folder / "curve.json"
            if not path.is_file():
                continue
            r = json.loads(path.read_text())
            anchors = ANCHORS.get(game, [])
            best = max(anchors, default=None)
            final = r["final_return_last100"]
            curves.append((r["curve"], peer["curve"] if peer else None))
            rows.append({"game": game, "setting": setting, "seed": r["seed"], "frames": r["frames"],
                         "final_return_last100": final, "best_return_last100": r["best_return_last100"],
                         "wall_minutes": r["wall_minutes"], "fps_median": r["fps_median"], "outcome": r["outcome"],
                         "anchors": [{"value": v, "source": s} for v, s in anchors],
                         "best_anchor": {"value": best[0], "source": best[1]} if best else None,
                         "at_or_above_best": (final is not None and best is not None and final >= best[0]),
                         "peer": {k: peer[k] for k in ("seed", "frames", "final_return_last100", "wall_minutes",
                                                       "fps_median", "outcome")} if peer else None})
    doc = {"benchmark": "atari", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "games": rows}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "atari.json", doc)
    lines = ["# Atari with the Atari preset against published figures at the same frames", "",
             "Mean return of the last 100 games (sticky actions off, as the preset has them). Anchors: published "
             "runs at 10M frames (rlbalance/bench/atari.py names them). Each game's headline row is the Atari "
             "preset, one setting for every game; a row marked *tuned* is that game run with an example config "
             "over the preset (the file named), not the preset's result.", "",
             "| game | setting | seed | frames | final last-100 | best last-100 | anchors at 10M frames |"
             " at or above the best | wall time (min) | median FPS | PPO-EnvPool peer, this machine |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        anchors = "; ".join(f"{a['value']:g} ({a['source']})" for a in r["anchors"]) or "-"
        mark = "yes" if r["at_or_above_best"] else "no"
        tuned = r["setting"] != "preset"
        game = f"{r['game']}, *tuned*" if tuned else f"**{r['game']}**"
        setting = f"`{r['setting'].removeprefix('tuned: ')}`" if tuned else "Atari preset"
        lines.append(f"| {game} | {setting} | {r['seed']} | {r['frames'] / 1e6:.2f}M | "
                     f"{_f(r['final_return_last100'])} | {_f(r['best_return_last100'])} | {anchors} | {mark} | "
                     f"{r['wall_minutes']:.0f} | {_f(r['fps_median'], 0)} | {_peer(r['peer'])} |")
    (out / "atari.md").write_text("\n".join(lines) + "\n")
    if rows:
        _plot(out, rows, curves)
    return doc


def return_at(curve: list[dict], frames: float) -> float | None:
    """A curve's last-100 mean at the last point at or before ``frames`` (None before its first game ended)."""
    pts = [c for c in curve if c["return"] is not None and c["frames"] <= frames]
    return pts[-1]["return"] if pts else None


def compare_with(out: Path, against: Path, games: tuple[str, ...] = GAMES) -> dict:
    """An experiment on the preset (``bench atari --set ...`` into ``out``) against other runs of the same games
    (``against``: another ``bench atari`` folder, e.g. bench/results/atari): per game, each run's last-100 mean at
    the frames this one reached, and both curves cut there on one figure (``out``/GAME/vs-against.png);
    compare.json and compare.md in ``out``."""
    from rlbalance.bench.pong_curve import plot_seeds
    from rlbalance.core.jsonio import atomic_write_json

    rows = []
    for game in games:
        mine, theirs = out / game / "curve.json", against / game / "curve.json"
        if not (mine.is_file() and theirs.is_file()):
            continue
        a, b = json.loads(mine.read_text()), json.loads(theirs.read_text())
        frames = a["frames"]
        rows.append({"game": game, "frames": frames, "return": return_at(a["curve"], frames),
                     "against_return": return_at(b["curve"], frames), "against_frames": b["frames"],
                     "seed": a["seed"], "against_seed": b["seed"], "overrides": _overrides(out, game, a["seed"]),
                     "against_overrides": _overrides(against, game, b["seed"]), "fps_median": a["fps_median"],
                     "against_fps_median": b["fps_median"]})
        r = rows[-1]
        names = [f"{_label(r['against_overrides'], game)} (seed {b['seed']})",
                 f"{_label(r['overrides'], game)} (seed {a['seed']})"]
        plot_seeds([theirs, mine], out / game / "vs-against.png", names=names,
                   title=f"{game}: {names[1]} against {names[0]}", max_frames=frames)
    doc = {"benchmark": "atari-compare", "against": against.name, "games": rows}
    atomic_write_json(out / "compare.json", doc)
    lines = ["# Atari: an experiment on the preset against other runs of the same games, at the frames it reached", "",
             "| game | frames | this run | last-100 here | against | last-100 there, same frames | seeds |"
             " median FPS here / there |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['game']} | {r['frames'] / 1e6:.2f}M | {_label(r['overrides'], r['game'])} | "
                     f"{_f(r['return'])} | {_label(r['against_overrides'], r['game'])} | {_f(r['against_return'])} | "
                     f"{r['seed']} / {r['against_seed']} | {_f(r['fps_median'], 0)} / "
                     f"{_f(r['against_fps_median'], 0)} |")
    (out / "compare.md").write_text("\n".join(lines) + "\n")
    return doc


def _label(overrides: dict | None, game: str = "") -> str:
    """A run's settings as changes from what ``bench atari`` runs for its game now (the preset)."""
    if overrides is None:
        return "?"
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "the preset"


def _overrides(folder: Path, game: str, seed: int) -> dict | None:
    """The settings a game's run in a ``bench atari`` folder changed from the preset (``--set``), read from its run
    directory's config or, where only the results are kept, its policy's; None where neither is there."""
    found = [p for p in (folder / "runs" / f"{game}-seed{seed}" / "config.json", folder / game / "policy" /
                         "config.json") if p.is_file()]
    if not found:
        return None
    path = found[0]
    cfg = json.loads(path.read_text())
    base = game_config(game, 10_000_000, seed, path.parent)
    base = json.loads(json.dumps(base.to_dict()))  # (as config.json has it: lists, not tuples)
    # every section a --set can change, but not where the run went, how it reported, or what it resolved per machine
    sections = [s for s in base if isinstance(base[s], dict) and s not in ("run", "telemetry", "resolved")]
    return {f"{sec}.{k}": v for sec in sections for k, v in cfg.get(sec, {}).items()
            if base[sec].get(k) != v}


def _peer(p: dict | None) -> str:
    if not p:
        return "-"
    return (f"{_f(p['final_return_last100'])} at {p['frames'] / 1e6:.2f}M frames, {p['wall_minutes']:.0f} min, "
            f"{_f(p['fps_median'], 0)} FPS ({p['outcome']})")


def _f(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _plot(out: Path, rows: list[dict], curves: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(3.4 * len(rows), 3.2), squeeze=False)
    for ax, r, (ours, peer_curve) in zip(axes[0], rows, curves):
        pts = [(c["frames"] / 1e6, c["return"]) for c in ours if c["return"] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color="C0", label="rlbalance")
        if peer_curve:
            peer = [(c["frames"] / 1e6, c["return"]) for c in peer_curve if c["return"] is not None]
            ax.plot([p[0] for p in peer], [p[1] for p in peer], color="C7", label="PPO-EnvPool peer, this machine")
        for i, a in enumerate(r["anchors"]):
            ax.axhline(a["value"], color=f"C{i + 1}", ls="--", lw=0.9, label=a["source"])
        tuned = "" if r["setting"] == "preset" else ", tuned"
        ax.set_title(f"{r['game']}{tuned} (seed {r['seed']})", fontsize=9)
        ax.set_xlabel("frames (millions)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("mean return, last 100 games", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "atari.png", dpi=110)
    plt.close(fig)


def run_peer(games: tuple[str, ...], frames: int, seed: int, out: Path, progress=print,
             against: list[Path] | None = None, until: float | None = None) -> list[dict]:
    """The CleanRL-style PPO peer (``rlbalance.bench.ppo_envpool.ppo_envpool_atari``) on each game, on this
    machine: its state in ``out``/runs/GAME-seedN/state.pt (resumed by a rerun; SIGTERM or Ctrl-C saves it and
    stops), its curve in ``out``/GAME/curve.json, .csv, .png in the format of ours. ``against``: curve files of
    our runs (pong-curve.json or curve.json) drawn with the peer's on one figure, ``out``/GAME/vs-ours.png.
    ``until``: stop a game once the mean of its last 100 games reaches it (Pong: 18), else at ``frames``."""
    import signal

    from rlbalance.bench.ppo_envpool import ppo_envpool_atari

    _check_games(games)
    stopping = []

    def _stop(signum, frame):
        stopping.append(signum)

    old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    results = []
    try:
        for game in games:
            state = out / "runs" / f"{game}-seed{seed}" / "state.pt"
            progress(f"[{game} peer] {frames:,} frames, seed {seed}: {state.parent}")
            run = ppo_envpool_atari(game, frames, seed, state, progress=progress, stop=lambda: bool(stopping),
                                    until=until)
            results.append(write_peer_curve(run, out / game, against=against))
            if stopping:
                break
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return results


def write_peer_curve(run: dict, out: Path, against: list[Path] | None = None) -> dict:
    """curve.json, .csv and .png of a peer run (as ``ppo_envpool_atari`` returns it), with the fields of our
    curve files (so the table and ``plot_seeds`` read both); with ``against``, vs-ours.png too."""
    from rlbalance.bench.pong_curve import MILESTONES, curve_summary, plot_seeds
    from rlbalance.bench.ppo_envpool import PEER_STATS
    from rlbalance.core.cpuinfo import cpu_model
    from rlbalance.core.jsonio import atomic_write_json

    rows = run["curve"]
    doc = {"benchmark": "atari-peer", "peer": "CleanRL-style PPO on EnvPool, one process "
           "(rlbalance/bench/ppo_envpool.py: ppo_envpool_atari)", "env": f"{run['game']}-v5 (EnvPool)",
           "game": run["game"], "seed": run["seed"],
           **curve_summary(rows, MILESTONES if run["game"] == "Pong" else ()),
           # where it stopped, which a stop between two curve rows leaves past the last row
           "frames": run["frames"], "wall_minutes": round(run["wall_s"] / 60, 1),
           "outcome": run["outcome"], "cpu": cpu_model(), "settings": run["settings"], "curve": rows}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "curve.json", doc)
    # (the update measures: rows from before the peer recorded them have none)
    (out / "curve.csv").write_text(",".join(("frames,wall_s,mean_return_last100,fps", *PEER_STATS)) + "\n" + "".join(
        f"{r['frames']},{r['wall_s']:.1f},{'' if r['return'] is None else round(r['return'], 3)},{r['fps']:.0f},"
        + ",".join("" if r.get(k) is None else f"{r[k]:.4g}" for k in PEER_STATS) + "\n" for r in rows))
    name = f"PPO-EnvPool peer (seed {run['seed']})"
    plot_seeds([out / "curve.json"], out / "curve.png", names=[name],
               title=f"{run['game']}: the CleanRL-style PPO peer on EnvPool, this machine")
    if against:
        plot_seeds([*against, out / "curve.json"], out / "vs-ours.png",
                   names=[f"rlbalance ({json.loads(Path(p).read_text()).get('agent', 'vtrace')}, seed "
                          f"{json.loads(Path(p).read_text())['seed']})" for p in against] + [name],
                   title=f"{run['game']}: rlbalance against the PPO-EnvPool peer")
    return {k: v for k, v in doc.items() if k != "curve"}


def run_games(games: tuple[str, ...], frames: int, seed: int, out: Path, progress=print,
              extra: dict | None = None) -> dict:
    from rlbalance.bench.pong_curve import MILESTONES, write_curve

    _check_games(games)
    for game in games:
        run = train_game(game, frames, seed, out, progress, extra)
        write_curve(run, out / game, milestones=MILESTONES if game == "Pong" else (), stem="curve")
    return write_table(out, games)
