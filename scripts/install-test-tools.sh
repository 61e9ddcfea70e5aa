#!/usr/bin/env bash
# Install the external tools the CLI tests use; safe to run again (skips what is there).
#   chromium  headless browser that renders the HTML report   (apt-get; needs root or sudo)
#   rotel     an independent OTLP collector the exports go to  (pip, into $VENV, default .venv)
#   prometheus  a real Prometheus server that scrapes the launcher's start-up endpoint (apt-get)
#   postgresql  Debian's PostgreSQL server: the fleet history's tests start their own (apt-get)
# Tests that need a tool which is missing skip with a reason instead of failing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"

APT=()
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    echo "chromium: present ($(command -v chromium || command -v chromium-browser))"
else
    APT+=(chromium)
fi
if command -v prometheus >/dev/null 2>&1; then
    echo "prometheus: present ($(command -v prometheus))"
else
    APT+=(prometheus)
fi
# Debian keeps the server's binaries off PATH, in /usr/lib/postgresql/N/bin ($PG_LIB: tests' stand-in)
if command -v initdb >/dev/null 2>&1 || compgen -G "${PG_LIB:-/usr/lib/postgresql}/*/bin/initdb" >/dev/null; then
    echo "postgresql: present"
else
    APT+=(postgresql)
fi
if [ ${#APT[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    # --no-install-recommends; the package's service is not started here (no init system), nor needed:
    # the test starts its own server on loopback
    $SUDO apt-get install -y -q --no-install-recommends "${APT[@]}"
fi

if "$VENV/bin/python" -c "import rotel, pathlib, sys; sys.exit(not (pathlib.Path(rotel.__file__).parent / 'rotel-agent').is_file())" 2>/dev/null; then
    echo "rotel: present in $VENV"
else
    "$VENV/bin/python" -m pip install -q rotel
fi
if "$VENV/bin/python" -c "import psycopg" 2>/dev/null; then
    echo "psycopg: present in $VENV"
else
    "$VENV/bin/python" -m pip install -q "psycopg[binary]>=3.1"
fi
