"""The user's env modules (env.imports, and the module of a 'module:EnvId' id): imported in every process that
makes the env, before gymnasium.make."""

from __future__ import annotations

import sys

import gymnasium as gym

from rlbalance.core.errors import ConfigError


def import_user_modules(cfg) -> str:
    """``cfg``: anything with ``id`` and ``imports`` (an EnvConfig). Import env.imports and the module of a 'module:EnvId' id (as gymnasium.make would); the bare EnvId."""
    import importlib

    env_id = cfg.id.partition(":")[2] if ":" in cfg.id else cfg.id
    for m in user_modules(cfg):
        try:
            importlib.import_module(m)
        except ImportError as e:
            field = "env.id" if ":" in cfg.id and m == cfg.id.partition(":")[0] else "env.imports"
            raise ConfigError(f"{field}: cannot import module {m!r} ({e}); put it on PYTHONPATH (or install it), "
                              "so the learner and every actor can import it") from e
    if ":" in cfg.id and env_id not in gym.registry:
        # 'module:Name' where Name is an env class, or an env-creating function the module registers with gymnasium,
        # rather than a registered id: register it as 'module.Name' in this process (every actor does the same).
        # Nothing else is called: a name from a config file is no licence to call any function of any module.
        module = cfg.id.partition(":")[0]
        obj = sys.modules[module]
        for part in env_id.split("."):
            obj = getattr(obj, part, None)
        if not is_env_maker(obj, module, env_id):
            raise ConfigError(f"env.id={cfg.id!r}: {env_id} in module {module} is neither a registered env id, an env "
                              "class (a gymnasium.Env subclass) nor a function the module registers with "
                              f"gymnasium.register(..., entry_point={env_id}); rlbalance calls nothing else")
        gym_id = f"{module}.{env_id}"
        if gym_id not in gym.registry:
            gym.register(gym_id, entry_point=obj)
        return gym_id
    return env_id


def is_env_maker(obj, module: str, name: str) -> bool:
    """Whether ``obj`` (``module``'s attribute ``name``) may make envs: a gymnasium.Env subclass, or a function
    the module registers with gymnasium as an entry point."""
    if isinstance(obj, type):
        return issubclass(obj, gym.Env)
    if not callable(obj):
        return False
    return any(spec.entry_point is obj or spec.entry_point == f"{module}:{name}" for spec in gym.registry.values())


def user_modules(cfg) -> list[str]:
    """env.imports, then the module of a 'module:EnvId' id."""
    return list(cfg.imports) + ([cfg.id.partition(":")[0]] if ":" in cfg.id else [])


def user_module_dirs(cfg) -> list[str]:
    """The folders this process imports env.imports and a 'module:EnvId' module from (for processes that do
    not inherit its sys.path, such as Ray workers on this machine)."""
    import importlib.util
    import os

    dirs = []
    for name in user_modules(cfg):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
            continue
        top = os.path.dirname(spec.origin)
        for _ in range(name.count(".") + (1 if spec.submodule_search_locations else 0)):
            top = os.path.dirname(top)  # the folder that holds the top-level package
        if top not in dirs:
            dirs.append(top)
    return dirs
