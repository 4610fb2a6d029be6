# Sourced by gpu_check.sh and gpu_sweep.sh (set NAME first): the python to use, PYTHONPATH to src/,
# missing packages installed from wheels carried in .whl/ (no network), and the --device argument.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "$NAME: $PY not found (set PYTHON=/path/to/python)" >&2
    exit 3
fi

# install_missing MODULE:REQUIREMENT ...: pip-install (no index) from .whl/ whatever does not import;
# into a side folder on PYTHONPATH when the python's own site-packages is not writable.
install_missing() {
    local pair missing=()
    for pair in "$@"; do
        "$PY" -c "import ${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    [ "${#missing[@]}" -gt 0 ] && [ -d "$ROOT/.whl" ] || return 0
    echo "$NAME: installing ${missing[*]} from $ROOT/.whl (no network)"
    if ! timeout 120 "$PY" -m pip install --quiet --no-index --find-links "$ROOT/.whl" "${missing[@]}"; then
        local deps="${TMPDIR:-/tmp}/anatomy-$NAME-deps"
        timeout 120 "$PY" -m pip install --quiet --no-index --find-links "$ROOT/.whl" --target "$deps" "${missing[@]}" \
            && export PYTHONPATH="$PYTHONPATH:$deps"
    fi
}

# device_arg "$@": the value of --device among the script's options (cuda when absent)
device_arg() {
    local arg prev="" device=cuda
    for arg in "$@"; do
        [ "$prev" = "--device" ] && device="$arg"
        case "$arg" in --device=*) device="${arg#--device=}" ;; esac
        prev="$arg"
    done
    echo "$device"
}
