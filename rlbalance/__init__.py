"""rlbalance: a SEED-style distributed RL trainer that measures and balances CPU-GPU machines.

``rlbalance.train(cfg)`` is ``rlbalance.runtime.train.train`` (imported on first use, so ``import rlbalance`` stays
light); ``rlbalance.config`` builds configs. The package's layers are drawn in docs/design.md."""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "train":
        from rlbalance.runtime.train import train

        return train
    raise AttributeError(f"module 'rlbalance' has no attribute {name!r}")
