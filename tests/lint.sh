#!/bin/bash
# tests/lint.sh -- the repo's lint and format policy, checked. The first
# stage of tests/run.sh (so CI enforces it); a developer can run it by
# itself, from anywhere:  tests/lint.sh
#   1. cargo fmt --all --check                      (rustfmt.toml)
#   2. cargo clippy --workspace --all-targets --release -- -D warnings
#                                                   (the workspace's lints)
#   3. shellcheck -x on every shell script          (.shellcheckrc)
#   4. ruff check                                   (ruff.toml)
#   5. ruff format --check
#   6. tests/check_docs.py                          (every link of the docs leads somewhere)
#   7. tests/check_function_length.py               (no product function over 100 lines)
# Every check runs; the failed ones are named at the end and the exit
# status is 1 when any failed. Nothing is changed: to fix formatting, run
# `cargo fmt --all` and `ruff format` (from the test venv, below).
#
# The shell scripts are found, not listed: every file git knows here
# (tracked, or new and not ignored) that is named *.sh, starts with a
# sh/bash #! line, or says `# shellcheck shell=...` near its top (the
# sourced parts of build_cluster.sh). Outside a git checkout: every file
# under the repo but target/ and .git/.
#
# What it needs and installs when missing (as root, with apt-get): the
# Debian packages shellcheck, python3-venv, and build-essential and
# pkg-config for clippy's build scripts. ruff comes from the test venv ($DELEGATE_VENV, default
# /var/lib/delegate/venv; tests/requirements.txt pins it), created or
# updated here as tests/run.sh does (tests/venv.sh). cargo with rustfmt
# and clippy comes from rustup (~/.cargo/bin).
#
# tests/run.sh skips this stage when DELEGATE_SKIP_LINT=1 (for a local run
# only; CI never sets it).
set -euo pipefail

REPO=$(cd "$(dirname "$(readlink -f -- "${BASH_SOURCE[0]}")")/.." && pwd)
VENV=${DELEGATE_VENV:-/var/lib/delegate/venv}
export PATH="$HOME/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"
export DEBIAN_FRONTEND=noninteractive
# shellcheck source=venv.sh
source "$REPO/tests/venv.sh"
# shellcheck source=../build_cluster.d/packages.sh
source "$REPO/build_cluster.d/packages.sh"

# The checks that failed, by name.
FAILED=()

# header TEXT: a line announcing the next check.
header() { printf '\n\033[1;34m--- lint: %s\033[0m\n' "$*"; }

# run_check NAME CMD...: run CMD in the repo; on failure remember NAME.
run_check() {
    local name=$1; shift
    header "$name"
    if (cd "$REPO" && "$@"); then
        printf '\033[32mok\033[0m   %s\n' "$name"
    else
        printf '\033[31mFAIL\033[0m %s\n' "$name"
        FAILED+=("$name")
    fi
}

# ensure_packages PACKAGE...: apt-get install the Debian packages that are
# missing (as root; else say what to install and return 1).
ensure_packages() {
    local missing=()
    mapfile -t missing < <(missing_packages "$@")
    ((${#missing[@]} == 0)) && return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "lint needs these Debian packages: ${missing[*]} (apt-get install ${missing[*]}, as root)" >&2
        return 1
    fi
    echo "lint: installing ${missing[*]}"
    # A fresh machine may have no package index yet: update and retry once.
    apt-get install -y -q "${missing[@]}" \
        || { apt-get update -q && apt-get install -y -q "${missing[@]}"; }
}

# shell_scripts: print the repo's shell scripts (paths relative to the repo),
# one per line, sorted.
shell_scripts() {
    local files f first
    if ! files=$(git -C "$REPO" ls-files --cached --others --exclude-standard 2>/dev/null); then
        files=$(cd "$REPO" && find . -type f ! -path './target/*' ! -path './.git/*' | sed 's|^\./||')
    fi
    while IFS= read -r f; do
        [[ -f $REPO/$f ]] || continue          # tracked but deleted here
        if [[ $f == *.sh ]]; then
            echo "$f"; continue
        fi
        IFS= read -r first <"$REPO/$f" 2>/dev/null || first=
        if [[ $first =~ ^\#!.*(/|[[:space:]])(ba|da|k)?sh([[:space:]]|$) ]] \
            || head -n 5 "$REPO/$f" 2>/dev/null | grep -q '^# shellcheck shell='; then
            echo "$f"
        fi
    done <<<"$files" | sort -u
}

# check_shell: shellcheck -x on every shell script (SC1091 and the rest as
# errors; settings in .shellcheckrc).
check_shell() {
    local scripts=()
    mapfile -t scripts < <(shell_scripts)
    ((${#scripts[@]} > 0)) || { echo "no shell scripts found" >&2; return 1; }
    echo "shellcheck $(shellcheck --version | sed -n 's/^version: //p') on ${#scripts[@]} scripts: ${scripts[*]}"
    shellcheck -x "${scripts[@]}"
}

# need_tool NAME CMD...: CMD (a version query) works, else say NAME is
# missing and fail.
need_tool() {
    local name=$1; shift
    "$@" >/dev/null 2>&1 || { echo "$name is not installed ($*)" >&2; return 1; }
}

cd "$REPO"
T0=$SECONDS
printf '\033[1m=== lint: the repo policy (fmt, clippy, shellcheck, ruff)\033[0m\n'

ensure_packages shellcheck python3-venv build-essential pkg-config || FAILED+=("packages")

if need_tool rustfmt cargo fmt --version; then
    run_check "cargo fmt --all --check" cargo fmt --all --check
else
    FAILED+=("cargo fmt (rustfmt missing: rustup component add rustfmt)")
fi
if need_tool clippy cargo clippy --version; then
    run_check "cargo clippy --workspace --all-targets --release -- -D warnings" \
        cargo clippy --workspace --all-targets --release -- -D warnings
else
    FAILED+=("cargo clippy (clippy missing: rustup component add clippy)")
fi

if need_tool shellcheck shellcheck --version; then
    run_check "shellcheck -x (every shell script)" check_shell
else
    FAILED+=("shellcheck (not installed)")
fi

if ensure_venv "$VENV" "$REPO/tests/requirements.txt"; then
    if [[ -x $VENV/bin/ruff ]]; then
        run_check "ruff check" "$VENV/bin/ruff" check
        run_check "ruff format --check" "$VENV/bin/ruff" format --check
        run_check "docs: links and anchors (tests/check_docs.py)" "$VENV/bin/python" tests/check_docs.py
        run_check "functions at most 100 lines (tests/check_function_length.py)" "$VENV/bin/python" tests/check_function_length.py
    else
        echo "ruff is not in the venv $VENV (pin it in tests/requirements.txt)" >&2
        FAILED+=("ruff (not installed)")
    fi
else
    FAILED+=("ruff (no venv $VENV)")
fi

echo
if ((${#FAILED[@]})); then
    printf '\033[1;31m=== lint FAILED (%ds):\033[0m\n' "$((SECONDS - T0))" >&2
    printf '  %s\n' "${FAILED[@]}" >&2
    exit 1
fi
printf '\033[1;32m=== lint: every check passed (%ds)\033[0m\n' "$((SECONDS - T0))"
