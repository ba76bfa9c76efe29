#!/bin/bash
# Entrypoint of the stack's accounting database (service "db",
# docker/db.Dockerfile): MariaDB for slurmdbd.
#
# Inputs (from the stack file):
#   /run/secrets/db_password   slurmdbd's database password (swarm secret)
#   DELEGATE_DB_NAME           the accounting database's name
#   /var/lib/mysql             the data: a named volume (kept by `down`)
# First start: the data directory is initialised (root authenticates by
# unix socket only: no root password exists). Every start: the user
# 'slurm'@'%' gets the secret's password and every right on the accounting
# database (an --init-file, so a changed secret takes effect at the next
# start), then mariadbd runs in the foreground.
set -euo pipefail
log() { printf '%s [db %s] %s\n' "$(date '+%H:%M:%S')" "$(hostname)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }
DATA=/var/lib/mysql
DB=${DELEGATE_DB_NAME:?DELEGATE_DB_NAME not set}
[[ $DB =~ ^[A-Za-z0-9_]+$ ]] || die "DELEGATE_DB_NAME must be letters, digits and _"
[[ -s /run/secrets/db_password ]] || die "the secret db_password is missing"
pass=$(head -c 200 /run/secrets/db_password)
[[ $pass =~ ^[A-Za-z0-9]{16,200}$ ]] || die "the db_password secret must be 16+ letters and digits"

install -d -o mysql -g mysql -m 0750 "$DATA"
install -d -o mysql -g mysql -m 0755 /run/mysqld
chown mysql:mysql "$DATA"
if [[ ! -d $DATA/mysql ]]; then
    log "initialising $DATA"
    mariadb-install-db --no-defaults --user=mysql --datadir="$DATA" \
        --auth-root-authentication-method=socket --skip-test-db >/dev/null \
        || die "mariadb-install-db failed"
fi
init=/run/mysqld/init.sql
(
    umask 077
    cat >"$init" <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'%' IDENTIFIED BY '$pass';
ALTER USER 'slurm'@'%' IDENTIFIED BY '$pass';
GRANT ALL ON \`$DB\`.* TO 'slurm'@'%';
SQL
)
chown mysql:mysql "$init"
log "starting mariadbd (database $DB)"
# InnoDB settings slurmdbd's documentation asks for (as --local's).
exec mariadbd --no-defaults --user=mysql --datadir="$DATA" \
    --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/mysqld.pid \
    --port=3306 --bind-address=0.0.0.0 --init-file="$init" \
    --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 \
    --log-error=/dev/stderr
