"""Config fields as command-line options, generated from the config dataclasses' docs."""

from __future__ import annotations

import argparse
import typing

from rlbalance import config as C


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions and examples kept as written; an option's default shown once, and only if it has one."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        """Wrapped at spaces only: names with hyphens (workloads, env ids, options) stay whole."""
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, argparse.SUPPRESS, []) or "default" in text or action.default is False:
            return text
        return super()._get_help_string(action)


def _choices() -> dict[tuple[str, str], tuple[str, ...]]:
    from rlbalance.config.presets import PRESET_NAMES

    return {("env", "backend"): C.ENV_BACKENDS, ("env", "synthetic_cost"): ("busy", "sleep"),
            ("inference", "mode"): C.INFERENCE_MODES, ("learner", "device"): C.DEVICES,
            ("learner", "model"): C.MODELS, ("learner", "lr_schedule"): ("linear", "constant"),
            ("run", "mode"): C.MODES, ("run", "preset"): PRESET_NAMES, ("telemetry", "wandb"): C.WANDB_MODES}


def metavar(section: str, name: str) -> str:
    """What a field takes, for the help: its choices, or its type."""
    choices = _choices().get((section, name))
    if choices:
        return "{" + ",".join(choices) + "}"
    typ = typing.get_type_hints(C.SECTIONS[section])[name]
    if typing.get_origin(typ) is tuple:
        inner = typing.get_args(typ)[0]
        return f"{'INT' if inner is int else 'FLOAT' if inner is float else 'STR'},..."
    return {bool: "{true,false}", int: "INT", float: "FLOAT"}.get(typ, "STR")


def normalize_option(arg: str) -> str:
    """``--run.total-steps`` is ``--run.total_steps``: dashes and underscores both work in field names."""
    if arg.startswith("--") and "." in arg.split("=", 1)[0]:
        key, eq, value = arg[2:].partition("=")
        return "--" + key.replace("-", "_") + eq + value
    return arg


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else repr(value) if isinstance(value, str) else str(value)


def default_text(sec: str, name: str, default) -> str:
    """What a run uses for a field, each value once: a plain run's (CartPole-v1: the classic preset's value where it
    sets the field), another preset's where it differs from the default (presets with the same value named
    together), and the default otherwise; 'default: X' where no preset sets another value."""
    from rlbalance.config.presets import PRESETS, resolve

    plain = resolve("auto", C.EnvConfig.id)
    sets = {k: v[sec][name] for k, v in PRESETS.items() if name in v.get(sec, {})}
    others = {k: v for k, v in sets.items() if k != plain and v != default}
    if not others and sets.get(plain, default) == default:
        return f"default: {_shown(default)}"
    said: dict[str, list[str]] = {}  # value -> who has it, in the order named
    said.setdefault(_shown(sets.get(plain, default)), []).append(
        f"in a plain run ({plain} preset, {C.EnvConfig.id})" if plain in sets else f"in a plain run ({C.EnvConfig.id})")
    presets: dict[str, list[str]] = {}
    for k, v in others.items():
        presets.setdefault(_shown(v), []).append(k)
    for v, names in presets.items():
        said.setdefault(v, []).append(f"with the {' and '.join(names)} preset{'s' if len(names) > 1 else ''}")
    said.setdefault(_shown(default), []).append("otherwise")
    return "; ".join(f"{v} {' and '.join(who)}" for v, who in said.items())


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML or YAML config file (defaults < preset < file < command "
                   "line).")
    p.add_argument("--trust-modules", action="store_true", help="import the modules a config file (or a resumed "
                   "run's config.json) names: env.id 'module:Name', env.imports, learner.agent 'module:Agent'. "
                   "Without it they are shown and refused, since importing a module runs its code and a file may "
                   "come from anyone; naming the same field on the command line confirms it too.")
    p.add_argument("--set", metavar="SECTION.FIELD=VALUE", action="append", default=[],
                   help="Override any field, e.g. --set learner.batch_size=128 (repeatable).")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for sec, name, default, doc in C.field_docs():
        if sec not in groups:
            what = (C.SECTIONS[sec].__doc__ or "").strip().splitlines()[0]
            groups[sec] = p.add_argument_group(f"{sec} options", what)
        groups[sec].add_argument(f"--{sec}.{name}", dest=f"cfg__{sec}__{name}", metavar=metavar(sec, name),
                                 default=None, help=f"{doc} ({default_text(sec, name, default)})")


def suggest_option(parser: argparse.ArgumentParser, unknown: str) -> str | None:
    """The option of ``parser`` closest to a misspelled one (``--learner.lerning_rate``), if any is close."""
    import difflib

    names = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    close = difflib.get_close_matches(unknown.split("=", 1)[0], names, n=1, cutoff=0.75)
    return close[0] if close else None


def cli_overrides(args: argparse.Namespace) -> dict:
    out = C.parse_set(args.set)
    for key, value in vars(args).items():
        if key.startswith("cfg__") and value is not None:
            _, sec, name = key.split("__")
            out.setdefault(sec, {})[name] = value
    return out


def config_layers(args: argparse.Namespace, resume: str | None = None) -> list[tuple[str, dict]]:
    """The layers a command line puts over the preset, lowest first, each with its name: a resumed run's
    config.json, the --config file, the command line; the modules the files name confirmed by the command line or
    --trust-modules. ``train`` builds its config from them, ``config show`` names them."""
    cli = cli_overrides(args)
    layers: list[tuple[str, dict]] = []
    if resume:
        from rlbalance.runtime.rundir import RunDir

        layers.append((f"config.json of {resume}", RunDir(resume).read_config(cli, args.trust_modules).to_dict()))
    if args.config:
        layers.append((f"config file {args.config}", C.read_file(args.config, cli, args.trust_modules)))
    layers.append(("command line", cli))
    return layers


def load_config(args: argparse.Namespace, resume: str | None = None) -> C.Config:
    """The config of a command line (over ``resume``'s recorded one where given), as ``train`` runs it."""
    return C.build(C.merge(*(layer for _, layer in config_layers(args, resume))))


def read_config_file(args: argparse.Namespace) -> dict:
    """The --config file's layer (empty without one), its modules confirmed by the command line or --trust-modules."""
    return C.read_file(args.config, cli_overrides(args), args.trust_modules) if args.config else {}
