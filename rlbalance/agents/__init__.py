"""Agents: the learning algorithms, each a folder (``vtrace/``, ``r2d2/``) behind one interface (``base.Agent`` and
``base.LearnerBase``), found by name through ``registry.get``. Shared network pieces are in ``nets``."""
