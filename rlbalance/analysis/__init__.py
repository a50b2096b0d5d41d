"""Analysis: calibration, the planner, sweeps, the CPU/GPU ratio and kernel profiles (they run and read runs)."""
