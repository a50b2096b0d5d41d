"""What the CPU says of itself (Linux /proc/cpuinfo): its model name and feature flags, read once."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=1)
def _first_cpu() -> dict[str, str]:
    """The fields of the first processor in /proc/cpuinfo (empty where it cannot be read)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                if fields:
                    break
                continue
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str | None:
    """The CPU's model name, None where /proc/cpuinfo has none."""
    return _first_cpu().get("model name")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (x86 'flags', Arm 'Features'; empty where they cannot be read)."""
    cpu = _first_cpu()
    return frozenset((cpu.get("flags") or cpu.get("Features") or "").split())
