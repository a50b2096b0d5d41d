"""Core: errors, timing, strict JSON I/O, torch.distributed helpers. Imports nothing else of rlbalance."""
