# PYTHON_ARGCOMPLETE_OK
"""The rlbalance command line: one module per subcommand, a small dispatcher here."""

from __future__ import annotations

import argparse
import importlib
import sys

from rlbalance.cli.options import HelpFormatter, normalize_option, suggest_option
from rlbalance.core.errors import ConfigError

SUBCOMMANDS = {
    "train": "Train an agent (SEED-style central inference or IMPALA-style actor inference).",
    "profile": "Train briefly, then a torch.profiler kernel view of inference and training.",
    "config": "Show the effective config, each value with the layer that set it (defaults, preset, file, command line).",
    "eval": "Play whole games with a run's checkpoint (no learning) and report the returns.",
    "report": "Write a run's HTML report (plots, stage breakdown, verdict) and CSV files.",
    "sweep": "Run a design-space sweep of training runs into an SQLite database (resumable).",
    "ratio": "CPU/GPU ratio analysis of a sweep: knee, efficiency optimum, Pareto front.",
    "calibrate": "Microbenchmark one workload on this machine for the planner.",
    "plan": "Predict FPS, bottleneck, power and the best CPU/GPU ratio on other machines.",
    "bench": "Measure env ceiling, learner ceiling and end-to-end FPS; write bench/results.",
}


# Exit codes (documented in the README).
EXIT_COMPLETED = 0    # the command did what was asked (a training run reached run.total_steps or run.max_seconds)
EXIT_FAILED = 1       # training stopped on an error (NaN loss, actors failing, disk full); summary.json says why
EXIT_REFUSED = 2      # bad input, refused before any process started or anything was written
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: a started run wrote its final checkpoint, summary and report


def build_parser() -> tuple[argparse.ArgumentParser, dict, dict]:
    """The command line: the top-level parser, each subcommand's parser and module by name."""
    from rlbalance import __version__

    parser = argparse.ArgumentParser(
        prog="rlbalance", description="Train RL agents SEED-style on CPU-GPU machines, and measure and balance "
        "the machine: where the time goes, the bottleneck, and the best actor cores per accelerator.",
        epilog="rlbalance COMMAND --help describes a command's options.", allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"rlbalance {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    modules, parsers = {}, {}
    for name, help_text in SUBCOMMANDS.items():
        mod = importlib.import_module(f"rlbalance.cli.{name}")
        # no abbreviated options: --actors.num_actor is a typo to name (did you mean ...?), not --actors.num_actors
        p = sub.add_parser(name, help=help_text, description=mod.__doc__, formatter_class=HelpFormatter,
                           allow_abbrev=False)
        mod.add_arguments(p)
        positionals = [a.metavar or a.dest.upper() for a in p._actions if not a.option_strings]
        p.usage = " ".join(["%(prog)s", *positionals, "[OPTIONS]"])  # (argparse's own lists every option)
        modules[name] = mod
        parsers[name] = p
    return parser, parsers, modules


def main(argv: list[str] | None = None) -> int:
    parser, parsers, modules = build_parser()
    try:  # shell completion where argcomplete is installed: eval "$(register-python-argcomplete rlbalance)"
        import argcomplete
    except ImportError:
        pass
    else:
        argcomplete.autocomplete(parser)
    args, unknown = parser.parse_known_args([normalize_option(a) for a in (sys.argv[1:] if argv is None else argv)])
    if unknown:  # argparse would print the whole usage; name the option and the one meant instead
        sub_parser = parsers[args.command]
        close = suggest_option(sub_parser, unknown[0])
        print(f"{sub_parser.format_usage().strip()}\nrlbalance {args.command}: error: unrecognized argument "
              f"{unknown[0]}" + (f"; did you mean {close}?" if close else f" (see rlbalance {args.command} --help)"),
              file=sys.stderr)
        return EXIT_REFUSED
    from rlbalance.core.errors import DiskWriteError, NonFiniteLossError
    from rlbalance.runtime.actor_pool import ActorFailure, ActorStartFailure

    try:
        return int(modules[args.command].run(args) or 0)
    except ConfigError as e:
        print(f"rlbalance {args.command}: error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except ActorStartFailure as e:  # the actor's traceback once, then what it means; a new run leaves nothing
        if e.__cause__ is not None:
            print(str(e.__cause__).strip(), file=sys.stderr)
        print(f"rlbalance {args.command}: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except (NonFiniteLossError, ActorFailure, DiskWriteError) as e:
        print(f"rlbalance {args.command}: training stopped: {e}\nsummary.json in the run directory names the last "
              "good checkpoint; continue with --resume RUN_DIR once the cause is fixed.", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # before training started (a started run finishes its report and returns)
        print(f"rlbalance {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
