"""Agents: the algorithm code of each learner, apart from the process code that feeds it.

``r2d2``: the pieces of R2D2 (Kapturowski et al. 2019, as SEED RL runs it on Atari) that do not depend on how
experience reaches the learner: the invertible value rescaling, n-step double-Q targets over stored sequences,
sequence priorities, a prioritised sampler and the per-env epsilon ladder. (The V-trace learner is
``rlbalance.learner``; the runners call either through one small interface once R2D2 is wired in.)
"""
