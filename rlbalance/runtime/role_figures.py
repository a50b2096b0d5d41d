"""The figures a session keeps of its roles: cumulative stage seconds per role (``RoleShares``), what one learner update
tells a session (``update_figures``), and the learner rank that straggles (``straggling_rank``)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from rlbalance.core.timing import StageTimer


class RoleShares:
    """Cumulative stage seconds per role (after warm-up), and the shares they make of each role's time."""

    def __init__(self) -> None:
        self.seconds: dict[str, Counter] = {}
        self.count: dict[str, Counter] = {}
        self.wall: Counter = Counter()

    def add(self, role: str, snap: dict) -> None:
        self.seconds.setdefault(role, Counter()).update(snap["seconds"])
        self.count.setdefault(role, Counter()).update(snap.get("count", {}))
        self.wall[role] += snap["wall_s"]

    def with_roles(self, other: "RoleShares", roles) -> "RoleShares":
        """A copy of these figures with ``roles`` taken from ``other``."""
        out = RoleShares()
        for src, rs in ((self, set(self.seconds) - set(roles)), (other, roles)):
            for r in rs:
                out.seconds[r], out.count[r], out.wall[r] = Counter(src.seconds[r]), Counter(src.count[r]), src.wall[r]
        return out

    def mean_ms(self, role: str, stage: str) -> float | None:
        n = self.count.get(role, Counter()).get(stage, 0)
        return 1000.0 * self.seconds[role][stage] / n if n else None

    def shares(self) -> dict[str, dict[str, float]]:
        return {r: {k: v / max(self.wall[r], 1e-9) for k, v in sec.items()} for r, sec in self.seconds.items()}


def update_figures(batch: dict[str, torch.Tensor], stats: dict[str, float], updates: int, timer: StageTimer,
                   gpu_timer: StageTimer) -> tuple[np.ndarray, np.ndarray, float]:
    """What one learner update tells a session (rank 0's, or a learner rank's that reports to it): the returns
    and lengths of the episodes that ended in its batch, its policy lag (updates between the behaviour policy and
    the one trained); the update's stage times go into ``timer`` and ``gpu_timer``."""
    end = batch["ep_end"][:-1].numpy()
    rets, lens = batch["ep_return"][:-1].numpy()[end], batch["ep_length"][:-1].numpy()[end]
    for k, v in stats.items():  # h2d, fwd_bwd, optim (and any the agent times: a replay's insert, ...)
        if k.startswith("time_") and k != "time_gpu_train":
            timer.add(k.removeprefix("time_"), v)
    if "time_gpu_train" in stats:
        gpu_timer.add("train", stats["time_gpu_train"])
    return rets, lens, float(updates - 1 - batch["version"].float().mean())


def _timed(warm: RoleShares | None, whole: RoleShares | None) -> tuple[RoleShares, bool]:
    """(The figures to report, whether they are the after-warm-up ones): those after warm-up where the learner has
    timed stages there, else the whole run's (a run about as short as the warm-up may have only a stage-less last
    report after it); a role that reported only before the warm-up keeps its whole-run figures."""
    whole = whole if whole is not None else RoleShares()
    if warm is None or sum(warm.seconds.get("learner", {}).values()) <= 0:
        return whole, False
    missing = set(whole.seconds) - set(warm.seconds)
    return (warm.with_roles(whole, missing) if missing else warm), True


VERDICT_CAP = 2048  # verdicts telemetry.json keeps (one per metrics record): evenly thinned beyond it
STRAGGLER_GAP = 0.15  # a learner rank waiting for its actors' data this much more of its time than the others


def straggling_rank(ranks: dict[str, dict]) -> dict | None:
    """The learner rank that holds the others back, where one does: in lockstep training every rank waits at each
    all-reduce for the slowest, so the rank whose own actors keep it waiting for data far longer than the others
    wait for theirs is the straggler (its actors or env are slower, or have fewer cores)."""
    found = {r: v["stage_shares"].get("learner", {}).get("wait_data") for r, v in ranks.items()}
    waits: dict[str, float] = {r: w for r, w in found.items() if w is not None}
    if len(waits) < 2:
        return None
    slow = max(waits, key=lambda r: waits[r])
    others = [w for r, w in waits.items() if r != slow]
    if waits[slow] - max(others) < STRAGGLER_GAP:
        return None
    return {"rank": int(slow), "wait_data": waits[slow], "others_wait_data": max(others),
            "evidence": f"learner rank {slow} waits for its actors' data {waits[slow]:.0%} of its time against at "
                        f"most {max(others):.0%} for the other ranks: it straggles, and every all-reduce waits for it "
                        f"(give its actors more cores, or check its node)"}
