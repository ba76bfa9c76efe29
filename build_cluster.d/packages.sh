# shellcheck shell=bash
# build_cluster.d/packages.sh -- which Debian packages are missing; sourced by
# build_cluster.sh (local.sh installs them) and tests/lint.sh (its tools).
# No side effects when sourced.

# missing_packages PACKAGE...: prints, one per line, those not installed.
missing_packages() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' \
            || echo "$p"
    done
}
