"""What the CPU says of itself (Linux /proc/cpuinfo): its model name and feature flags, read once; and how many CPUs
this process may use."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the OS has one; else all of them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


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
