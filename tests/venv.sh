# shellcheck shell=bash
# tests/venv.sh -- the test venv, shared by tests/run.sh and tests/lint.sh
# (sourced, never run by itself).
#
# ensure_venv VENV REQUIREMENTS: create the venv VENV when it is missing and
# install REQUIREMENTS into it (pip -r syntax, so it may name the Python
# package: ./python; the test tools, pytest and ruff, are pinned there) --
# or just pytest when that file does not exist. The install runs only when
# the requirements changed since the last one (or on a new venv): their text,
# with the text of every file they include (-r/-c, relative to the including
# file), is kept in VENV/.delegate-requirements as a stamp.
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
    [[ -f $req ]] && want=$(requirements_text "$req")
    if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
        if [[ -f $req ]]; then
            "$venv/bin/pip" install -q -r "$req" || { echo "pip install -r $req failed" >&2; return 1; }
        else
            "$venv/bin/pip" install -q pytest || { echo "pip install pytest failed" >&2; return 1; }
        fi
        printf '%s' "$want" >"$stamp"
    fi
}

# requirements_text FILE: FILE's text followed by that of the files it
# includes with -r/-c (recursively, at most 10 deep), for the stamp.
requirements_text() {
    local file=$1 depth=${2:-0} line inc dir
    dir=$(dirname "$file")
    cat "$file"
    ((depth < 10)) || return 0
    while IFS= read -r line; do
        [[ $line =~ ^[[:space:]]*-[rc][[:space:]]+([^[:space:]]+) ]] || continue
        inc=${BASH_REMATCH[1]}
        [[ $inc == /* ]] || inc=$dir/$inc
        [[ -f $inc ]] && { printf '\n# %s\n' "$inc"; requirements_text "$inc" $((depth + 1)); }
    done <"$file"
}
