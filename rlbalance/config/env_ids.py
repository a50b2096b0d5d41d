"""What an env id says by itself, before any env is made."""

from __future__ import annotations


def is_atari(env_id: str) -> bool:
    """Whether an env id is an Atari game (ALE's v5 ids or the NoFrameskip-v4 ones)."""
    return env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4")
