#!/usr/bin/env bash
# Creates the MLServer peer's own virtual environment: benchmarks/.venvs/mlserver.
#
# MLServer is a second, independent implementation of the Open Inference Protocol (KServe v2) that the
# load generator must drive unchanged. It pins old libraries (fastapi <0.116, protobuf <7, its own
# grpcio/opentelemetry), so it never shares the project's .venv. No torch is installed here: the peer's
# models (benchmarks/peers/mlserver_model/) are plain numpy.
#
# Idempotent: a stamp file records what was installed; a second run with the same pin is a no-op.
#     bash benchmarks/peers/mlserver_setup.sh          # PY=python3.11 to choose the interpreter
set -euo pipefail

NAME=mlserver_setup
VENV_NAME=mlserver
# shellcheck source=benchmarks/peers/_setup_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_setup_common.sh"
# The only direct requirement; pip resolves the rest from MLServer's own metadata.
# MLServer 1.7 supports Python >=3.9,<3.13.
SPEC="mlserver==1.7.*"

if stamp_matches "$SPEC" mlserver; then
    echo "$NAME: up to date ($VENV, $SPEC)"
    exit 0
fi

begin_install
require_python ", 3.9-3.12" "(3, 9) <= sys.version_info[:2] < (3, 13)" "MLServer 1.7 needs Python >=3.9,<3.13"
make_venv
pip_install "$SPEC"
"$VENV/bin/python" -c "import mlserver, mlserver.cli" >"$log" 2>&1 \
    || fail "mlserver installed but does not import: $(tail -n 1 "$log")"
forbid_torch "the peer must stay numpy-only"

write_stamp "$SPEC"
version="$("$VENV/bin/python" -c 'import mlserver; print(mlserver.__version__)')"
echo "$NAME: installed mlserver $version in $(took)"
