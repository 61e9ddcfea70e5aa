#!/usr/bin/env bash
# Install real SGLang 0.5.23 (and 0.5.9 beside it) for CPU and sglang-phasetrace (editable, with test tools) into a venv.
#
#   scripts/install-cpu.sh            # -> ./.venv   (VENV=path to choose another)
#
# SGLang's wheel pins the CUDA torch and CUDA-only kernels, so it goes in with --no-deps, beside
# the CPU torch and the pure-Python set its import needs (scripts/cpu_env/requirements.txt).
# Two shims make it import on a machine without a GPU (scripts/cpu_env/site, loaded by a .pth in
# the venv): an import-only `sgl_kernel` stand-in, and the torchvision op schemas its CUDA build
# expects. They are test/demo environment only; sglang-phasetrace itself needs neither.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
# Older releases tested live beside it, each alone in $VENV/overlays/sglang-V (put ahead on
# PYTHONPATH by the tests; they share the venv's dependencies). "" for none.
SGLANG_OVERLAYS=${SGLANG_OVERLAYS-0.5.9}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip
pip install "torch==2.13.0"                                # CPU build
pip install --no-deps "sglang==$SGLANG_VERSION" "torchvision==0.28.0"
pip install -r scripts/cpu_env/requirements.txt
pip install --no-deps -e ".[test]"
pip install "pytest>=8" "pytest-timeout>=2.3" "ruff==0.17.6" "twine>=5"

for v in $SGLANG_OVERLAYS; do
  [ -d "$VENV/overlays/sglang-$v/sglang" ] || pip install --no-deps --target "$VENV/overlays/sglang-$v" "sglang==$v"
done

site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/scripts/cpu_env/site" > "$site/sglang_cpu_site.pth"
echo "import _sglang_cpu_shims" > "$site/zz_sglang_cpu_shims.pth"   # after the path entry above
"$VENV/bin/python" -c 'import sglang, sglang_phasetrace.tracing; print("sglang", sglang.__version__, "ready")'
