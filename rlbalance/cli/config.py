"""Show the config a run would use (or a run used), each value with the layer that set it.

The layers, lowest first: the field defaults; the preset (run.preset: the env family's settings, with the env's own,
the agent's own and the agent's on that family, each named); a resumed run's config.json; the --config file; the
command line. A value no layer gave as it stands was fitted by rlbalance (a preset's buffer count raised to the
actor layout given, run.preset=auto resolved to the family's preset).

Examples:
  rlbalance config show --env.id ALE/Pong-v5
  rlbalance config show --env.id ALE/Pong-v5 --learner.agent r2d2 --set learner.learning_rate=1e-4
  rlbalance config show --config my.toml --json
  rlbalance config show --resume runs/CartPole-v1-20261202-140000
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from rlbalance.cli.options import add_config_arguments, config_layers


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["show"], help="show: the effective config and the layer of every value")
    p.add_argument("--resume", metavar="RUN_DIR", help="a run's recorded config, with the options given here on top "
                   "(what train --resume RUN_DIR would use)")
    p.add_argument("--json", action="store_true", help="print JSON: {section: {field: {value, layer}}}")
    add_config_arguments(p)


def layered(args: argparse.Namespace) -> tuple[object, dict[str, dict[str, tuple[object, str]]]]:
    """The config ``train`` would build from these options, and for every field its value and the layer that set it."""
    from rlbalance import config as C
    from rlbalance.config.presets import layer_parts

    sources = config_layers(args, args.resume)
    cfg = C.build(C.merge(*(layer for _, layer in sources)))  # as train builds it (load_config)
    layers = [*layer_parts(cfg.run.preset, cfg.env.id, cfg.learner.agent), *sources]
    out: dict[str, dict[str, tuple[object, str]]] = {}
    for sec in C.SECTIONS:
        section = getattr(cfg, sec)
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            where = "default"
            for label, vals in layers:
                if f.name in (vals.get(sec) or {}):
                    given = vals[sec][f.name]
                    try:
                        same = C.coerce(sec, f.name, given) == value
                    except C.ConfigError:
                        same = False
                    where = label if same else f"fitted by rlbalance ({label} gave {given!r})"
            if where == "default" and f.default is not dataclasses.MISSING and f.default != value:
                where = f"fitted by rlbalance (the default is {f.default!r})"  # (run.preset=auto, resolved)
            out.setdefault(sec, {})[f.name] = (value, where)
    return cfg, out


def run(args: argparse.Namespace) -> int:
    cfg, table = layered(args)
    if args.json:
        from rlbalance.core.jsonio import dumps

        print(dumps({sec: {k: {"value": v, "layer": w} for k, (v, w) in fields.items()}
                     for sec, fields in table.items()}))
        return 0
    rows = [(f"{sec}.{k}", json.dumps(v) if isinstance(v, str) else ",".join(map(str, v)) if isinstance(v, tuple)
             else str(v), w) for sec, fields in table.items() for k, (v, w) in fields.items()]
    rows = [(n, v if v else "(none)", w) for n, v, w in rows]
    width = max(len(r[0]) for r in rows)
    vwidth = min(24, max(len(r[1]) for r in rows))
    print(f"{'field':<{width}}  {'value':<{vwidth}}  layer")
    for name, value, where in rows:
        print(f"{name:<{width}}  {value:<{vwidth}}  {where}")
    return 0
