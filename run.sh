#!/usr/bin/env bash
# jasr task runner. Needs only python3 (>= 3.11) and pip; installs into .venv on first use.
#   ./run.sh demo            train the embedded demo model, then transcribe its held-out split
#   ./run.sh test [ARGS]     run the whole test suite (ARGS go to pytest)
#   ./run.sh bench NAME      run bench/NAME.py (ctc, fsa, models)
#   ./run.sh python ARGS     python inside the environment
set -euo pipefail
cd "$(dirname "$0")"
VENV="${JASR_VENV:-.venv}"
PY="${PYTHON:-python3}"

ensure_env() {  # $1: extras to install, e.g. "demo" or "test"
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[run.sh] creating $VENV" >&2
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip 2>/dev/null || true
  fi
  local stamp="$VENV/.jasr-installed-$1"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "[run.sh] installing jasr[$1] into $VENV (first use only)" >&2
    if ! "$VENV/bin/python" -m pip install -e ".[$1]" > "$VENV/pip-install-$1.log" 2>&1; then
      tail -n 40 "$VENV/pip-install-$1.log" >&2; echo "[run.sh] pip install failed (log: $VENV/pip-install-$1.log)" >&2; exit 1
    fi
    touch "$stamp"
  fi
}

export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$PWD/.cache/jax}"
cmd="${1:-help}"; shift || true
case "$cmd" in
  demo)
    ensure_env demo
    "$VENV/bin/python" train.py --config configs/demo.py --workdir runs/demo "$@"
    "$VENV/bin/python" decode.py --workdir runs/demo --split heldout
    ;;
  test)
    ensure_env test
    "$VENV/bin/python" -m pytest -q "$@"
    ;;
  bench)
    ensure_env bench
    name="${1:?usage: ./run.sh bench NAME}"; shift
    "$VENV/bin/python" "bench/$name.py" "$@"
    ;;
  python)
    ensure_env test
    "$VENV/bin/python" "$@"
    ;;
  *)
    sed -n '2,7p' "$0"; exit 2 ;;
esac
