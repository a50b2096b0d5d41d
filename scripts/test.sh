#!/usr/bin/env bash
# Set up, lint (ruff for errors, import-linter for the layers, mypy for the runtime's and the agents' interfaces),
# then run the tests (CPU only).
#   bash scripts/test.sh          the fast tier: unit and integration tests, no learning bars (a few minutes)
#   bash scripts/test.sh --all    the whole suite: learning bars, long fault, Ray and soak runs too (what CI runs)
# Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=(-m "not slow")
if [ "${1:-}" = "--all" ]; then
  tier=()
  shift
fi
bash scripts/setup.sh
.venv/bin/ruff check --select F,E9 --line-length 120 rlbalance bench tests
.venv/bin/lint-imports --config pyproject.toml
.venv/bin/mypy rlbalance/runtime rlbalance/agents
exec .venv/bin/python -m pytest -q "${tier[@]}" "$@"
