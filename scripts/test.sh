#!/usr/bin/env bash
# Set up, then lint for errors and run the whole test suite (CPU only; about 35 minutes on 2 cores, Ray tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check --select F,E9 --line-length 120 rlbalance bench tests
exec .venv/bin/python -m pytest -q "$@"
