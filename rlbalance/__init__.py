"""rlbalance: a SEED-style distributed RL trainer that measures and balances CPU-GPU machines."""

__version__ = "0.1.0"
