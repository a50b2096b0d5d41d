"""One frozen, typed, nested configuration for every rlbalance run.

Precedence, lowest to highest:

1. the defaults written in the dataclasses below;
2. a config file (``--config run.toml`` or ``.yaml``), nested by section;
3. command-line overrides (``--env.id ALE/Pong-v5`` or ``--set env.id=ALE/Pong-v5``).

Every field carries its documentation in ``metadata["doc"]``; the CLI help is generated from it.
All checks of values, and all derived values, live in ``Config.__post_init__`` and the section
``__post_init__`` methods, so bad input fails before any process starts, naming the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

from rlbalance.config.ray_section import RayConfig
from rlbalance.config.sections import (
    ActorsConfig,
    EnvConfig,
    InferenceConfig,
    LearnerConfig,
    R2D2Config,
    RunConfig,
    TelemetryConfig,
    _require,
)
from rlbalance.config.trust import confirm_code
from rlbalance.core.errors import ConfigError


@dataclass(frozen=True)
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    actors: ActorsConfig = field(default_factory=ActorsConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    r2d2: R2D2Config = field(default_factory=R2D2Config)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    run: RunConfig = field(default_factory=RunConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self) -> None:
        if self.ray.enabled:
            _require(self.run.mode == "parallel", "run.mode", self.run.mode,
                     "Ray actors need run.mode=parallel (or leave ray.address empty for serial)")
            _require(not self.actors.cpu_affinity, "actors.cpu_affinity", self.actors.cpu_affinity,
                     "pins local actor processes; with ray.address, give each Ray node its CPUs "
                     "(ray start --num-cpus N) and set ray.cpus_per_actor instead")
        if self.run.balance != "off":
            _require(self.run.mode == "parallel", "run.balance", self.run.balance,
                     "moves actor processes: it needs run.mode=parallel (or set run.balance=off)")
            _require(self.learner.devices == 1, "run.balance", self.run.balance,
                     "balances one learner's actors; with learner.devices > 1 use run.balance=off for now")
            _require(not self.actors.cpu_affinity, "run.balance", self.run.balance,
                     "moves actors across the cores itself; leave actors.cpu_affinity empty (or run.balance=off)")
        k = self.actors.envs_per_actor
        _require(self.learner.batch_size % k == 0, "learner.batch_size", self.learner.batch_size,
                 f"must be a multiple of actors.envs_per_actor={k}, since each actor buffer holds {k} unrolls "
                 f"(try {max(k, round(self.learner.batch_size / k) * k)})")
        if self.actors.buffers_per_actor:
            # A batch takes its buffers all at once: fewer in all never fill one. (From one batch up to a batch plus
            # one per group, the actors wait while the learner copies a batch out; the policy lag is the least.)
            need = self.buffers_per_batch
            _require(self.num_buffers >= need, "actors.buffers_per_actor", self.actors.buffers_per_actor,
                     f"{self.num_clients} env groups x {self.actors.buffers_per_actor} = {self.num_buffers} buffers; "
                     f"one learner batch takes {need} at once, so fewer never make a batch: raise it to "
                     f"{-(-need // self.num_clients)} or use 0")
        if self.inference.max_batch:
            _require(self.inference.max_batch >= k, "inference.max_batch", self.inference.max_batch,
                     f"must be 0 or >= actors.envs_per_actor={k} (one actor's envs go in one forward pass)")
        if self.learner.agent == "r2d2":
            self._check_r2d2()
        n = self.learner.devices
        if n > 1:
            _require(not (self.ray.enabled and self.ray.address == "local"), "ray.address", self.ray.address,
                     f"with learner.devices={n} each learner process joins one Ray cluster for its actors: start "
                     "one (`ray start --head`) and give its address, or use local actor processes (no ray.address)")
            _require(self.actors.num_actors % n == 0, "actors.num_actors", self.actors.num_actors,
                     f"must be a multiple of learner.devices={n}: each learner process serves an equal share of "
                     f"the actors (try {max(n, round(self.actors.num_actors / n) * n)})")
            try:
                self.rank_config(0)  # each learner process's own layout must hold
            except ConfigError as e:
                raise ConfigError(f"per learner process ({self.actors.num_actors // n} of the "
                                  f"{self.actors.num_actors} actors each, learner.devices={n}): {e}") from None

    def _check_r2d2(self) -> None:
        period, r = self.learner.unroll_length, self.r2d2
        for name in ("sequence_length", "burn_in"):
            v = getattr(r, name)
            _require(v % period == 0, f"r2d2.{name}", v, f"must be a multiple of learner.unroll_length={period} "
                     "(the replay period: sequences are made of whole consecutive unrolls)")
        _require(r.sequence_length >= period + r.n_step - 1, "r2d2.sequence_length", r.sequence_length,
                 f"must be at least learner.unroll_length + r2d2.n_step - 1 = {period + r.n_step - 1}, or the last "
                 "rows of every period never get a target")
        _require(not self.learner.normalize_observations, "learner.normalize_observations",
                 self.learner.normalize_observations, "is not supported with learner.agent=r2d2: set it to false")
        n = self.learner.devices
        _require(r.batch_size % n == 0, "r2d2.batch_size", r.batch_size,
                 f"must be a multiple of learner.devices={n} (each learner process samples an equal share of it)")

    @property
    def ddp(self) -> bool:
        """Whether this run has several learner processes (learner.devices > 1, on torch.distributed)."""
        return self.learner.devices > 1

    def rank_config(self, rank: int) -> "Config":
        """The config of learner process ``rank`` (data_parallel=ddp): its share of the actors, one device, and
        its own seed (so its envs differ from the other ranks')."""
        n = self.learner.devices
        aff = self.actors.cpu_affinity  # each rank's actors on their own slice of the cores given
        share = len(aff) // n
        if share:
            aff = aff[rank * share:(rank + 1) * share]
        return dataclasses.replace(
            self, actors=dataclasses.replace(self.actors, num_actors=self.actors.num_actors // n, cpu_affinity=aff),
            learner=dataclasses.replace(self.learner, devices=1, data_parallel="auto"),
            run=dataclasses.replace(self.run, seed=self.run.seed + 7919 * rank))

    @property
    def buffers_per_batch(self) -> int:
        return self.learner.batch_size // self.actors.envs_per_actor

    @property
    def num_clients(self) -> int:
        """Env groups in all: each fills its own buffers and is one client of the inference server."""
        return self.actors.num_actors * self.actors.env_groups

    @property
    def buffers_per_actor_process(self) -> int:
        """Unroll buffers each actor process owns (local actors hand buffers back and forth with the learner
        over their own pipe, so each buffer belongs to one actor)."""
        if self.actors.buffers_per_actor:
            return self.actors.env_groups * self.actors.buffers_per_actor
        return self.actors.env_groups + -(-2 * self.buffers_per_batch // self.actors.num_actors)

    @property
    def num_buffers(self) -> int:
        return self.actors.num_actors * self.buffers_per_actor_process

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]


def _field_type(section: type, name: str) -> Any:
    return typing.get_type_hints(section)[name]


def _list_of(text: str) -> list:
    """A list from the command line: JSON (``["a", "b"]``), or names with commas, in brackets or not (``[a,b]``,
    ``a,b``)."""
    t = text.strip()
    if t.startswith("["):
        try:
            return json.loads(t)
        except json.JSONDecodeError:
            t = t[1:-1] if t.endswith("]") else t[1:]
    return [v.strip().strip("'\"") for v in t.split(",") if v.strip()]


def coerce(section: str, name: str, value: Any) -> Any:
    """Turn a file or CLI value into the field's type, or raise ConfigError naming the field."""
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    if name not in hints:
        known = [f.name for f in dataclasses.fields(cls)]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        if close:
            raise ConfigError(f"unknown field {section}.{name}; did you mean {section}.{close[0]}?")
        raise ConfigError(f"unknown field {section}.{name}; {section} has: {', '.join(known)}")
    typ = hints[name]
    full = f"{section}.{name}"
    try:
        if typing.get_origin(typ) is tuple:
            (inner, *_rest) = typing.get_args(typ)
            if isinstance(value, str):
                value = _list_of(value)
            if not isinstance(value, (list, tuple)):
                raise TypeError
            return tuple(inner(v) for v in value)
        if typ is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
                return False
            raise TypeError
        if typ is int:
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, float) and not value.is_integer():
                raise TypeError
            if isinstance(value, str):
                value = value.replace("_", "")
                as_float = float(value)
                if not as_float.is_integer():
                    raise TypeError
                return int(as_float)
            return int(value)
        if typ is float:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if typ is str:
            if isinstance(value, dict) and cls.__dataclass_fields__[name].metadata.get("json_object"):
                return json.dumps(value, sort_keys=True)  # a config file's table
            if not isinstance(value, str):
                raise TypeError
            return value
    except (TypeError, ValueError, json.JSONDecodeError):
        tname = getattr(typ, "__name__", str(typ))
        raise ConfigError(f"{full}={value!r} is invalid: expected {tname}") from None
    raise ConfigError(f"{full}: unsupported type {typ}")


def env_id_of(make: Any) -> str:
    """The env.id ('module:QualName') of an env class or env-creating function, which every actor process
    imports by name; refused, with the reason, where it cannot be imported (lambdas, local definitions, the
    script being run or a notebook)."""
    module, name = getattr(make, "__module__", None), getattr(make, "__qualname__", "")
    if not module or "<" in name:
        raise ConfigError(f"env.id={make!r}: actor processes import the env by name, and {name or 'it'} has none "
                          "they can import (a lambda or a function defined inside another); define it at the top "
                          "level of a module")
    if module == "__main__":
        raise ConfigError(f"env.id={make!r} is defined in the script being run (or a notebook), which actor "
                          f"processes do not import; move {name} into a module on PYTHONPATH and import it from there")
    from rlbalance.config.user_modules import is_env_maker

    if not is_env_maker(make, module, name):
        raise ConfigError(f"env.id={make!r}: an env-creating function is taken only where its module registers it "
                          f"(gymnasium.register('MyEnv-v0', entry_point={name}) in {module}), so that no other "
                          "function can be named as an env; or give a gymnasium.Env subclass")
    return f"{module}:{name}"


def fit_buffers(a: ActorsConfig, lrn: LearnerConfig) -> ActorsConfig:
    """``a`` with buffers_per_actor raised, if below it, to the least with which every group still has a buffer to
    fill while the learner takes a batch (for a preset's value; a user's own is only checked)."""
    if not a.buffers_per_actor or lrn.batch_size % a.envs_per_actor:
        return a
    clients = a.num_actors * a.env_groups
    least = -(-(lrn.batch_size // a.envs_per_actor + clients) // clients)
    return dataclasses.replace(a, buffers_per_actor=least) if a.buffers_per_actor < least else a


def build(overrides: dict[str, dict[str, Any]] | None = None, preset_layer: bool = True) -> Config:
    """Build a Config from nested overrides {section: {field: value}} on top of the env family's preset
    (``run.preset``, see rlbalance/config/presets.py) on top of the defaults; ``preset_layer`` False: on the defaults
    alone (a recorded config, whose preset values are in it already), still naming ``run.preset``."""
    from rlbalance.config import presets

    overrides = overrides or {}
    if callable((overrides.get("env") or {}).get("id")):  # an env class or function, from Python
        overrides = {**overrides, "env": {**overrides["env"], "id": env_id_of(overrides["env"]["id"])}}
    env_id = coerce("env", "id", (overrides.get("env") or {}).get("id", EnvConfig.id))
    name = coerce("run", "preset", (overrides.get("run") or {}).get("preset", RunConfig.preset))
    imports = tuple(coerce("env", "imports", (overrides.get("env") or {}).get("imports", EnvConfig.imports)))
    name = presets.resolve(name, env_id, imports)  # an unknown name has no layer; RunConfig refuses it by name
    agent = coerce("learner", "agent", (overrides.get("learner") or {}).get("agent", LearnerConfig.agent))
    user, layer = overrides, presets.layer(name, env_id, agent) if preset_layer else {}
    # a buffer count given by the user (a config file, the command line) is kept as given (it is checked)
    user_buffers = "buffers_per_actor" in (overrides.get("actors") or {})
    overrides = merge(layer, overrides, {"run": {"preset": name}})
    try:
        sections = {}
        for sec, cls in SECTIONS.items():
            vals = {k: coerce(sec, k, v) for k, v in (overrides.get(sec) or {}).items()}
            sections[sec] = cls(**vals)
        if not user_buffers:
            # A preset's buffer count (kept low to bound policy lag) fits its own actor layout; with fewer actors or
            # groups given on top of it, raise it to the least that does not stall (a user's own value is checked).
            sections["actors"] = fit_buffers(sections["actors"], sections["learner"])
        unknown = set(overrides) - set(SECTIONS)
        if unknown:
            close = {u: difflib.get_close_matches(u, list(SECTIONS), n=1) for u in sorted(unknown)}
            hint = "; ".join(f"did you mean {c[0]!r} for {u!r}?" for u, c in close.items() if c)
            raise ConfigError(f"unknown config section(s) {sorted(unknown)}; sections are {sorted(SECTIONS)}"
                              + (f" ({hint})" if hint else ""))
        return Config(**sections)
    except ConfigError as e:
        raise _name_preset_values(e, user, layer, name) from None


def _name_preset_values(e: ConfigError, user: dict, layer: dict, preset: str) -> ConfigError:
    """``e``, saying which of the values it names the preset set (the user did not: they may not know of them)."""
    notes = [f"{sec}.{field}={layer[sec][field]!r} is the {preset} preset's" for sec, field in
             dict.fromkeys(re.findall(r"\b([a-z0-9_]+)\.([a-z0-9_]+)=", str(e)))
             if field in layer.get(sec, {}) and field not in (user.get(sec) or {})]
    if not notes:
        return e
    return ConfigError(f"{e} ({'; '.join(notes)}: give your own value to change it, or run.preset=none for no preset)")


def read_file(path: str | Path, cli: dict[str, dict[str, Any]] | None = None,
              trust_modules: bool = False) -> dict[str, dict[str, Any]]:
    """Read a TOML or YAML config file into nested overrides, refusing modules it names for import unless
    ``trust_modules`` or the command line (``cli``) gives the same fields (rlbalance/config/trust.py)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found")
    text = p.read_text()
    if p.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p}: invalid TOML: {e}") from None
    elif p.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p}: invalid YAML: {e}") from None
    elif p.suffix == ".json":
        data = json.loads(text)
    else:
        raise ConfigError(f"config file {p}: use a .toml, .yaml/.yml or .json file")
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(f"config file {p}: expected sections like [env] or env: with fields inside")
    confirm_code(f"config file {p}", data, cli, trust_modules)
    return data


def merge(*layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for sec, vals in layer.items():
            out.setdefault(sec, {}).update(vals)
    return out


def parse_set(items: list[str]) -> dict[str, dict[str, Any]]:
    """Parse ``section.field=value`` strings."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        sec, dot, name = key.partition(".")
        name = name.replace("-", "_")  # learner.batch-size is learner.batch_size
        if not sep or not dot:
            raise ConfigError(f"--set {item!r}: expected section.field=value, e.g. env.id=CartPole-v1")
        out.setdefault(sec, {})[name] = value
    return out


def load(config_file: str | None = None, cli: dict[str, dict[str, Any]] | None = None,
         trust_modules: bool = False) -> Config:
    """defaults < config file < command line. Modules the file names for import (env.id 'module:Name',
    env.imports, learner.agent 'module:Agent') are refused unless ``trust_modules`` or the command line gives them
    (rlbalance/config/trust.py)."""
    layers = [read_file(config_file, cli, trust_modules)] if config_file else []
    layers.append(cli or {})
    return build(merge(*layers))


#: config.json's record of what a run decided from the machine (learner.torso_precision=auto's choice, ...): not
#: part of the config, rebuilt on every start, ignored when the config is read back
RESOLVED = "resolved"


def from_dict(d: dict[str, Any]) -> Config:
    """Rebuild a Config from ``to_dict`` output (e.g. a run directory's config.json). The record holds its preset's
    values already; a field it lacks is newer than the run, which ran as that field's default does, so the default
    fills it, not today's preset."""
    return build({sec: vals for sec, vals in d.items() if sec != RESOLVED}, preset_layer=False)


def field_docs() -> list[tuple[str, str, Any, str]]:
    """(section, field, default, doc) for every field, for CLI help and docs."""
    rows = []
    for sec, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            rows.append((sec, f.name, f.default, f.metadata.get("doc", "")))
    return rows
