# shellcheck shell=bash
# tests/venv.sh -- the test venv, shared by tests/run.sh and tests/lint.sh
# (sourced, never run by itself).
#
# ensure_venv VENV REQUIREMENTS: create the venv VENV when it is missing and
# install REQUIREMENTS into it (pip -r syntax, so it may name the Python
# package: ./python; the test tools, pytest and ruff, are pinned there) --
# or just pytest when that file does not exist. The install runs only when
# the requirements changed since the last one (or on a new venv): their text
# is kept in VENV/.delegate-requirements as a stamp.
# Prints what failed and returns non-zero on failure; the caller decides
# how to fail. Needs python3 with its venv module (Debian: python3-venv).
ensure_venv() {
    local venv=$1 req=$2 stamp want
    if [[ ! -x $venv/bin/python ]]; then
        python3 -m venv "$venv" || {
            echo "cannot create the venv $venv (python3-venv installed?)" >&2
            return 1
        }
    fi
    stamp=$venv/.delegate-requirements
    want="pytest"
    [[ -f $req ]] && want=$(cat "$req")
    if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
        if [[ -f $req ]]; then
            "$venv/bin/pip" install -q -r "$req" || { echo "pip install -r $req failed" >&2; return 1; }
        else
            "$venv/bin/pip" install -q pytest || { echo "pip install pytest failed" >&2; return 1; }
        fi
        printf '%s' "$want" >"$stamp"
    fi
}
