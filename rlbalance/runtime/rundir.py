"""The run directory: config used, hardware stamp, metrics, checkpoints, summary."""

from __future__ import annotations

import json
import os
import platform
import re
import stat
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

from rlbalance.config import Config, from_dict
from rlbalance.config.schema import RESOLVED
from rlbalance.config.trust import confirm_code
from rlbalance.core.cpuinfo import cpu_model, usable_cpus
from rlbalance.core.errors import ConfigError, DiskWriteError
from rlbalance.core.jsonio import atomic_write_bytes, atomic_write_json

CHECKPOINT_FORMAT = "rlbalance-checkpoint-v1"
CHECKPOINT_NAME = re.compile(r"ckpt-[0-9]{12}\.pt")  # the only files checkpoints/latest may name
CHECKPOINT_SPARE_BYTES = 16 * 2**20  # left free beside a new checkpoint (metrics, the report and summary follow it)


def _cpu_model() -> str:
    return cpu_model() or platform.processor() or "unknown"


def _git_commit() -> str:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _gpus() -> list[dict]:
    gpus = []
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append({
                "index": i, "name": pynvml.nvmlDeviceGetName(h), "driver": driver,
                "memory_bytes": pynvml.nvmlDeviceGetMemoryInfo(h).total,
                "power_limit_w": pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
                "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            })
        pynvml.nvmlShutdown()
    except Exception:  # no NVML library or no GPU: the stamp says so
        pass
    return gpus


def hardware_stamp() -> dict:
    import psutil

    versions = {}
    for pkg in ("rlbalance", "torch", "numpy", "gymnasium", "ale-py", "envpool", "ray", "psutil", "nvidia-ml-py"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return {
        "cpu_model": _cpu_model(),
        "physical_cores": psutil.cpu_count(logical=False),
        "logical_cpus": psutil.cpu_count(logical=True),
        "usable_cpus": usable_cpus(),
        "memory_bytes": psutil.virtual_memory().total,
        "gpus": _gpus(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": versions,
        "git_commit": _git_commit(),
    }


def safe_name(env_id: str) -> str:
    """An env id as a directory name on any file system: 'ALE/Pong-v5' -> 'ALE_Pong-v5', 'myenvs:Corridor-v0' ->
    'myenvs_Corridor-v0' (letters, digits, '.', '_' and '-' only)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", env_id).strip("._") or "run"


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.ckpt_dir = self.path / "checkpoints"
        self._lock_fd: int | None = None
        self.resolved: dict | None = None  # what this session decided from the machine (config.json's "resolved")

    def lock(self) -> None:
        """Own the run directory while this process lives: a second trainer (a --resume of a live run) is
        refused. The lock is the kernel's (flock), so it dies with its process, kill -9 included. A run directory
        holding symbolic links is refused first: every file a run writes is written in the directory itself."""
        import fcntl

        self.check_links()
        try:
            fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:  # a link planted after check_links (ELOOP), or no permission
            raise ConfigError(f"run directory {self.path}: cannot open its .lock ({e.strerror}); remove it if it "
                              "is a link, or check the directory's permissions") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(f"run directory {self.path}: its .lock is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(f"run directory {self.path} is in use by a live run (pid {holder}); wait for it to "
                              "end or stop it (Ctrl-C or kill PID) before resuming it") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def check_links(self) -> None:
        """Refuse a run directory that holds a symbolic link (in it, in checkpoints/ or tb/): a run writes into
        those, and a link planted there (on a shared filesystem) would have it write, or delete, elsewhere."""
        for d in (self.path, self.ckpt_dir, self.path / "tb"):
            if d != self.path and d.is_symlink():
                raise ConfigError(f"run directory {self.path}: {d.name} is a symbolic link (to {os.readlink(d)}); "
                                  "a run writes no file through a link: remove it")
            if not d.is_dir():
                continue
            for entry in os.scandir(d):
                if entry.is_symlink():
                    raise ConfigError(f"run directory {self.path}: {Path(entry.path).relative_to(self.path)} is a "
                                      f"symbolic link (to {os.readlink(entry.path)}); a run writes no file through "
                                      "a link: remove it")

    def check_owner(self, allow_other_owner: bool = False) -> None:
        """Refuse to resume a run directory that another user owns (resuming writes into it as this user), unless
        ``allow_other_owner`` (--allow-other-owner)."""
        if not hasattr(os, "getuid") or allow_other_owner or not self.path.exists():
            return  # (a missing directory is refused by what reads it, naming it)
        owner = os.stat(self.path).st_uid
        if owner != os.getuid():
            raise ConfigError(f"--resume {self.path}: the run directory belongs to another user (uid {owner}); "
                              "resuming writes into it as you: copy it to a folder of your own, or pass "
                              "--allow-other-owner")

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the file releases the flock
            self._lock_fd = None

    @classmethod
    def create(cls, cfg: Config, resolved: dict | None = None) -> "RunDir":
        """A new run directory, made by this call alone (an existing directory of that name is never reused): a
        named run whose directory exists is refused; a generated name takes a suffix (-2, -3, ...) instead."""
        name = cfg.run.name or f"{safe_name(cfg.env.id)}-{time.strftime('%Y%m%d-%H%M%S')}"
        out = Path(cfg.run.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / name
        for i in range(2, 1000):
            try:
                path.mkdir()
                break
            except FileExistsError:
                if cfg.run.name:
                    hint = (f"pass --resume {path} to continue it, or choose another run.name"
                            if (path / "config.json").is_file() and not path.is_symlink()
                            else "it is not a run of yours to write into: choose another run.name")
                    raise ConfigError(f"run.name={name!r}: {path} already exists; {hint}") from None
                path = out / f"{name}-{i}"
        else:
            raise ConfigError(f"run.out_dir={str(out)!r}: no free run directory name for {name}; choose a run.name")
        rd = cls(path)
        rd.lock()
        rd.ckpt_dir.mkdir()
        rd.resolved = resolved
        rd.write_config(cfg)
        return rd

    def write_config(self, cfg: Config) -> None:
        """config.json: the config this session uses (overrides given on resume included), with what the session
        decided from the machine (``resolved``, rlbalance.config.schema.RESOLVED; not read back)."""
        extra = {RESOLVED: self.resolved} if self.resolved else {}
        atomic_write_json(self.path / "config.json", {**cfg.to_dict(), **extra})

    def write_meta(self, extra: dict) -> int:
        """meta.json: where and when this session of the run ran; earlier sessions (before a resume) are
        kept under "previous". Returns this session's index (0 for the first)."""
        meta = {"hardware": hardware_stamp(), **extra}
        old = self.path / "meta.json"
        if old.is_file():
            prev = json.loads(old.read_text())
            meta["previous"] = prev.pop("previous", []) + [prev]
        atomic_write_json(self.path / "meta.json", meta)
        return len(meta.get("previous", []))

    def read_config(self, cli: dict | None = None, trust_modules: bool = False) -> Config:
        """The run's recorded config. Modules it names for import (env.id 'module:Name', env.imports, learner.agent
        'module:Agent') are refused before anything is imported, unless ``trust_modules`` or the command line
        (``cli``) gives those fields itself: a run directory may come from anyone (rlbalance/config/trust.py)."""
        p = self.path / "config.json"
        if not self.path.is_dir():
            raise ConfigError(f"run directory {self.path} does not exist" + (
                " (a file of that name is there)" if self.path.exists() else ""))
        if not p.is_file():
            raise ConfigError(f"run directory {self.path}: no config.json there; is it an rlbalance run directory?")
        try:
            record = json.loads(p.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"run directory {self.path}: config.json is not JSON ({e})") from None
        if not isinstance(record, dict):
            raise ConfigError(f"run directory {self.path}: config.json is not an rlbalance config")
        confirm_code(f"config.json of run directory {self.path}", record, cli, trust_modules)
        return from_dict(record)

    # checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, state: dict, keep: int = 2) -> Path:
        import io

        state = {"format": CHECKPOINT_FORMAT, **state}
        buf = io.BytesIO()
        torch.save(state, buf)
        path = self.ckpt_dir / f"ckpt-{state['steps']:012d}.pt"
        self._check_space(len(buf.getbuffer()), keep)
        try:
            atomic_write_bytes(path, buf.getvalue())
        except DiskWriteError as e:
            last = self.latest_checkpoint()
            raise DiskWriteError(f"{e}; the last good checkpoint is {last} (resume from it with --resume "
                                 f"{self.path} once there is space)" if last else
                                 f"{e}; no checkpoint of this run was written yet") from e
        atomic_write_bytes(self.ckpt_dir / "latest", path.name.encode())
        for old in sorted(self.ckpt_dir.glob("ckpt-*.pt"))[:-keep]:
            old.unlink(missing_ok=True)
        # a session killed while it wrote (SIGKILL mid-checkpoint) left its temporary file; this run directory has
        # one writer (its lock), so any left now is such a leftover
        for stale in self.ckpt_dir.glob("*.tmp"):
            stale.unlink(missing_ok=True)
        return path

    def _check_space(self, size: int, keep: int) -> None:
        """A checkpoint is written before the old ones go (so a crash mid-write loses nothing): refuse, with the
        figures, where the disk cannot hold it now, rather than fill the disk."""
        import shutil

        free = shutil.disk_usage(self.ckpt_dir).free
        need = size + CHECKPOINT_SPARE_BYTES
        if free < need:
            last = self.latest_checkpoint()
            raise DiskWriteError(f"cannot write a checkpoint of {size / 2**20:,.1f} MiB to {self.ckpt_dir}: "
                                 f"{free / 2**20:,.1f} MiB free (keep={keep} checkpoints are kept, and the new one is "
                                 "written before the oldest goes); free some space"
                                 + (f", then resume from {last} with --resume {self.path}" if last else ""))

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint ``checkpoints/latest`` names (only a ``ckpt-<steps>.pt`` file in checkpoints/ itself, not
        a link: a pointer elsewhere is ignored), else the newest such file there."""
        latest = self.ckpt_dir / "latest"
        if latest.is_file() and not latest.is_symlink():
            name = latest.read_text(errors="replace").strip()
            p = self.ckpt_dir / name
            if CHECKPOINT_NAME.fullmatch(name) and p.is_file() and not p.is_symlink():
                return p
        found = sorted(p for p in self.ckpt_dir.glob("ckpt-*.pt")
                       if CHECKPOINT_NAME.fullmatch(p.name) and not p.is_symlink())
        return found[-1] if found else None

    def load_checkpoint(self, path: Path | None = None) -> dict:
        path = path or self.latest_checkpoint()
        if path is None:
            raise ConfigError(f"--resume {self.path}: no checkpoint in {self.ckpt_dir}")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0]  # torch's advice to load with weights_only=False is not ours
            raise ConfigError(f"checkpoint {path} cannot be read ({type(e).__name__}: {first}); it may be truncated "
                              "or not an rlbalance checkpoint: delete it to resume from the one before") from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise ConfigError(f"checkpoint {path} is not an {CHECKPOINT_FORMAT} file")
        return state
