"""Run a benchmark and write its figures to a results folder (default bench/results).

  rlbalance bench trainer                      # CartPole and Pong, actor counts 1..cores
  rlbalance bench trainer --workloads cartpole --actors 1,2 --steps 300000
  rlbalance bench pong-curve                   # Pong with the Atari preset, 10M frames: curve, milestones, policy
  rlbalance bench pong-curve --from-run RUN    # the same files from a run made with rlbalance train
  rlbalance bench atari                        # Pong, Breakout, BeamRider, SpaceInvaders, Qbert: 10M frames each
  rlbalance bench atari --games Breakout --frames 10000000 --seed 2   # one game; a rerun resumes it
  rlbalance bench atari --games BeamRider --frames 2500000 --set env.episodic_life=true --out EXP
      --against bench/results/atari            # an experiment on the preset, against the preset's own run
  rlbalance bench atari-peer --games Pong --until 18 --against bench/results/pong-curve/pong-curve.json
                                               # the CleanRL-style PPO peer on EnvPool, same machine, same axes
  rlbalance bench mujoco-curve                 # HalfCheetah-v5 with the continuous preset, 1M steps: the curve
  rlbalance bench telemetry-overhead           # FPS with telemetry on against off, alternating runs
  rlbalance bench sweep                        # actor sweeps on CartPole and Pong, ratio analysis
  rlbalance bench soak --minutes 30            # memory flat and FPS steady over a long run
  rlbalance bench chaos --minutes 30           # actors killed, hung and crashed, the learner killed and resumed
  rlbalance bench planner                      # per workload: calibrate, sweep, the model's error on held-out points
  rlbalance bench ray                          # Ray actors against shared-memory actors, overhead per step
  rlbalance bench seeds --seeds 8              # CartPole learning over seeds with the default config
  rlbalance bench memory --seeds 2             # CartPole without velocities: an LSTM core against feed-forward
  rlbalance bench memory --set learner.agent=r2d2   # the same with R2D2
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=["trainer", "pong-curve", "atari", "atari-peer", "mujoco-curve", "telemetry-overhead", "sweep", "soak",
                                         "chaos", "planner", "ray", "seeds", "memory", "balance",
                                         "balance-sim"],
                   help="which benchmark")
    p.add_argument("--out", default="bench/results", help="results folder")
    p.add_argument("--workloads", default="", help="trainer: comma-separated workloads (default cartpole,pong; "
                   "also synthetic, halfcheetah; cartpole-previous and pong-previous: the settings before each preset, "
                   "to measure what the preset costs in the same run; cartpole-r2d2 and pong-r2d2: the same envs "
                   "with learner.agent=r2d2; pong-r2d2-bf16: with its torso under bfloat16); planner: the workloads "
                   "to validate on (default all: cartpole, acrobot, acrobot-actor-inference, cartpole-large-model, "
                   "pendulum, synthetic-20us, synthetic-300us, pong, and cartpole-envs, acrobot-envs, pong-envs: "
                   "envs per actor swept at 2 actors; or any env id, e.g. MountainCar-v0, with its family's preset)")
    p.add_argument("--actors", default="", help="trainer: actor counts, e.g. 1,2,3 (default 1..2x usable CPUs)")
    p.add_argument("--steps", type=int, default=0, help="mujoco-curve: env steps (default 1M); trainer: env steps per end-to-end run "
                   "(default 500k CartPole, 25k Pong, 60k HalfCheetah); seeds: env steps per run (default 500k)")
    p.add_argument("--seconds", type=float, default=0.0, help="trainer: seconds per ceiling measurement (default 5); "
                   "planner: seconds per sweep run (default 30)")
    p.add_argument("--frames", type=int, default=10_000_000, help="pong-curve, atari: frames to train (per game)")
    p.add_argument("--games", default="", help="atari: comma-separated ALE game names (default Pong,Breakout,"
                   "BeamRider,SpaceInvaders,Qbert); each trains in OUT/atari/runs/GAME-seedN, resumed by a rerun")
    p.add_argument("--against", default="", help="atari-peer: comma-separated curve files of our runs "
                   "(pong-curve.json, curve.json) drawn with the peer's on one figure (OUT/atari-peer/GAME/vs-ours.png); "
                   "atari: the folder of another bench atari (e.g. bench/results/atari), each game's return there at "
                   "the frames reached here, OUT/atari/compare.md and GAME/vs-against.png (an experiment with --set "
                   "against the preset)")
    p.add_argument("--until", type=float, default=None, help="atari-peer: stop a game once the mean return of "
                   "its last 100 games reaches this (e.g. 18 for Pong), else at --frames")
    p.add_argument("--table-only", action="store_true", help="atari: rewrite the table and figure from the curves "
                   "in OUT/atari, training nothing")
    p.add_argument("--seed", type=int, default=1, help="pong-curve, mujoco-curve, chaos: run.seed (chaos: and the fault schedule)")
    p.add_argument("--fault-every", type=float, default=0.0, help="chaos: mean seconds between injected faults "
                   "(default: a 90th of the run)")
    p.add_argument("--from-run", metavar="RUN_DIR", help="pong-curve: write the curve files of an existing run "
                   "directory instead of training")
    p.add_argument("--repeats", type=int, default=0, help="telemetry-overhead: runs each way (default 4); planner: "
                   "runs per sweep point (default 1)")
    p.add_argument("--minutes", type=float, default=30.0, help="soak, chaos: minutes of training")
    p.add_argument("--auto-seconds", type=float, default=150.0, help="balance: seconds of each run.balance=auto run "
                   "and of each run.balance=ga3c run beside it (its second half is measured); --seconds: of each static "
                   "point (default 30), --repeats: runs a static point (default 1), --workloads: cartpole (default), "
                   "synthetic or pong")
    p.add_argument("--path", choices=["local", "ray", "ddp"], default="local",
                   help="chaos: the runtime path (local actor processes; Ray actors on a two-node cluster on "
                   "127.0.0.1, a worker node killed too; two learner processes, one killed)")
    p.add_argument("--no-baseline", action="store_true", help="chaos: skip the undisturbed reference run")
    p.add_argument("--seeds", type=int, default=0, help="seeds: runs per mode (seeds 0..N-1, default 8); memory: "
                   "seeds 1..N (default 2)")
    p.add_argument("--modes", default="central", help="seeds: comma-separated inference modes (central, actor)")
    p.add_argument("--set", metavar="SECTION.FIELD=VALUE", action="append", default=[],
                   help="seeds, pong-curve, atari, chaos (memory: only learner.agent): a config override on top of the defaults "
                   "(atari: on top of the Atari preset, for every game: an experiment on the preset; give it its own --out), "
                   "e.g. --set learner.max_grad_norm=2 "
                   "(repeatable)")


def run(args: argparse.Namespace) -> int:
    from rlbalance import config as C

    out = Path(args.out)
    if args.name == "telemetry-overhead":
        from rlbalance.bench.telemetry_overhead import run_overhead

        r = run_overhead(args.steps or 300_000, args.repeats or 4, out)
        print(f"telemetry overhead {r['overhead']:+.1%} (median {r['median_on']:,.0f} vs {r['median_off']:,.0f} SPS)")
        return 0
    if args.name == "ray":
        from rlbalance.bench.ray_overhead import run_ray_overhead

        print(f"wrote {run_ray_overhead(out, [w for w in args.workloads.split(',') if w and w != 'pong'] or ['cartpole'], [int(x) for x in args.actors.split(',') if x] or [1, 2, 4], args.steps or 150_000)}")
        return 0
    if args.name == "planner":
        from rlbalance.bench.planner_validation import parse_workloads, run_validation

        r = run_validation(out, [int(x) for x in args.actors.split(",") if x] or [1, 2, 3, 4], args.seconds or 30.0,
                           parse_workloads(args.workloads), repeats=args.repeats or 1)
        print(f"planner: median {r['median_abs_error']:.1%}, worst {r['worst_abs_error']:.1%} over {r['points']} points "
              f"of {r['workloads']} workloads (targets {'met' if r['met'] else 'NOT met'}); wrote "
              f"{out / 'planner' / 'planner-validation.md'}")
        return 0
    if args.name == "balance":
        from rlbalance.bench.balance import WORKLOADS, run_balance_bench

        workload = (args.workloads or "cartpole").split(",")[0]
        if workload not in WORKLOADS:
            raise SystemExit(f"--workloads {workload!r}: bench balance runs one of {sorted(WORKLOADS)}")
        extra = C.parse_set(args.set)
        C.build(extra)
        r = run_balance_bench(out, workload, args.auto_seconds, args.seconds or 30.0, args.repeats or 1, extra=extra)
        worst = min(a["of_best_static"] for a in r["auto"] if a["method"] == "auto")
        print(f"balance {workload}: worst auto run at {worst:.0%} of the best static layout; wrote "
              f"{out / 'balance' / f'balance-{workload}.md'}")
        return 0
    if args.name == "balance-sim":
        from rlbalance.bench.balance_sim import run_balance_sim

        cals = [Path(f"bench/results/planner/calibration-{w}.json") for w in (args.workloads or "pong,cartpole").split(",")]
        missing = [str(c) for c in cals if not c.is_file()]
        if missing:
            raise SystemExit(f"--workloads: no calibration {', '.join(missing)} (bench/results/planner/ has them)")
        run_balance_sim(out, cals, seeds=args.seeds or 3)
        print(f"wrote {out / 'balance' / 'simulation.md'}")
        return 0
    if args.name == "soak":
        from rlbalance.bench.soak import run_soak

        r = run_soak(args.minutes * 60, out, warmup_s=min(120.0, args.minutes * 60 / 4))
        print(f"soak: RSS growth {r['rss_growth']:+.1%}, FPS per-minute CV {r['fps_cv']}; wrote {out / 'soak.md'}")
        return 0
    if args.name == "chaos":
        from rlbalance.bench.chaos import run_chaos

        extra = C.parse_set(args.set)
        C.build(extra)  # a bad override fails here, naming the field, before any run
        r = run_chaos(args.minutes, out, seed=args.seed, fault_every_s=args.fault_every or None,
                      extra=[a for kv in args.set for a in ("--set", kv)], baseline=not args.no_baseline,
                      path=args.path)
        print(f"chaos: {'passed' if r['ok'] else 'FAILED'}; faults {r['faults']}; wrote {out / 'chaos.md'}")
        return 0 if r["ok"] else 1
    if args.name == "sweep":
        from rlbalance.bench.sweep_bench import run_bench_sweep

        print(run_bench_sweep(out, [int(x) for x in args.actors.split(",") if x] or [1, 2, 3, 4],
                              args.steps or 0, args.workloads or "cartpole,pong"))
        return 0
    if args.name == "seeds":
        from rlbalance.bench.seeds import run_seeds

        args.seeds = args.seeds or 8
        modes = [m for m in args.modes.split(",") if m]
        bad = [m for m in modes if m not in ("central", "actor")]
        if bad or not modes or args.seeds < 1:
            raise C.ConfigError(f"--modes {args.modes!r} / --seeds {args.seeds}: modes are central and/or actor, "
                                "seeds at least 1")
        extra = C.parse_set(args.set)
        C.build(extra)  # a bad override fails here, naming the field, before any run
        print(run_seeds(out, args.seeds, args.steps or 500_000, modes, extra=extra))
        return 0
    if args.name == "memory":
        from rlbalance.bench.memory import run_memory

        seeds = args.seeds or 2
        if seeds < 1:
            raise C.ConfigError(f"--seeds {seeds}: at least 1")
        extra = C.parse_set(args.set)
        agent = str(extra.get("learner", {}).get("agent", "vtrace"))
        C.build({"learner": {"agent": agent}})  # an unknown agent fails here, naming the field
        print(run_memory(out / ("recurrent" if agent == "vtrace" else f"recurrent-{agent}"), seeds,
                         args.steps or 150_000, agent=agent))
        return 0
    if args.name == "mujoco-curve":
        from rlbalance.bench.pong_curve import run_mujoco_curve, write_curve

        if args.from_run:
            print(write_curve(Path(args.from_run), out, milestones=(), stem="curve"))
        else:
            print(run_mujoco_curve(args.steps or 1_000_000, args.seed, out, extra=C.parse_set(args.set) or None))
        return 0
    if args.name == "atari":
        from rlbalance.bench.atari import GAMES, game_config, run_games, write_table

        games = tuple(g for g in args.games.split(",") if g) or GAMES
        extra = C.parse_set(args.set)
        for g in games:  # a bad override fails here, naming the field, before any run: on the Atari preset it runs on
            game_config(g, args.frames, args.seed, out / "atari" / "runs", extra)
        against = Path(args.against) if args.against else None
        if against is not None and not any((against / g / "curve.json").is_file() for g in games):
            raise C.ConfigError(f"--against {against}: no GAME/curve.json there for {', '.join(games)}; give the "
                                "folder of another bench atari (e.g. bench/results/atari)")
        doc = write_table(out / "atari", games) if args.table_only else run_games(games, args.frames, args.seed,
                                                                                    out / "atari", extra=extra)
        print(f"wrote {out / 'atari' / 'atari.md'} ({len(doc['games'])} rows)")
        if against is not None:
            from rlbalance.bench.atari import compare_with

            cmp = compare_with(out / "atari", against, games)
            print(f"wrote {out / 'atari' / 'compare.md'} ({len(cmp['games'])} games against {against})")
        return 0
    if args.name == "atari-peer":
        from rlbalance.bench.atari import run_peer

        against = [Path(a) for a in args.against.split(",") if a]
        missing = [str(a) for a in against if not a.is_file()]
        if missing:
            raise C.ConfigError(f"--against: no such curve file: {', '.join(missing)}")
        games = tuple(g for g in args.games.split(",") if g) or ("Pong",)
        for r in run_peer(games, args.frames, args.seed, out / "atari-peer", against=against,
                          until=args.until):
            print(f"[{r['game']} peer] {r['outcome']} at {r['frames']:,} frames, last-100 "
                  f"{r['final_return_last100']}, {r['wall_minutes']} min: {out / 'atari-peer' / r['game']}")
        return 0
    if args.name == "pong-curve":
        from rlbalance.bench.pong_curve import run_curve, write_curve

        if args.from_run:
            print(write_curve(Path(args.from_run), out))
        else:
            print(run_curve(args.frames, args.seed, out, extra=C.parse_set(args.set) or None))
        return 0
    from rlbalance.bench.trainer import DEFAULT_STEPS, WORKLOADS, run_workload, write_results

    from rlbalance.core.cpuinfo import usable_cpus

    counts = [int(x) for x in args.actors.split(",") if x] or list(range(1, 2 * usable_cpus() + 1))
    results = []
    for w in [w for w in (args.workloads or "cartpole,pong").split(",") if w]:
        if w not in WORKLOADS:
            from rlbalance.core.errors import ConfigError

            raise ConfigError(f"--workloads: unknown workload {w!r}; choose from {sorted(WORKLOADS)}")
        steps = args.steps or DEFAULT_STEPS.get(w, 500_000)
        results.append(run_workload(w, counts, steps, args.seconds or 5.0, out))
    print(f"wrote {write_results(results, out)}")
    return 0
