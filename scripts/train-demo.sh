#!/usr/bin/env bash
# The main job on its embedded default: set up, then a short real CartPole training run with its summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/rlbalance train "$@"
