"""Strict JSON I/O: NaN and infinities as null, atomic writes (temporary file, fsync, rename)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rlbalance.core.errors import DiskWriteError


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename); on failure nothing is left."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DiskWriteError(f"cannot write {path}: {e.strerror or e}") from e
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def strict(obj):
    """``obj`` with NaN and infinities as null and numpy scalars as Python numbers: strict JSON, which
    JavaScript's JSON.parse and other strict parsers accept."""
    if isinstance(obj, dict):
        return {str(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)) and getattr(obj, "ndim", 1) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps(obj, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj`` (see ``strict``); anything else not JSON becomes its string."""
    return json.dumps(strict(obj), indent=indent, default=str, allow_nan=False)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (dumps(obj) + "\n").encode())
