#!/usr/bin/env bash
# Install the external tools the CLI tests use; safe to run again (skips what is there).
#   chromium  headless browser that renders the HTML report   (apt-get; needs root or sudo)
#   rotel     an independent OTLP collector the exports go to  (pip, into $VENV, default .venv)
# Tests that need a tool which is missing skip with a reason instead of failing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    echo "chromium: present ($(command -v chromium || command -v chromium-browser))"
else
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends chromium
fi

if "$VENV/bin/python" -c "import rotel, pathlib, sys; sys.exit(not (pathlib.Path(rotel.__file__).parent / 'rotel-agent').is_file())" 2>/dev/null; then
    echo "rotel: present in $VENV"
else
    "$VENV/bin/python" -m pip install -q rotel
fi
