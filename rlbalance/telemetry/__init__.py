"""Telemetry: the hardware sampler, metrics logs, the bottleneck verdict and the run report (they read figures and
run files; nothing here knows processes, agents or envs)."""
