"""Machines the planner predicts for: a catalog of known systems (``data/systems.yaml``) plus any the user describes,
each checked field by field (a bad entry is named with its field)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rlbalance.core.errors import ConfigError


@dataclass(frozen=True)
class GpuSpec:
    name: str
    fp32_tflops: float
    tdp_w: float
    idle_w: float


@dataclass(frozen=True)
class Machine:
    name: str
    description: str
    cores: int
    threads: int
    gpus: int
    gpu: GpuSpec | None
    cpu_tdp_w: float
    base_w: float
    price_per_hour: float | None = None


def _need(entry: dict, where: str, key: str, kind, positive: bool = True):
    if key not in entry:
        raise ConfigError(f"{where}: missing field {key!r}")
    v = entry[key]
    if isinstance(v, bool) or not isinstance(v, kind):
        raise ConfigError(f"{where}.{key}={v!r}: expected a number" if kind is not str else f"{where}.{key}: expected text")
    if positive and kind is not str and v < 0:
        raise ConfigError(f"{where}.{key}={v!r}: must be >= 0")
    return v


def parse_catalog(data: dict, source: str = "catalog") -> dict[str, Machine]:
    """Validate a catalog (the structure of data/systems.yaml); errors name the entry and field."""
    if not isinstance(data, dict) or "systems" not in data:
        raise ConfigError(f"{source}: expected top-level 'gpus' and 'systems' sections")
    gpus = {}
    for name, g in (data.get("gpus") or {}).items():
        where = f"{source}: gpus.{name}"
        if not isinstance(g, dict):
            raise ConfigError(f"{where}: expected fields fp32_tflops, tdp_w, idle_w")
        gpus[name] = GpuSpec(name, float(_need(g, where, "fp32_tflops", (int, float))),
                             float(_need(g, where, "tdp_w", (int, float))), float(_need(g, where, "idle_w", (int, float))))
    out = {}
    for name, s in (data.get("systems") or {}).items():
        where = f"{source}: systems.{name}"
        if not isinstance(s, dict):
            raise ConfigError(f"{where}: expected a mapping of fields")
        cores = _need(s, where, "cores", int)
        threads = _need(s, where, "threads", int)
        if cores < 1 or threads < cores:
            raise ConfigError(f"{where}: cores={cores}, threads={threads}: need 1 <= cores <= threads")
        n_gpus = _need(s, where, "gpus", int)
        gpu = None
        if n_gpus:
            key = _need(s, where, "gpu", str)
            if key not in gpus:
                raise ConfigError(f"{where}.gpu={key!r}: unknown GPU; known: {sorted(gpus)} (add it under gpus:)")
            gpu = gpus[key]
        price = s.get("price_per_hour")
        if price is not None:
            price = float(_need(s, where, "price_per_hour", (int, float)))
        out[name] = Machine(name, str(s.get("description", name)), cores, threads, n_gpus, gpu,
                            float(_need(s, where, "cpu_tdp_w", (int, float))), float(_need(s, where, "base_w", (int, float))),
                            price)
    return out


def load_catalog(path: str | Path | None = None) -> dict[str, Machine]:
    import yaml

    if path is None:
        text = resources.files("rlbalance").joinpath("data/systems.yaml").read_text()
        source = "rlbalance/data/systems.yaml"
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"catalog {p} not found")
        text, source = p.read_text(), str(p)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {e}") from None
    return parse_catalog(data, source)
