#!/usr/bin/env bash
# Regenerate docs/screenshots/ from fresh runs, so they cannot go stale: the report of a CartPole run on the
# embedded default (the README's first command), and the report of a Pong run with the Atari preset (a fresh
# run of PONG_SECONDS, default 600, or an existing run directory: PONG_RUN=runs/ALE_Pong-v5-...). Headless
# Chromium draws each report.html as the browser shows it.
#   bash scripts/screenshots.sh
#   PONG_RUN=runs/ALE_Pong-v5-20261205-230000 bash scripts/screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -z "$browser" ]; then
  echo "screenshots: no chromium here (apt-get install chromium)" >&2
  exit 2
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
shoot() {  # shoot RUN_DIR PNG
  "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --disable-background-networking \
    --user-data-dir="$out/profile" --virtual-time-budget=5000 --window-size=1000,3600 \
    --screenshot="$2" "file://$(cd "$1" && pwd)/report.html" 2>/dev/null
  echo "wrote $2 from $1"
}
.venv/bin/rlbalance train --run.out_dir "$out" --run.name cartpole --telemetry.progress false >/dev/null
shoot "$out/cartpole" docs/screenshots/report-cartpole.png
pong="${PONG_RUN:-}"
if [ -z "$pong" ]; then
  .venv/bin/rlbalance train --env.id ALE/Pong-v5 --run.max_seconds "${PONG_SECONDS:-600}" --run.total_steps 100000000 \
    --run.out_dir "$out" --run.name pong --telemetry.progress false >/dev/null
  pong="$out/pong"
else
  .venv/bin/rlbalance report "$pong" >/dev/null  # drawn by this checkout's report code
fi
shoot "$pong" docs/screenshots/report-pong.png
