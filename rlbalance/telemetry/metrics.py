"""Metrics: JSONL beside TensorBoard, sustained FPS after warm-up, episode statistics, a progress bar."""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path

import numpy as np

from rlbalance.core.jsonio import dumps, open_nofollow


class EpisodeStats:
    """Returns and lengths of finished games, as the learner consumes them."""

    def __init__(self, window: int = 100):
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[int] = deque(maxlen=window)
        self.count = 0
        self.best_mean = math.nan  # the best mean over `window` episodes seen so far

    def add_from_batch(self, ep_return: np.ndarray, ep_length: np.ndarray, ep_end: np.ndarray) -> None:
        if ep_end.any():
            self.returns.extend(ep_return[ep_end].tolist())
            self.lengths.extend(ep_length[ep_end].tolist())
            self.count += int(ep_end.sum())
            if len(self.returns) == self.returns.maxlen or not self.returns.maxlen:
                m = float(np.mean(self.returns))
                self.best_mean = m if math.isnan(self.best_mean) else max(self.best_mean, m)

    def state(self) -> dict:
        """What a checkpoint keeps of these games (returns, lengths, count, best_mean), for ``restore``."""
        return {"returns": list(self.returns), "lengths": list(self.lengths), "count": self.count,
                "best_mean": self.best_mean}

    def restore(self, state: dict) -> None:
        """The games of ``state`` (from ``state()``; missing keys: none), after any already here."""
        self.returns.extend(state.get("returns", []))
        self.lengths.extend(state.get("lengths", []))
        self.count = int(state.get("count", 0))
        self.best_mean = float(state.get("best_mean", math.nan))

    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else math.nan

    def mean_length(self) -> float:
        return float(np.mean(self.lengths)) if self.lengths else math.nan


def _cut_partial_last_line(path: Path) -> None:
    if path.is_symlink() or not path.is_file() or path.stat().st_size == 0:  # (a link is refused when opened)
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


class MetricsLogger:
    """Writes one JSON object per record to metrics.jsonl and the same scalars to TensorBoard."""

    def __init__(self, run_path: Path, tensorboard: bool, frames_per_step: int, warmup_s: float,
                 start_steps: int = 0, session: int = 0, wandb: dict | None = None):
        self.path = Path(run_path) / "metrics.jsonl"
        _cut_partial_last_line(self.path)  # a record cut by kill -9 would corrupt the next one
        self.file = open_nofollow(self.path, "a", buffering=1)
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(run_path) / "tb"))
        self.wb = _wandb_run(Path(run_path), **wandb) if wandb else None
        self.frames_per_step = frames_per_step
        self.session = session  # 0 for a run's first session, n after n resumes: time_s restarts with each
        self.warmup_s = warmup_s
        self.t0 = time.perf_counter()
        self.start_steps = start_steps
        self.last_t, self.last_steps = self.t0, start_steps
        self.warm_t: float | None = None
        self.first_t: float | None = None  # time of the first update
        self.first_steps = start_steps  # steps counted at the first update
        self.warm_steps = start_steps
        self.update_t: float | None = None  # time and step count of the last update
        self.update_steps = start_steps
        self.last_sps = 0.0

    def note_steps(self, steps: int) -> None:
        """Called after each update; warm-up counts from the first one (process start-up excluded)."""
        now = time.perf_counter()
        self.update_t, self.update_steps = now, steps
        if self.first_t is None:
            self.first_t, self.first_steps = now, steps
        if self.warm_t is None and now - self.first_t >= self.warmup_s:
            self.warm_t, self.warm_steps = now, steps

    def sustained_sps(self, steps: int) -> float:
        """Steps per second since warm-up ended; since the first update where warm-up never ended or ended at
        the last update. Process start-up (imports, env creation) is never steady state, so it is not counted."""
        now = time.perf_counter()
        if self.warm_t is not None and steps > self.warm_steps:
            t, s = self.warm_t, self.warm_steps
        elif self.first_t is not None:
            t, s = self.first_t, self.first_steps
        else:
            return 0.0
        if self.update_t is not None and steps == self.update_steps:
            now = self.update_t  # to the last update: the final checkpoint and shutdown are not training
        return (steps - s) / max(now - t, 1e-9)

    def log(self, steps: int, scalars: dict[str, float], final: bool = False) -> dict:
        """One metrics record. Its SPS is the steps since the previous record over the time since it; the final
        record of a session, where no update came after the previous one, repeats that record's rate (the time
        after the last update is shutdown, not a stall)."""
        now = time.perf_counter()
        if final and steps == self.last_steps and self.last_t > self.t0:
            sps = self.last_sps
        else:
            sps = (steps - self.last_steps) / max(now - self.last_t, 1e-9)
        self.last_t, self.last_steps, self.last_sps = now, steps, sps
        rec = {"time_s": round(now - self.t0, 4), "session": self.session, "steps": steps, "frames": steps * self.frames_per_step,
               "sps": sps, "fps": sps * self.frames_per_step, **scalars}
        self.file.write(dumps(rec, indent=None) + "\n")
        scalars = {k: v for k, v in rec.items() if k not in ("steps", "time_s", "session")
                   and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, steps)
        if self.wb is not None and steps > self._wb_step:  # W&B takes increasing steps only (a resume repeats some)
            self.wb.log(scalars, step=steps, commit=True)  # (a row per record, written now: not held for the next)
            self._wb_step = steps
        return rec

    def close(self, summary: dict | None = None) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wb is not None:
            if summary:
                self.wb.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str))
                                        and not (isinstance(v, float) and not math.isfinite(v))})
            self.wb.finish()
            self.wb = None

    _wb_step = -1


class Progress:
    """A rich progress bar over environment steps, showing FPS and mean return."""

    def __init__(self, total: int, enabled: bool, start: int = 0):
        self.enabled = enabled
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self.bar = RichProgress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                transient=False, refresh_per_second=4)
        self.task = self.bar.add_task("train", total=total, completed=start, info="")
        self.bar.start()

    def update(self, steps: int, fps: float, ret: float) -> None:
        """While the run goes: the FPS of the last metrics window (labelled as such) and the mean return."""
        if self.enabled:
            r = "n/a" if math.isnan(ret) else f"{ret:.1f}"
            self.bar.update(self.task, completed=steps, info=f"FPS {fps:,.0f} (last window) return {r}")

    def finish(self, steps: int, sustained_fps: float, ret: float) -> None:
        """The last line: the run's sustained FPS, the figure summary.json and the report give (``fps_sustained``)."""
        if self.enabled:
            r = "n/a" if math.isnan(ret) else f"{ret:.1f}"
            self.bar.update(self.task, completed=steps, info=f"sustained FPS {sustained_fps:,.0f} return {r}")

    def close(self) -> None:
        if self.enabled:
            self.bar.stop()


def _wandb_run(run_path: Path, mode: str, project: str, config: dict):
    """One W&B run per run directory: its id comes from the directory, so a --resume continues it."""
    import hashlib

    import wandb

    rid = f"{run_path.name[:40]}-{hashlib.sha1(str(run_path.resolve()).encode()).hexdigest()[:8]}"
    rid = "".join(c if c.isalnum() or c in "-_" else "-" for c in rid)
    return wandb.init(project=project, name=run_path.name, id=rid, resume="allow", mode=mode, dir=str(run_path),
                      config=config)


def with_gaps(m: list[dict]) -> list[dict]:
    """The records of every session of a run, wall time counted on from one session to the next (each session's
    time_s starts at 0), with an empty record between sessions so that plots leave a gap where the run was
    stopped instead of drawing a line back. A record whose time_s goes back also starts a session (records
    written before they carried their session's number)."""
    out: list[dict] = []
    offset = last = raw = 0.0
    session = m[0].get("session", 0) if m else 0
    for r in m:
        if r.get("session", 0) != session or r["time_s"] < raw:
            session, offset = r.get("session", 0), last
            out.append({"gap": True, "time_s": last, "steps": r["steps"], "frames": r.get("frames", r["steps"]),
                        "fps": float("nan")})
        raw = r["time_s"]
        rec = {**r, "time_s": raw + offset}
        last = rec["time_s"]
        out.append(rec)
    return out
