# Sourced (never run) by benchmarks/peers/*_setup.sh: what every peer's set-up script shares.
#
# The caller sets NAME (its log prefix, e.g. "locust_setup") and VENV_NAME (its folder under
# benchmarks/.venvs/) and then sources this file, which sets ROOT, VENV, STAMP and PY (PY=python3.X in the
# environment chooses the interpreter) and defines the steps below. What each peer installs, and how it
# checks the result, stays in its own script.
#
#   stamp_matches SPEC MODULES      the stamp records SPEC and `import MODULES` works in the venv
#   begin_install                   start the clock ($start) and a log file ($log) removed on exit
#   require_python HINT [COND WHY]  $PY is on PATH (else "set PY=python3.X<HINT>"); COND (a Python
#                                   expression over sys.version_info) holds, else fail with WHY
#   make_venv                       drop the stamp; create the venv unless it already has a python
#   pip_install ARGS...             pip install --quiet ARGS into the venv; on failure, the first ERROR line
#   project_pin DIST                DIST==version as installed in the project's .venv, else DIST
#   forbid_torch WHY                fail if torch imports in the venv (a peer that must stay torch-free)
#   require_cpu_torch               torch is the CPU build and no CUDA package got in; sets $torch_version
#   write_stamp SPEC                record SPEC as installed
#   took                            "N s (SIZE in VENV)" since begin_install
#   fail MESSAGE                    "NAME: FAILED: MESSAGE" on stderr, exit 1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/benchmarks/.venvs/$VENV_NAME"
STAMP="$VENV/.installed"
PY="${PY:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

fail() {
    echo "$NAME: FAILED: $*" >&2
    exit 1
}

stamp_matches() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$1" ]] && "$VENV/bin/python" -c "import $2" 2>/dev/null
}

begin_install() {
    start=$(date +%s)
    log="$(mktemp -t "$NAME.XXXXXX.log")"
    trap 'rm -f "$log"' EXIT
}

require_python() {
    command -v "$PY" >/dev/null || fail "no $PY on PATH (set PY=python3.X$1)"
    if [[ $# -ge 3 ]]; then
        "$PY" -c "import sys; sys.exit(0 if $2 else 1)" || fail "$PY is $("$PY" -V 2>&1); $3 (set PY=...)"
    fi
}

make_venv() {
    rm -f "$STAMP"
    if [[ ! -x "$VENV/bin/python" ]]; then
        "$PY" -m venv "$VENV" >"$log" 2>&1 || fail "$PY -m venv $VENV: $(tail -n 1 "$log")"
    fi
}

pip_install() {
    "$VENV/bin/python" -m pip install --quiet "$@" >"$log" 2>&1 \
        || fail "pip install $*: $(grep -m 1 -E '^ERROR' "$log" || tail -n 1 "$log")"
}

project_pin() {  # name==version as installed in the project venv, else just the name
    local v
    v="$("$ROOT/.venv/bin/python" -c "from importlib.metadata import version; print(version('$1'))" 2>/dev/null)" \
        && echo "$1==$v" || echo "$1"
}

forbid_torch() {
    if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
        fail "torch got into $VENV; $1"
    fi
}

require_cpu_torch() {
    torch_version="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
    [[ "$torch_version" == *+cpu ]] || fail "torch $torch_version is not the CPU build"
    if "$VENV/bin/python" -m pip list 2>/dev/null | grep -qiE '^nvidia-|^triton '; then
        fail "CUDA packages got into $VENV: $("$VENV/bin/python" -m pip list 2>/dev/null | grep -iE '^nvidia-|^triton ' | tr '\n' ' ')"
    fi
}

write_stamp() {
    echo "$1" >"$STAMP"
}

took() {
    echo "$(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1) in $VENV)"
}
