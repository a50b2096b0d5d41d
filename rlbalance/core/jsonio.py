"""Strict JSON I/O: NaN and infinities as null, atomic writes (temporary file, fsync, rename)."""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from pathlib import Path

from rlbalance.core.errors import DiskWriteError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give a new file (read at import, while one thread runs)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename); on failure nothing is left.
    The temporary file is made new under a name nobody can guess (O_EXCL), so a file or symbolic link planted
    beside ``path`` is never written through; the rename replaces ``path`` itself, never what a link there points to."""
    path = Path(path)
    tmp = None
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        tmp = Path(name)
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise DiskWriteError(f"cannot write {path}: {e.strerror or e}") from e
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def open_nofollow(path: Path, mode: str = "w", **kw):
    """``open(path, mode)`` for writing ("w" or "a", text or binary) that refuses a symbolic link at ``path``
    (O_NOFOLLOW) instead of writing to whatever it points to: run directories may sit on shared filesystems."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DiskWriteError(f"cannot write {path}: it is a symbolic link (to {os.readlink(path)}); rlbalance "
                                 "writes no file through a link in a run directory: remove the link") from None
        raise
    return os.fdopen(fd, mode, **kw)


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
