"""The ray section of the run configuration: actors on a Ray cluster (see sections.py for the others)."""

from __future__ import annotations

from dataclasses import dataclass

from rlbalance.config.sections import _f, _require

RAY_PLACEMENTS = ("spread", "pack")


@dataclass(frozen=True)
class RayConfig:
    """Actors on a Ray cluster (optional: pip install 'rlbalance[ray]'); the learner stays in this process."""

    address: str = _f("", "'' runs actors as local processes over shared memory; 'local' starts a private Ray on "
                      "127.0.0.1 for this run (dashboard off); HOST:PORT or 'auto' joins a running cluster "
                      "(started with `ray start`).")
    cpus_per_actor: float = _f(1.0, "Ray CPU resources each actor reserves on its node.")
    placement: str = _f("spread", "'spread' places actors across nodes; 'pack' fills one node first.")
    num_cpus: int = _f(0, "'local' only: CPUs the private Ray may schedule (0: all of this machine's).")
    dashboard: bool = _f(False, "'local' only: start Ray's dashboard (on 127.0.0.1).")
    object_store_mb: int = _f(256, "'local' only: Ray object store size in MiB.")

    def __post_init__(self) -> None:
        _require(self.cpus_per_actor > 0, "ray.cpus_per_actor", self.cpus_per_actor, "must be > 0")
        _require(self.placement in RAY_PLACEMENTS, "ray.placement", self.placement, f"one of {RAY_PLACEMENTS}")
        _require(self.num_cpus >= 0, "ray.num_cpus", self.num_cpus, "must be >= 0 (0: all)")
        _require(self.object_store_mb >= 80, "ray.object_store_mb", self.object_store_mb,
                 "must be >= 80 (Ray's minimum object store is 75 MiB)")
        _require(self.address in ("", "local", "auto") or ":" in self.address, "ray.address", self.address,
                 "'' (no Ray), 'local', 'auto' or HOST:PORT of a running cluster's head")

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    @property
    def loopback(self) -> bool:
        """A cluster on this machine's loopback address (a private one, or one the tests start)."""
        return self.address == "local" or self.address.split(":")[0] in ("127.0.0.1", "localhost")
