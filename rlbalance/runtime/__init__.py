"""Runtime: actors, the inference server, buffers, the session, checkpoints and the runners (serial, local
processes, Ray, torch.distributed). It never asks which agent it carries: it goes through ``rlbalance.agents``."""
