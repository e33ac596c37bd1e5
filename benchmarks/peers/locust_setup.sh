#!/usr/bin/env bash
# Creates the Locust peer's own virtual environment: benchmarks/.venvs/locust.
#
# Locust is the reference closed-loop load generator that benchmarks/load_vs_locust.py compares the
# open-loop generator against. It brings gevent, Flask and friends, so it never shares the project's
# .venv. Nothing here pulls torch (checked below).
#
# Idempotent: a stamp file records what was installed; a second run with the same pin is a no-op.
#     bash benchmarks/peers/locust_setup.sh          # PY=python3.11 to choose the interpreter
set -euo pipefail

NAME=locust_setup
VENV_NAME=locust
# shellcheck source=benchmarks/peers/_setup_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_setup_common.sh"
# The only direct requirement; pip resolves the rest (gevent, geventhttpclient, flask, ...).
SPEC="locust==2.*"

if stamp_matches "$SPEC" locust.contrib.fasthttp; then
    echo "$NAME: up to date ($VENV, $SPEC)"
    exit 0
fi

begin_install
require_python ", >= 3.10" "sys.version_info[:2] >= (3, 10)" "Locust 2 needs Python >= 3.10"
make_venv
pip_install "$SPEC"
"$VENV/bin/python" -c "import locust, locust.contrib.fasthttp" >"$log" 2>&1 \
    || fail "locust installed but does not import: $(tail -n 1 "$log")"
forbid_torch "the peer must stay torch-free"

write_stamp "$SPEC"
version="$("$VENV/bin/python" -c 'import locust; print(locust.__version__)')"
echo "$NAME: installed locust $version in $(took)"
