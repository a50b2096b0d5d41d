import pytest

from rlbalance import config as C


def quick_cfg(tmp_path, **sections) -> C.Config:
    """A config for fast tests: no progress bar, frequent logs, run dir under tmp_path."""
    over = {"run": {"out_dir": str(tmp_path), "total_steps": 20_000},
            "telemetry": {"progress": False, "log_interval_s": 0.5, "warmup_s": 0.5}}
    return C.build(C.merge(over, sections))


@pytest.fixture
def cfg_factory(tmp_path):
    return lambda **sections: quick_cfg(tmp_path, **sections)
