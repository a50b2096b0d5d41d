"""Environments: env specs, batches of K envs (gymnasium, ALE, EnvPool, synthetic), action and observation spaces."""
