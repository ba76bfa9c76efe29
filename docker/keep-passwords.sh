#!/bin/bash
# keep-passwords: the user node's passwords survive a restart of its
# container (docs/security.md, "The hub").
#
# The node sets every account's password from the roster's secret
# (hub-passwords, "name:hash", the initial passwords) each time it starts.
# A student who changed theirs (`passwd` in a JupyterLab terminal) would get
# the initial one back after a restart. So, as root on the user node:
#
#   keep-passwords restore SECRET STORE   after `chpasswd -e <SECRET>`: set
#       the hashes STORE remembers, for the accounts whose entry in SECRET
#       is still the initial hash STORE saw (an instructor who sets a new
#       initial password, `accounts add` after `remove`, wins)
#   keep-passwords watch SECRET STORE     every few seconds, when /etc/shadow
#       changed: remember each account whose hash differs from SECRET's
#
# STORE ("name:initial-hash:current-hash" lines, root 0600) lives in the
# hub's state directory, a host directory the stack keeps across restarts,
# updates and `down`. Hashes are crypt(3) strings (no ':'); anything else
# in either file is skipped.
set -uo pipefail

SHADOW=${KEEP_PASSWORDS_SHADOW:-/etc/shadow}
INTERVAL=${KEEP_PASSWORDS_INTERVAL:-3}

log() { printf '%s [keep-passwords] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }

# secret_hashes SECRET: "name hash" lines of the roster's secret.
secret_hashes() {
    awk -F: 'NF == 2 && $1 ~ /^[a-z_][a-z0-9_.-]*$/ && $2 ~ /^[$][^:[:space:]]+$/ { print $1, $2 }' "$1"
}

restore() {
    local secret=$1 store=$2 name init cur n=0
    [[ -f $store && ! -L $store ]] || return 0
    local -A initial=()
    while read -r name init; do initial[$name]=$init; done < <(secret_hashes "$secret")
    while IFS=: read -r name init cur; do
        [[ -n ${initial[$name]:-} && ${initial[$name]} == "$init" && $cur == \$* && $cur != *[[:space:]]* ]] || continue
        if printf '%s:%s\n' "$name" "$cur" | chpasswd -e; then
            n=$((n + 1))
        else
            log "cannot set the kept password of $name"
        fi
    done <"$store"
    log "$n kept password(s) set"
}

# snapshot SECRET STORE: STORE from the current shadow file.
snapshot() {
    local secret=$1 store=$2 tmp
    tmp=$(mktemp "$store.XXXXXX") || return 1
    if awk -F: 'NR == FNR { init[$1] = $2; next }
             ($1 in init) && $2 != init[$1] && $2 ~ /^[$]/ { print $1 ":" init[$1] ":" $2 }' \
        <(secret_hashes "$secret" | tr ' ' ':') "$SHADOW" >"$tmp" && chmod 0600 "$tmp" && mv -f "$tmp" "$store"; then
        return 0
    fi
    rm -f "$tmp"
    return 1
}

watch() {
    local secret=$1 store=$2 seen="" now
    while :; do
        now=$(stat -c %Y.%s.%i "$SHADOW" 2>/dev/null || true)
        if [[ $now != "$seen" ]]; then
            if snapshot "$secret" "$store"; then
                seen=$now
            else
                log "cannot write $store"
            fi
        fi
        sleep "$INTERVAL"
    done
}

case ${1:-} in
    restore | watch)
        [[ $# == 3 && -f $2 ]] || { echo "usage: keep-passwords restore|watch SECRET STORE" >&2; exit 2; }
        umask 077
        "$1" "$2" "$3"
        ;;
    *) echo "usage: keep-passwords restore|watch SECRET STORE" >&2; exit 2 ;;
esac
