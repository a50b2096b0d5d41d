"""The errors every layer raises: bad settings, a diverged loss, a disk that refused a write."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what is allowed."""


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or inf; training stops and the last good checkpoint is kept."""


class DiskWriteError(RuntimeError):
    """A run file could not be written (disk full, read-only, quota); its temporary file was removed."""
