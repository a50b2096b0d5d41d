"""Config fields as command-line options, generated from the config dataclasses' docs."""

from __future__ import annotations

import argparse

from .. import config as C


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML or YAML config file (defaults < file < command line).")
    p.add_argument("--set", metavar="SECTION.FIELD=VALUE", action="append", default=[],
                   help="Override any field, e.g. --set learner.batch_size=128 (repeatable).")
    for sec, name, default, doc in C.field_docs():
        group = p.add_argument_group(sec) if not hasattr(p, f"_grp_{sec}") else getattr(p, f"_grp_{sec}")
        setattr(p, f"_grp_{sec}", group)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        group.add_argument(f"--{sec}.{name}", dest=f"cfg__{sec}__{name}", metavar="V", default=None,
                           help=f"{doc} [default: {shown}]")


def cli_overrides(args: argparse.Namespace) -> dict:
    out = C.parse_set(args.set)
    for key, value in vars(args).items():
        if key.startswith("cfg__") and value is not None:
            _, sec, name = key.split("__")
            out.setdefault(sec, {})[name] = value
    return out


def load_config(args: argparse.Namespace) -> C.Config:
    return C.load(args.config, cli_overrides(args))
