"""What a config may make rlbalance import: the trust boundary of run directories and config files.

Three fields name Python code that rlbalance imports, and whose import runs that code: ``env.id`` as
``module:Name``, ``env.imports``, and ``learner.agent`` as ``module:Agent``. The command line (and Python code
calling ``config.build``) is the user's own word; a run directory's config.json or a config file may come from
anyone (a shared run, a policy downloaded with its run directory, a config file on a shared filesystem). So a value
of these fields read from a file is shown and refused, before anything is imported, unless the user confirms it:
``--trust-modules``, or the same field given on the command line (whose value is then the one used).
"""

from __future__ import annotations

from typing import Any

from rlbalance.core.errors import ConfigError

TRUST_FLAG = "--trust-modules"


def code_fields(layer: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
    """The fields of one config layer that name modules to import: (``section.field``, value)."""
    env, learner = layer.get("env") or {}, layer.get("learner") or {}
    out: list[tuple[str, Any]] = []
    if isinstance(env.get("id"), str) and ":" in env["id"]:
        out.append(("env.id", env["id"]))
    if env.get("imports"):
        out.append(("env.imports", env["imports"]))
    if isinstance(learner.get("agent"), str) and ":" in learner["agent"]:
        out.append(("learner.agent", learner["agent"]))
    return out


def confirm_code(source: str, layer: dict[str, dict[str, Any]], cli: dict[str, dict[str, Any]] | None = None,
                 trusted: bool = False) -> None:
    """Refuse ``layer`` (read from ``source``: 'config.json of run directory X', 'config file Y') where it names
    modules to import that the command line does not give itself (``cli``), unless ``trusted`` (--trust-modules)."""
    if trusted:
        return
    cli = cli or {}
    named = [(f, v) for f, v in code_fields(layer) if f.partition(".")[2] not in (cli.get(f.partition(".")[0]) or {})]
    if not named:
        return
    shown = ", ".join(f"{f}={v!r}" for f, v in named)
    fields = " and ".join(f"--{f} yourself" for f, _ in named)
    raise ConfigError(f"{source} names Python modules to import, which would run their code: {shown}; nothing was "
                      f"imported. If you trust it, pass {TRUST_FLAG} (or give {fields} on the command line)")
