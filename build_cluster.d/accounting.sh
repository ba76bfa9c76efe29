# shellcheck shell=bash
# build_cluster.d/accounting.sh -- Slurm accounting in a real database for
# the single-machine cluster (MariaDB + slurmdbd), the course's Slurm
# account, the student QOS, and the roster (`build_cluster.sh accounts`).
#
# Sourced by build_cluster.sh after common.sh and local.sh (never run by
# itself). What it holds:
#   local_start_accounting   step 3a of `--local up`, before slurmctld:
#                            MariaDB (own datadir, socket, 127.0.0.1 port),
#                            the database user, slurmdbd.conf, slurmdbd
#   local_setup_accounts     step 3b, after slurmctld: the cluster, the
#                            course account, the student QOS and its limits
#                            (root's association comes with the cluster; the
#                            demo user's is added by local_demo)
#   accounts_main ARGS       `build_cluster.sh accounts add --csv roster.csv
#                            [--instructors] | list | remove USER [--archive]`
# No systemd here: both daemons are started in the background, recorded in
# STARTED_FILE like the others (so `--local stop` stops them), and every
# step is idempotent.
#
# Needs from common.sh: log, warn, die, wait_for, MARKER and the accounting
# settings (DELEGATE_DB_*, DELEGATE_DBD_PORT, DELEGATE_COURSE_ACCOUNT,
# DELEGATE_QOS_*). From local.sh: record_started, install_generated,
# stop_recorded, STARTED_FILE. From build_cluster.sh: the DELEGATE_* paths
# and SLURM_CONF.

# Files of the database and slurmdbd.
# (in a directory of its own: mariadbd runs as mysql and writes there)
DB_RUN_DIR=$DELEGATE_RUN_DIR/mariadb
DB_SOCKET=$DB_RUN_DIR/mariadb.sock
DB_PIDFILE=$DB_RUN_DIR/mariadb.pid
# The database password of slurmdbd, generated once, readable by root only.
DB_PASSFILE=$DELEGATE_STATE_DIR/slurmdbd.pass
DBD_CONF=$(dirname "$SLURM_CONF")/slurmdbd.conf
# The sacctmgr command the course setup runs (accounting_cluster,
# accounting_course, add_association, sacctmgr_q): this machine's; the
# stack sets it to a `docker exec` in its slurmdbd's container
# (stack_accounting.sh), so both modes share these functions.
SACCTMGR=(sacctmgr)

# db_sql SQL: run SQL as the database's root over its socket (root of this
# machine authenticates by unix_socket; no password exists).
db_sql() {
    mariadb --no-defaults --protocol=socket --socket="$DB_SOCKET" -u root -N -B -e "$1"
}
db_ok() { mariadb-admin --no-defaults --socket="$DB_SOCKET" -u root ping >/dev/null 2>&1; }
slurmdbd_ok() { timeout 10 "${SACCTMGR[@]}" -n -P show cluster format=cluster >/dev/null 2>&1; }
# slurmdbd_pid: the pid of OUR slurmdbd (its pid file, when that process is
# a slurmdbd), else nothing: another slurmdbd on this machine is not ours.
slurmdbd_pid() {
    local pid
    pid=$(cat "$DELEGATE_RUN_DIR/slurmdbd.pid" 2>/dev/null) || return 0
    [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == slurmdbd ]] && echo "$pid"
    return 0
}

# start_mariadb: the database server on its own datadir, socket and port
# (127.0.0.1 only), initialised on first use; nothing of a system MariaDB
# (/etc/mysql, /var/lib/mysql) is read or touched.
start_mariadb() {
    if db_ok; then
        log "mariadb: already running"; return
    fi
    install -d -o mysql -g mysql -m 0750 "$DELEGATE_DB_DIR"
    install -d -m 0755 "$DELEGATE_RUN_DIR"
    install -d -o mysql -g mysql -m 0755 "$DB_RUN_DIR"
    if [[ ! -d $DELEGATE_DB_DIR/mysql ]]; then
        log "mariadb: initialising $DELEGATE_DB_DIR"
        private_logs "$DELEGATE_LOG_DIR" mariadb-install.log
        mariadb-install-db --no-defaults --user=mysql --datadir="$DELEGATE_DB_DIR" \
            --auth-root-authentication-method=socket --skip-test-db \
            >>"$DELEGATE_LOG_DIR/mariadb-install.log" 2>&1 \
            || die "mariadb-install-db failed; see $DELEGATE_LOG_DIR/mariadb-install.log"
    fi
    touch "$DELEGATE_LOG_DIR/mariadb.log"; chown mysql "$DELEGATE_LOG_DIR/mariadb.log"
    # InnoDB settings slurmdbd's documentation asks for (large buffer pool,
    # long lock wait for the rollup of a big job table).
    detached mariadbd --no-defaults --user=mysql --datadir="$DELEGATE_DB_DIR" \
        --socket="$DB_SOCKET" --pid-file="$DB_PIDFILE" --port="$DELEGATE_DB_PORT" \
        --bind-address=127.0.0.1 --log-error="$DELEGATE_LOG_DIR/mariadb.log" \
        --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 \
        >/dev/null 2>&1 </dev/null
    record_started mariadbd $!
    wait_for "$DELEGATE_WAIT" mariadb db_ok \
        || die "mariadb not answering after ${DELEGATE_WAIT}s; tail $DELEGATE_LOG_DIR/mariadb.log:
$(tail -n 20 "$DELEGATE_LOG_DIR/mariadb.log")"
}

# db_password: slurmdbd's database password (created once, root only).
db_password() {
    if [[ ! -s $DB_PASSFILE ]]; then
        (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$DB_PASSFILE")
    fi
    cat "$DB_PASSFILE"
}

# slurmdbd_conf SLURMUSER DBDADDR DBDHOST STORAGEHOST PASSWORD LOG_DIR RUN_DIR
# WHERE: slurmdbd.conf on stdout, for both modes (--local: 127.0.0.1 and
# this machine's database; the stack: its "dbd" and "db" services). WHERE
# is a comment line saying which deployment it is for. DBDADDR empty:
# listen on every address.
slurmdbd_conf() {
    local slurmuser=$1 addr=$2 dbdhost=$3 shost=$4 pass=$5 logdir=$6 rundir=$7 where=$8
    cat <<CONF
$MARKER
# slurmdbd (build_cluster.d/accounting.sh) $where
AuthType=auth/munge
${addr:+DbdAddr=$addr}
DbdHost=$dbdhost
DbdPort=$DELEGATE_DBD_PORT
SlurmUser=$slurmuser
LogFile=$logdir/slurmdbd.log
PidFile=$rundir/slurmdbd.pid
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=$shost
StoragePort=$DELEGATE_DB_PORT
StorageUser=slurm
StoragePass=$pass
StorageLoc=$DELEGATE_DB_NAME
# As slurm.conf: a user sees only their own jobs, usage, user and account
# records in sacct/sreport/sshare; root, SlurmUser and the course's
# coordinators/operators see everything.
PrivateData=jobs,usage,users,accounts
# Keep a term of job records; older ones are purged (monthly rollups stay).
PurgeJobAfter=12months
PurgeStepAfter=12months
CONF
}

# write_slurmdbd_conf SLURMUSER: slurmdbd.conf beside slurm.conf (0600,
# owned by SlurmUser, as slurmdbd demands); returns 0 when it changed.
write_slurmdbd_conf() {
    local slurmuser=$1 tmp rc=1
    tmp=$(mktemp -p "$BC_TMP")
    slurmdbd_conf "$slurmuser" 127.0.0.1 localhost 127.0.0.1 "$(db_password)" \
        "$DELEGATE_LOG_DIR" "$DELEGATE_RUN_DIR" \
        "for the single-machine cluster: MariaDB on 127.0.0.1:$DELEGATE_DB_PORT, datadir $DELEGATE_DB_DIR (started by build_cluster.sh)" \
        >"$tmp"
    install_generated "$tmp" "$DBD_CONF" 0600 && rc=0
    chown "$slurmuser" "$DBD_CONF"
    rm -f "$tmp"
    return $rc
}

# local_start_accounting: step 3a, before slurmctld (which needs slurmdbd
# to know the associations it enforces).
local_start_accounting() {
    local slurmuser=root pass
    id slurm >/dev/null 2>&1 && slurmuser=slurm
    start_mariadb
    pass=$(db_password)
    db_sql "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
            ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
            GRANT ALL ON \`$DELEGATE_DB_NAME\`.* TO 'slurm'@'127.0.0.1';" \
        || die "cannot create the database user slurm"
    touch "$DELEGATE_LOG_DIR/slurmdbd.log"; chown "$slurmuser" "$DELEGATE_LOG_DIR/slurmdbd.log"
    local changed=0 pid
    write_slurmdbd_conf "$slurmuser" && changed=1
    pid=$(slurmdbd_pid)
    if ((changed)) && [[ -n $pid ]]; then
        log "slurmdbd: configuration changed, restarting it"
        stop_recorded slurmdbd "$pid"
        pid=""
    fi
    if [[ -n $pid ]] && slurmdbd_ok; then
        log "slurmdbd: already running"
    else
        [[ -n $pid ]] || SLURM_CONF=$SLURM_CONF slurmdbd \
            || die "slurmdbd failed to start; see $DELEGATE_LOG_DIR/slurmdbd.log"
        wait_for "$DELEGATE_WAIT" slurmdbd slurmdbd_ok \
            || die "slurmdbd not answering after ${DELEGATE_WAIT}s; tail $DELEGATE_LOG_DIR/slurmdbd.log:
$(tail -n 20 "$DELEGATE_LOG_DIR/slurmdbd.log")"
        record_started slurmdbd "$(slurmdbd_pid)"
    fi
    accounting_cluster
}

# sacctmgr_q ARGS: sacctmgr without questions; "Nothing new added" and
# "Nothing modified" are not failures (idempotent runs).
sacctmgr_q() {
    local out rc=0
    out=$(timeout 60 "${SACCTMGR[@]}" -i "$@" 2>&1) || rc=$?
    if ((rc != 0)) && ! grep -qiE 'nothing (new added|modified)|already exists' <<<"$out"; then
        warn "sacctmgr $*: $out"
        return 1
    fi
    return 0
}

# cluster_name: ClusterName of slurm.conf.
cluster_name() { sed -n 's/^ClusterName=//p' "$SLURM_CONF" | head -n1; }

# accounting_cluster: the cluster registered in the database (slurmctld
# would add it itself on its first connection; explicit so that the
# account and QOS below exist before the first job).
accounting_cluster() {
    local c; c=$(cluster_name)
    [[ -n $c ]] || die "no ClusterName in $SLURM_CONF"
    if [[ -z $("${SACCTMGR[@]}" -n -P show cluster "$c" format=cluster 2>/dev/null) ]]; then
        sacctmgr_q add cluster "$c" || die "cannot register the cluster $c in slurmdbd"
        log "accounting: cluster $c registered"
    fi
}

# qos_limits: the student QOS's per-user limits as sacctmgr arguments, from
# the settings (common.sh / cluster.toml).
qos_limits() {
    printf '%s\n' "MaxSubmitJobsPerUser=$DELEGATE_QOS_MAX_SUBMIT" \
        "MaxJobsPerUser=$DELEGATE_QOS_MAX_RUNNING"
}

# accounting_course: the student QOS with its limits, the course account
# (default QOS student), root's association.
accounting_course() {
    local c; c=$(cluster_name)
    local -a limits
    mapfile -t limits < <(qos_limits)
    if [[ -z $("${SACCTMGR[@]}" -n -P show qos "$DELEGATE_STUDENT_QOS" format=name 2>/dev/null) ]]; then
        sacctmgr_q add qos "$DELEGATE_STUDENT_QOS" || die "cannot add the QOS $DELEGATE_STUDENT_QOS"
    fi
    sacctmgr_q modify qos "$DELEGATE_STUDENT_QOS" set "${limits[@]}" \
        || die "cannot set the limits of the QOS $DELEGATE_STUDENT_QOS"
    if [[ -z $("${SACCTMGR[@]}" -n -P show account "$DELEGATE_COURSE_ACCOUNT" format=account 2>/dev/null) ]]; then
        sacctmgr_q add account "$DELEGATE_COURSE_ACCOUNT" cluster="$c" \
            description="delegate course" organization=delegate \
            || die "cannot add the account $DELEGATE_COURSE_ACCOUNT"
    fi
    # The student QOS only: a student who runs sbatch by hand with
    # --qos=normal must not escape the limits.
    sacctmgr_q modify account "$DELEGATE_COURSE_ACCOUNT" set \
        qos="$DELEGATE_STUDENT_QOS" defaultqos="$DELEGATE_STUDENT_QOS" \
        || die "cannot set the QOS of the account $DELEGATE_COURSE_ACCOUNT"
    # Slurm 22.05's QOS has no per-user TRES-run-minutes limit: it is the
    # GrpTRESRunMins of each user's own association (set here for all of
    # them, so a changed setting reaches existing students).
    # (Read whole first: under pipefail, grep -q ending the pipe early would
    # fail the test with sacctmgr's SIGPIPE once the course is large.)
    local course_users
    course_users=$("${SACCTMGR[@]}" -n -P show assoc where account="$DELEGATE_COURSE_ACCOUNT" format=user 2>/dev/null || true)
    if [[ -n ${course_users//[[:space:]]/} ]]; then
        sacctmgr_q modify user where account="$DELEGATE_COURSE_ACCOUNT" set \
            grptresrunmins="cpu=$DELEGATE_QOS_MAX_CPU_RUN_MINS" \
            || warn "cannot set GrpTRESRunMins of the users of $DELEGATE_COURSE_ACCOUNT"
    fi
    log "accounting: account $DELEGATE_COURSE_ACCOUNT, QOS $DELEGATE_STUDENT_QOS ($(tr '\n' ' ' < <(qos_limits))), per user GrpTRESRunMins=cpu=$DELEGATE_QOS_MAX_CPU_RUN_MINS"
}

# add_association USER [ADMIN]: USER in the course account (default QOS
# student); ADMIN=1 makes them a coordinator of the account and a Slurm
# operator (sees and manages every job and record). Idempotent.
add_association() {
    local u=$1 admin=${2:-0}
    if [[ -z $("${SACCTMGR[@]}" -n -P show assoc where user="$u" account="$DELEGATE_COURSE_ACCOUNT" format=user 2>/dev/null) ]]; then
        sacctmgr_q add user "$u" account="$DELEGATE_COURSE_ACCOUNT" defaultaccount="$DELEGATE_COURSE_ACCOUNT" \
            grptresrunmins="cpu=$DELEGATE_QOS_MAX_CPU_RUN_MINS" || return 1
    fi
    if ((admin)); then
        sacctmgr_q add coordinator account="$DELEGATE_COURSE_ACCOUNT" names="$u" || return 1
        sacctmgr_q modify user "$u" set adminlevel=operator || return 1
    fi
}

# local_setup_accounts: step 3b: the course account and QOS (local_demo
# then puts the demo user in it: the demo job is the first check that
# enforcement lets a student through).
local_setup_accounts() {
    accounting_cluster
    accounting_course
}

# ---------------------------------------------------------------- roster
# The roster is a CSV file (quoted fields may hold commas):
# username,full name[,email][,role]; a header
# line (username,...) and blank or #-lines are skipped; role "instructor"
# (or --instructors for the whole file) makes a coordinator/operator and a
# member of the admin group. Accounts get the same uid on every machine: a
# uid column is not needed, the first free id from DELEGATE_ROSTER_FIRST_UID
# is taken; --local has one machine.

# roster_rows FILE ALL_INSTRUCTORS: "line|user|name|email|role" per roster
# line, every line checked by delegate-deploy (deploy/src/roster.rs: CSV
# with quoted fields, valid user names, no ':' or control characters in a
# name or email, role student or instructor, no user twice); role is
# "instructor" for every line when ALL_INSTRUCTORS is 1. Dies with the line
# and the reason.
roster_rows() {
    local flag=()
    [[ $2 == 1 ]] && flag=(--instructors)
    deploy_build
    "$REPO/target/release/delegate-deploy" roster "$1" "${flag[@]}" || die "the roster $1 cannot be used (above)"
}

# ensure_unix_account USER NAME EMAIL: the account with a group of its own
# (same id), a 0700 home under DELEGATE_ROSTER_HOME_BASE; an existing
# account is left as it is. Sets ACCOUNT_CREATED=1 when it made one.
ACCOUNT_CREATED=0
ensure_unix_account() {
    local u=$1 name=${2//,/ } email=${3//,/ } id  # (commas separate GECOS fields)
    ACCOUNT_CREATED=0
    if id "$u" >/dev/null 2>&1; then
        return 0
    fi
    install -d -m 0755 "$DELEGATE_ROSTER_HOME_BASE"
    id=$DELEGATE_ROSTER_FIRST_UID
    while getent passwd "$id" >/dev/null || getent group "$id" >/dev/null; do
        id=$((id + 1))
    done
    if getent group "$u" >/dev/null; then
        useradd --create-home --base-dir "$DELEGATE_ROSTER_HOME_BASE" --uid "$id" --gid "$u" --shell /bin/bash --comment "$name${email:+,,,$email}" "$u" \
            || die "cannot create the account $u"
    else
        groupadd --gid "$id" "$u" || die "cannot create the group $u"
        useradd --create-home --base-dir "$DELEGATE_ROSTER_HOME_BASE" --uid "$id" --gid "$id" --shell /bin/bash --comment "$name${email:+,,,$email}" "$u" \
            || die "cannot create the account $u"
    fi
    chmod 0700 "$(getent passwd "$u" | cut -d: -f6)"
    ACCOUNT_CREATED=1
    log "accounts: created $u (uid $id)"
}

# accounts_add FILE INSTRUCTORS: every roster line: Unix account, home,
# association; instructors also coordinator/operator and admin group.
accounts_add() {
    local file=$1 all_instr=$2 rows u name email role n=0
    [[ -r $file ]] || die "cannot read the roster $file"
    rows=$(roster_rows "$file" "$all_instr") || exit 1
    while IFS='|' read -r _ u name email role; do
        [[ -n $u ]] || continue
        ensure_unix_account "$u" "$name" "$email"
        home_quota_apply "$u" "$ACCOUNT_CREATED"
        local admin=0
        [[ $role == instructor ]] && admin=1
        add_association "$u" "$admin" || die "cannot add the Slurm association of $u"
        if ((admin)); then
            getent group "$DELEGATE_ADMIN_GROUP" >/dev/null || groupadd --system "$DELEGATE_ADMIN_GROUP"
            id -nG "$u" | tr ' ' '\n' | grep -qx "$DELEGATE_ADMIN_GROUP" \
                || usermod -a -G "$DELEGATE_ADMIN_GROUP" "$u"
        fi
        n=$((n + 1))
    done <<<"$rows"
    log "accounts: $n roster entries in place (account $DELEGATE_COURSE_ACCOUNT)"
}

# accounts_list: the course account's users, with their Unix uid and role.
accounts_list() {
    local u coord
    coord=$(sacctmgr -n -P show account "$DELEGATE_COURSE_ACCOUNT" withcoord format=coordinators 2>/dev/null | tr ',' ' ')
    printf '%-20s %-7s %-10s %-16s %s\n' USER UID ROLE DISK NAME
    sacctmgr -n -P show assoc where account="$DELEGATE_COURSE_ACCOUNT" format=user 2>/dev/null | sort -u \
        | while read -r u; do
            [[ -n $u ]] || continue
            local role=student
            [[ " $coord " == *" $u "* ]] && role=instructor
            printf '%-20s %-7s %-10s %-16s %s\n' "$u" "$(id -u "$u" 2>/dev/null || echo -)" "$role" "$(home_quota_show "$u")" \
                "$(getent passwd "$u" | cut -d: -f5 | cut -d, -f1)"
        done
}

# accounts_remove USER ARCHIVE: the association removed; the Unix account
# removed with its home kept (ARCHIVE=1: the home is first packed into
# $DELEGATE_STATE_DIR/archive/USER-DATE.tar.gz, then removed).
accounts_remove() {
    local u=$1 archive=$2 home
    [[ $u =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || die "'$u' is not a user name"
    id "$u" >/dev/null 2>&1 || warn "no Unix account $u"
    home=$(getent passwd "$u" | cut -d: -f6 || true)
    sacctmgr_q delete user name="$u" account="$DELEGATE_COURSE_ACCOUNT" || warn "cannot remove the association of $u (jobs still running?)"
    if id "$u" >/dev/null 2>&1; then
        if [[ $archive == 1 && -d $home ]]; then
            install -d -m 0700 "$DELEGATE_STATE_DIR/archive"
            tar -C "$(dirname "$home")" -czf "$DELEGATE_STATE_DIR/archive/$u-$(date +%Y%m%d%H%M%S).tar.gz" "$(basename "$home")" \
                || die "cannot archive $home"
            home_remove_subvolume "$home"
            userdel -r "$u" 2>/dev/null || userdel "$u"
            log "accounts: removed $u (home archived in $DELEGATE_STATE_DIR/archive/)"
        else
            userdel "$u" || die "cannot remove the account $u"
            log "accounts: removed $u (home $home kept)"
        fi
    fi
}

# accounts_main ARGS: `build_cluster.sh accounts add --csv FILE
# [--instructors] | list | remove USER [--archive]` on this machine.
accounts_main() { accounts_dispatch accounts_add accounts_list accounts_remove "$@"; }

# accounts_dispatch ADD LIST REMOVE ARGS: parses the `accounts` arguments
# and calls ADD FILE INSTRUCTORS, LIST or REMOVE USER ARCHIVE (the local
# roster's functions here, the stack's in hub.sh).
accounts_dispatch() {
    local f_add=$1 f_list=$2 f_remove=$3; shift 3
    local sub=${1:-list}; shift || true
    case $sub in
        add)
            local file="" instr=0
            while (($#)); do
                case $1 in
                    --csv) (($# > 1)) || die "--csv needs a file"; file=$2; shift ;;
                    --csv=*) file=${1#--csv=} ;;
                    --instructors) instr=1 ;;
                    *) die "accounts add: unknown argument '$1'" ;;
                esac
                shift
            done
            [[ -n $file ]] || die "accounts add needs --csv roster.csv"
            need_root accounts
            "$f_add" "$file" "$instr" ;;
        list) "$f_list" ;;
        remove)
            local u="" archive=0
            while (($#)); do
                case $1 in
                    --archive) archive=1 ;;
                    -*) die "accounts remove: unknown option '$1'" ;;
                    *) u=$1 ;;
                esac
                shift
            done
            [[ -n $u ]] || die "accounts remove needs a user name"
            need_root accounts
            "$f_remove" "$u" "$archive" ;;
        *) die "accounts: unknown action '$sub' (add --csv FILE [--instructors] | list | remove USER [--archive])" ;;
    esac
}
