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


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML or YAML config file (defaults < file < command line).")
    p.add_argument("--set", metavar="SECTION.FIELD=VALUE", action="append", default=[],
                   help="Override any field, e.g. --set learner.batch_size=128 (repeatable).")
    for sec, name, default, doc in C.field_docs():
        group = p.add_argument_group(sec) if not hasattr(p, f"_grp_{sec}") else getattr(p, f"_grp_{sec}")
        setattr(p, f"_grp_{sec}", group)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        group.add_argument(f"--{sec}.{name}", dest=f"cfg__{sec}__{name}", metavar=metavar(sec, name), default=None,
                           help=f"{doc} (default: {shown!r})" if isinstance(shown, str)
                           else f"{doc} (default: {shown})")


def cli_overrides(args: argparse.Namespace) -> dict:
    out = C.parse_set(args.set)
    for key, value in vars(args).items():
        if key.startswith("cfg__") and value is not None:
            _, sec, name = key.split("__")
            out.setdefault(sec, {})[name] = value
    return out


def load_config(args: argparse.Namespace) -> C.Config:
    return C.load(args.config, cli_overrides(args))
