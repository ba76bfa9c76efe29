# shellcheck shell=bash
# build_cluster.d/check.sh -- the instructor's check of a deployed stack:
# `./build_cluster.sh test`.
#
# Against the stack that `deploy` started (stack.sh), as the two test
# accounts of cluster.toml (DELEGATE_STACK_TEST_USERS), it checks and prints
# ok/FAIL for each: every worker idle; a trivial job on each worker; a
# Python function through delegate as each account (own uid, a perf
# counter; the user-side script is stack/check_user.py, run on the user
# node); neither account can read the other's job directories; exclusive
# nodes; a map pulled by an allocation on every worker; JupyterHub serving the
# stack's certificate and letting a test account log in; the root agent answering on every worker,
# and no student reaching the Docker socket there. Exits 1 (die) when any check failed.
# The action is stack_test; each check is a function t_* run by `check`.
#
# Sourced by build_cluster.sh after common.sh, local.sh and stack.sh (never
# run by itself). Needs from common.sh: log, die, need_root, T0; from
# stack.sh: stack_load_config, stack_deployed_workers, stack_secrets,
# stack_wait, stack_exec, stack_exec_as, stack_nodes_idle and the variables
# stack_load_config/stack_secrets set (STACK, STACK_SECRETS, ...); from hub.sh: nothing (t_hub reads
# STACK_SECRETS/initial-passwords and hub-tls.crt); from
# build_cluster.sh: REPO.

# Set to 1 by `check` when a check fails; stack_test dies at the end then.
STACK_TEST_FAILED=0

# check DESCRIPTION CMD...: run CMD, print ok or FAIL with its output
# indented below, remember a failure in STACK_TEST_FAILED; always returns 0
# so every check runs.
check() {
    local what=$1 out; shift
    if out=$("$@" 2>&1); then
        printf '  \033[32mok\033[0m   %s\n' "$what"
        [[ -n $out ]] && printf '%s\n' "$out" | sed 's/^/       /'
    else
        printf '  \033[31mFAIL\033[0m %s\n' "$what"
        printf '%s\n' "$out" | sed 's/^/       /'
        STACK_TEST_FAILED=1
    fi
    return 0
}

# --- the checks: each prints what it saw and returns non-zero on failure
# t_sinfo_idle: sinfo on the head, and every worker idle.
t_sinfo_idle() {
    stack_exec head sinfo -N -o '%N %T %c %m' || return 1
    stack_nodes_idle
}
# t_job_on_each_worker: one `sbatch --wait -w workerI` per worker at once,
# as root (an admin: students may only submit delegate's own jobs) from the
# user node; each must print its worker's hostname.
t_job_on_each_worker() {
    local i pids=() rc=0 out f
    for i in "${STACK_WORKER_IDS[@]}"; do
        stack_exec user timeout 180 sbatch --wait -Q -w "worker$i" -t 2 \
            -o "$DELEGATE_STACK_HOME/.stack-check-worker$i.out" --wrap 'hostname -s' </dev/null &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || rc=1; done
    for i in "${STACK_WORKER_IDS[@]}"; do
        f=$DELEGATE_STACK_HOME/.stack-check-worker$i.out
        out=$(stack_exec user cat "$f" 2>/dev/null)
        stack_exec user rm -f "$f"
        echo "worker$i: ${out:-no output}"
        [[ $out == "worker$i" ]] || rc=1
    done
    return $rc
}
# t_on_demand I: worker I is an elastic worker Slurm starts on demand and
# powers down when idle (after DELEGATE_ELASTIC_IDLE, which may fall in
# the middle of `test`); says so. The checks that look into every worker's
# container skip it: its start is checked by the job on each worker.
t_on_demand() {
    elastic_on && ! elastic_always_on "$1" || return 1
    echo "worker$1: started on demand (elastic), its container not looked into"
}
# t_plain_slurm_refused USER: USER (a student) cannot reach a worker through
# plain Slurm (docs/security.md): srun and sbatch --wrap are refused by the
# controller's job gate with its reason.
t_plain_slurm_refused() {
    local u=$1 out
    for cmd in "srun -w worker1 -t 1 hostname" "sbatch -w worker1 --wrap hostname"; do
        # shellcheck disable=SC2086  # the words of cmd, on purpose
        if out=$(stack_exec_as "$u" user timeout 60 $cmd 2>&1 </dev/null); then
            echo "$u: '$cmd' was accepted: $out"; return 1
        fi
        grep -q "only delegate's own jobs may run here" <<<"$out" \
            || { echo "$u: '$cmd' failed without the gate's reason: $out"; return 1; }
    done
    echo "$u: srun and sbatch --wrap refused by the job gate"
}
# t_agents USER: on every worker the root agent runs and answers the probe
# asked by USER (a student) through the unprivileged runner.
t_agents() {
    local u=$1 i w pid rc=0
    for i in "${STACK_WORKER_IDS[@]}"; do
        t_on_demand "$i" && continue
        w=worker$i
        pid=$(stack_exec "$w" pgrep -x -u 0 sandbox-agent | paste -sd, -)
        if [[ -z $pid ]]; then
            echo "$w: no sandbox-agent runs"; rc=1; continue
        fi
        if ! stack_exec_as "$u" "$w" timeout 60 /usr/local/bin/sandbox-runner probe >/dev/null 2>&1; then
            echo "$w: the agent (pid $pid) does not answer $u's probe:"
            stack_exec "$w" tail -n 5 /var/log/delegate/agent.log; rc=1; continue
        fi
        echo "$w: sandbox-agent (root, pid $pid) answers $u's probe"
    done
    return $rc
}
# t_worker_locked USER: on every worker the runner is not setuid/setgid,
# the host's Docker socket sits in a root-only directory, USER is in no
# group owning it and cannot talk to the engine.
t_worker_locked() {
    local u=$1 i w mode dir gid rc=0
    for i in "${STACK_WORKER_IDS[@]}"; do
        t_on_demand "$i" && continue
        w=worker$i
        mode=$(stack_exec "$w" stat -c '%a %U:%G' /usr/local/bin/sandbox-runner)
        [[ $mode == "755 root:root" ]] || { echo "$w: sandbox-runner is $mode (want 755 root:root)"; rc=1; }
        dir=$(stack_exec "$w" stat -c '%a %U' /run/delegate-engine)
        [[ $dir == "700 root" ]] || { echo "$w: /run/delegate-engine is $dir (want 700 root)"; rc=1; }
        gid=$(stack_exec "$w" stat -L -c %g /var/run/docker.sock)
        if stack_exec "$w" id -G "$u" | tr ' ' '\n' | grep -qx "$gid"; then
            echo "$w: $u is in group $gid, which owns the Docker socket"; rc=1
        fi
        if stack_exec_as "$u" "$w" curl -fsS --max-time 10 --unix-socket /var/run/docker.sock \
            http://engine/version >/dev/null 2>&1; then
            echo "$w: $u reached the Docker engine through /var/run/docker.sock"; rc=1
        fi
        ((rc)) || echo "$w: runner $mode, socket only for root (/run/delegate-engine $dir), $u refused"
    done
    return $rc
}
# t_same_sandbox_image: every worker's engine has the policy's sandbox
# image with the same id (digest) as this manager's.
t_same_sandbox_image() {
    local want have i rc=0
    want=$(docker image inspect -f '{{.Id}}' "$DELEGATE_SANDBOX_IMAGE") || { echo "no $DELEGATE_SANDBOX_IMAGE here"; return 1; }
    for i in "${STACK_WORKER_IDS[@]}"; do
        t_on_demand "$i" && continue
        have=$(stack_exec "worker$i" docker image inspect -f '{{.Id}}' "$DELEGATE_SANDBOX_IMAGE" 2>&1)
        if [[ $have != "$want" ]]; then
            echo "worker$i: $DELEGATE_SANDBOX_IMAGE is '${have:0:80}', not ${want:0:19}"; rc=1
        fi
    done
    ((rc)) || echo "$DELEGATE_SANDBOX_IMAGE ${want:0:19} on every worker's engine"
    return $rc
}
# t_home_writable USER: on every worker USER writes a file in their home,
# which the user node sees with USER's uid (the home's server squashes no
# uid, and USER has the same uid everywhere).
t_home_writable() {
    local u=$1 uid i f got rc=0
    uid=$(stack_exec user id -u "$u") || { echo "no account $u on the user node"; return 1; }
    for i in "${STACK_WORKER_IDS[@]}"; do
        t_on_demand "$i" && continue
        f=$DELEGATE_STACK_HOME/$u/.stack-check-home-worker$i
        # shellcheck disable=SC2016  # $1 and $2 are for the worker's shell
        if ! stack_exec_as "$u" "worker$i" sh -c 'echo "$1" >"$2"' sh "worker$i" "$f"; then
            echo "worker$i: $u cannot write $f"; rc=1; continue
        fi
        got=$(stack_exec user stat -c '%u %s' "$f" 2>&1)
        stack_exec_as "$u" user rm -f "$f"
        if [[ $got != "$uid 8" ]]; then
            echo "worker$i: $u's file shows on the user node as '$got' (want uid $uid, 8 bytes): a squashed or remapped uid"; rc=1
        fi
    done
    ((rc)) || echo "$u (uid $uid) writes the home from every worker; the user node sees uid $uid"
    return $rc
}
# t_python USER ARGS...: stack/check_user.py on the user node, as USER, with
# ARGS (basic, excl N, map N: see that file).
t_python() {
    local u=$1; shift
    stack_exec_as "$u" user timeout 600 /opt/delegate/venv/bin/python - "$@" <"$REPO/stack/check_user.py"
}
# t_isolation A B: A cannot list B's job directories, on the user node nor
# on worker1.
t_isolation() {
    local a=$1 b=$2 node
    # b has job directories by now; a can read none of them -- on the user
    # node nor on a worker (the sandbox sees only its own /job anyway).
    stack_exec_as "$b" user test -d "$DELEGATE_STACK_HOME/$b/.delegate/jobs" \
        || { echo "$b has no job directory"; return 1; }
    for node in user worker1; do
        if stack_exec_as "$a" "$node" ls "$DELEGATE_STACK_HOME/$b/.delegate/jobs" >/dev/null 2>&1; then
            echo "$a can list $b's job directories on $node"; return 1
        fi
    done
    echo "$a cannot read $DELEGATE_STACK_HOME/$b/.delegate/jobs (user node, worker1)"
}
# t_hub USER: JupyterHub on the published port serves the stack's
# certificate over HTTPS, and its login page lets USER in with their
# password (initial-passwords) and refuses a wrong one; the test login is
# then removed from the hub (its admin page lists the course, not the test).
t_hub() {
    local u=$1 url="https://127.0.0.1:$DELEGATE_JUPYTER_PORT" pw jar page xsrf out served want
    want=$(openssl x509 -noout -fingerprint -sha256 -in "$STACK_SECRETS/hub-tls.crt" 2>/dev/null)
    served=$(openssl s_client -connect "127.0.0.1:$DELEGATE_JUPYTER_PORT" </dev/null 2>/dev/null \
        | openssl x509 -noout -fingerprint -sha256 2>/dev/null)
    [[ -n $want && $served == "$want" ]] || { echo "the hub serves another certificate than $STACK_SECRETS/hub-tls.crt: '${served:-none}'"; return 1; }
    pw=$(awk -v u="$u" '$1 == u { print $2; exit }' "$STACK_SECRETS/initial-passwords")
    [[ -n $pw ]] || { echo "no initial password of $u in $STACK_SECRETS/initial-passwords"; return 1; }
    jar=$(mktemp -p "$BC_TMP")
    # hub_login PASSWORD: the HTTP code and redirect of the login form's POST.
    hub_login() {
        : >"$jar"
        page=$(curl -ksS --max-time 20 -c "$jar" "$url/hub/login") || return 1
        xsrf=$(sed -n 's/.*name="_xsrf" value="\([^"]*\)".*/\1/p' <<<"$page" | head -n1)
        curl -ksS --max-time 30 -b "$jar" -c "$jar" -o /dev/null -w '%{http_code} %{redirect_url}' \
            --data-urlencode "username=$u" --data-urlencode "password=$1" --data-urlencode "_xsrf=$xsrf" \
            "$url/hub/login"
    }
    out=$(hub_login "$pw")
    if [[ $out != 302* ]] || ! grep -q 'jupyterhub-session-id\|jupyterhub-hub-login' "$jar"; then
        rm -f "$jar"; echo "$u's login: HTTP $out (want 302 and a session cookie)"; return 1
    fi
    out=$(hub_login "not-$pw")
    rm -f "$jar"
    [[ $out != 302* ]] || { echo "a wrong password of $u was accepted: HTTP $out"; return 1; }
    # The test login leaves no user on the hub's admin page (the hub's
    # delegate-check service token, root's only, in the user node).
    # shellcheck disable=SC2016  # $(cat ...) is for the user node's shell
    out=$(stack_exec user sh -c 'curl -ksS --max-time 20 -o /dev/null -w "%{http_code}" -X DELETE \
        -H "Authorization: token $(cat /var/lib/jupyterhub/check-api-token)" "https://127.0.0.1:8888/hub/api/users/$1"' \
        sh "$u" 2>&1)
    [[ $out == 204 ]] || { echo "the test login $u could not be removed from the hub: HTTP $out"; return 1; }
    echo "JupyterHub on $(hub_url) (the stack's certificate) lets $u in, refuses a wrong password"
}

# --- the action
# stack_test: `test`, every check above against the deployed stack; dies
# (exit 1) when any failed.
stack_test() {
    need_root test
    stack_load_config
    [[ -n $(docker stack services -q "$STACK" 2>/dev/null) ]] || die "stack $STACK is not deployed (./build_cluster.sh deploy)"
    stack_deployed_workers
    stack_secrets
    local t1 t2 u
    read -r t1 t2 _ <<<"$(for u in $DELEGATE_STACK_TEST_USERS; do printf '%s ' "${u%%:*}"; done)"
    [[ -n $t1 && -n $t2 ]] || die "DELEGATE_STACK_TEST_USERS must name two accounts"
    log "test: stack $STACK, $DELEGATE_STACK_WORKERS workers, test accounts $t1 $t2"
    stack_wait >/dev/null
    check "sinfo: every worker idle" t_sinfo_idle
    check "a trivial job on each worker (root, sbatch -w)" t_job_on_each_worker
    check "$t1 cannot run plain Slurm jobs (srun, sbatch --wrap)" t_plain_slurm_refused "$t1"
    check "the root agent runs and answers on every worker" t_agents "$t1"
    check "$t1 cannot reach the Docker socket on any worker; the runner is not setgid" t_worker_locked "$t1"
    check "the same sandbox image on every worker" t_same_sandbox_image
    check "$t1 writes the home from every worker, same uid everywhere" t_home_writable "$t1"
    check "$t1: Python function via delegate, own uid, perf counter" t_python "$t1" basic
    check "$t2: Python function via delegate, own uid, perf counter" t_python "$t2" basic
    check "$t1 cannot read $t2's job directories" t_isolation "$t1" "$t2"
    check "$t2 cannot read $t1's job directories" t_isolation "$t2" "$t1"
    # Elastic workers: Slurm may run everything on the always-on ones rather
    # than power another up; what must hold is that no two share a node.
    local spread=$DELEGATE_STACK_WORKERS atleast=""
    if elastic_on; then
        spread=$((DELEGATE_ELASTIC_MIN > 0 ? DELEGATE_ELASTIC_MIN : 1))
        atleast=at-least
    fi
    check "exclusive nodes: $((2 * DELEGATE_STACK_WORKERS)) jobs of 5 s at once" \
        t_python "$t1" excl "$DELEGATE_STACK_WORKERS" $atleast
    check "a map's allocations pull its calls on every worker" t_python "$t1" map "$spread" $atleast
    check "JupyterHub: $t1 logs in over HTTPS" t_hub "$t1"
    if ((STACK_TEST_FAILED)); then
        die "test: some checks failed (see above; ./build_cluster.sh status, docker service logs ${STACK}_<service>)"
    fi
    log "test: all checks passed in $((SECONDS - T0)) s"
}
