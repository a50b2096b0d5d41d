#!/usr/bin/env bash
# Create .venv and install rlbalance with its test tools. Safe to rerun; does nothing when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
stamp=.venv/.rlbalance-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # torch is pinned to 2.13.0 (the CPU build); an open range would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q -e ".[test]"
  touch "$stamp"
fi
