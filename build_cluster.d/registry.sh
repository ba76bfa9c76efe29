# shellcheck shell=bash
# build_cluster.d/registry.sh -- the course's image registry, for worker
# machines (docs/instructors.md, "On real machines"): on a deploy with
# placement, Debian's docker-registry runs on this manager as the container
# delegate-registry (port DELEGATE_REGISTRY_PORT, default 5000, of the
# manager's swarm address), the cluster and sandbox images are pushed to it,
# the worker services run the cluster image by digest and each worker has
# its machine's engine pull the sandbox image (docker/cluster-entrypoint.sh).
# A container rather than a swarm service: it must answer before the stack
# is deployed, and it needs no routing mesh.
#
# TLS with the course's own CA (generated once; `machine add` installs it on
# each machine as /etc/docker/certs.d/ADDRESS/ca.crt, which an engine reads
# at each pull: no daemon.json, no restart), and a password (htpasswd): a
# student who reaches the port can neither pull nor push. The manager pushes
# and deploys with the client configuration under
# STACK_SECRETS/registry/client, which the workers get as a swarm secret
# (`docker stack deploy --with-registry-auth`, and registry_auth for the
# sandbox image's pull); root's own ~/.docker is not touched.
#
# Sourced by build_cluster.sh after common.sh and stack.sh.

REGISTRY_PORT=${DELEGATE_REGISTRY_PORT:-5000}
REGISTRY_IMAGE=delegate-registry:latest
REGISTRY_CONTAINER=delegate-registry
REGISTRY_VOLUME=delegate-registry
# What registry_publish found: the stack file's registry facts, and the
# docker options of the stack's deploy (the client configuration, and
# --with-registry-auth so the machines' engines may pull).
REGISTRY_FACTS=()
REGISTRY_CLIENT=()
REGISTRY_DEPLOY=()

registry_dir() { echo "$STACK_SECRETS/registry"; }

# registry_address: the manager's swarm address and the registry's port,
# as the machines reach it.
registry_address() {
    local addr
    addr=$(docker info -f '{{.Swarm.NodeAddr}}')
    [[ -n $addr ]] || die "registry: this engine has no swarm address"
    echo "$addr:$REGISTRY_PORT"
}

# registry_ca: the course's CA certificate (made once); prints its path.
registry_ca() {
    local d
    d=$(registry_dir)
    install -d -m 0700 "$d"
    if [[ ! -s $d/ca.crt || ! -s $d/ca.key ]]; then
        log "registry: making the course's certificate authority ($d/ca.crt)" >&2
        openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=delegate course registry CA" \
            -keyout "$d/ca.key" -out "$d/ca.crt" >/dev/null 2>&1 || die "registry: cannot make the CA"
    fi
    echo "$d/ca.crt"
}

# registry_server_cert ADDRESS: the registry's certificate for ADDRESS's
# host (made again when the address changes).
registry_server_cert() {
    local d host=${1%:*}
    d=$(registry_dir)
    registry_ca >/dev/null
    if [[ -s $d/server.crt ]] && openssl x509 -noout -checkip "$host" -in "$d/server.crt" 2>/dev/null | grep -q 'does match'; then
        return 0
    fi
    log "registry: certificate for $host"
    openssl req -newkey rsa:3072 -nodes -subj "/CN=$host" -keyout "$d/server.key" -out "$BC_TMP/registry.csr" \
        >/dev/null 2>&1 || die "registry: cannot make its key"
    printf 'subjectAltName=IP:%s\n' "$host" >"$BC_TMP/registry.ext"
    openssl x509 -req -in "$BC_TMP/registry.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
        -days 3650 -extfile "$BC_TMP/registry.ext" -out "$d/server.crt" >/dev/null 2>&1 \
        || die "registry: cannot sign its certificate"
}

# registry_credentials ADDRESS: the password (made once), its htpasswd
# line, and the client configuration for ADDRESS.
registry_credentials() {
    local d pw
    d=$(registry_dir)
    if [[ ! -s $d/password ]]; then
        (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$d/password")
    fi
    pw=$(<"$d/password")
    if [[ ! -s $d/htpasswd ]]; then
        docker run --rm --network none --entrypoint htpasswd "$REGISTRY_IMAGE" -Bbn delegate "$pw" \
            | grep . >"$d/htpasswd" || die "registry: cannot write its htpasswd file"
    fi
    install -d -m 0700 "$d/client"
    (umask 077; printf '{"auths": {"%s": {"auth": "%s"}}}\n' "$1" "$(printf 'delegate:%s' "$pw" | base64 -w0)" \
        >"$d/client/config.json")
}

# registry_trust ADDRESS: this engine trusts the course's CA for ADDRESS.
registry_trust() {
    install -d -m 0755 "/etc/docker/certs.d/$1"
    install -m 0644 "$(registry_ca)" "/etc/docker/certs.d/$1/ca.crt"
}

registry_image() {
    local src
    src=$(sha256sum <"$REPO/docker/registry.Dockerfile" | cut -c1-16)
    image_is_current "$REGISTRY_IMAGE" "$src" && return 0
    log "image $REGISTRY_IMAGE: building (Debian's docker-registry)"
    docker build -q --build-arg "BASE_IMAGE=$DELEGATE_BASE_IMAGE" --label "org.delegate.source=$src" \
        -t "$REGISTRY_IMAGE" -f "$REPO/docker/registry.Dockerfile" "$REPO/docker" >/dev/null \
        || die "docker build of $REGISTRY_IMAGE failed"
}

# registry_serving_files: the certificate, key and htpasswd file the
# registry reads, owned by its own user (docker-registry in its image) in
# STACK_SECRETS/registry/serve (under a root-only directory here).
registry_serving_files() {
    local d uid f
    d=$(registry_dir)
    uid=$(docker run --rm --network none --entrypoint id "$REGISTRY_IMAGE" -u docker-registry) \
        || die "registry: no user docker-registry in $REGISTRY_IMAGE"
    install -d -m 0700 -o "$uid" "$d/serve"
    for f in server.crt server.key htpasswd; do
        install -m 0400 -o "$uid" "$d/$f" "$d/serve/$f"
    done
}

# registry_up: the registry container answers on ADDRESS with this
# certificate (started again when its image or certificate changed).
registry_up() {
    local addr d want have
    addr=$(registry_address)
    d=$(registry_dir)
    registry_image
    registry_server_cert "$addr"
    registry_credentials "$addr"
    registry_trust "$addr"
    want="$(docker image inspect -f '{{.Id}}' "$REGISTRY_IMAGE") $(sha256sum <"$d/server.crt" | cut -c1-16)"
    have=$(docker inspect -f '{{.Image}} {{index .Config.Labels "org.delegate.cert"}} {{.State.Running}}' \
        "$REGISTRY_CONTAINER" 2>/dev/null || true)
    if [[ $have != "$want true" ]]; then
        docker rm -f "$REGISTRY_CONTAINER" >/dev/null 2>&1 || true
        registry_serving_files
        log "registry: starting $REGISTRY_CONTAINER on $addr"
        docker run -d --name "$REGISTRY_CONTAINER" --restart always \
            --label "org.delegate.cert=${want#* }" --cap-drop ALL --security-opt no-new-privileges \
            --read-only -p "$addr:5000" -v "$REGISTRY_VOLUME:/var/lib/docker-registry" \
            --user docker-registry -v "$d/serve:/etc/delegate-registry:ro" \
            "$REGISTRY_IMAGE" >/dev/null || die "registry: cannot start $REGISTRY_CONTAINER"
    fi
    wait_for 30 "registry on $addr" curl -fsS --cacert "$d/ca.crt" -u "delegate:$(<"$d/password")" \
        "https://$addr/v2/" || die "registry: https://$addr/v2/ does not answer: $(docker logs --tail 5 "$REGISTRY_CONTAINER" 2>&1)"
}

# registry_push IMAGE NAME: push IMAGE as ADDRESS/delegate/NAME; prints its
# reference by digest.
registry_push() {
    local addr ref out
    addr=$(registry_address)
    ref=$addr/delegate/$2:latest
    docker tag "$1" "$ref" || die "cannot tag $1 as $ref"
    out=$(docker --config "$(registry_dir)/client" push "$ref" 2>&1) || die "registry: push of $1 failed: $(tail -n 3 <<<"$out")"
    docker image inspect -f '{{range .RepoDigests}}{{println .}}{{end}}' "$ref" | grep -m1 "^$addr/delegate/$2@sha256:" \
        || die "registry: no digest of $ref after its push"
}

# registry_publish: with placement, the registry up and the worker images
# in it; REGISTRY_FACTS for the stack file. Without placement: nothing
# (every service runs on this engine's own images).
registry_publish() {
    REGISTRY_FACTS=() REGISTRY_CLIENT=() REGISTRY_DEPLOY=()
    [[ $DELEGATE_STACK_PLACEMENT == 1 ]] || return 0
    registry_up
    local worker sandbox
    worker=$(registry_push "$DELEGATE_CLUSTER_IMAGE" cluster)
    sandbox=$(registry_push "$DELEGATE_SANDBOX_IMAGE" sandbox)
    log "registry: workers run ${worker##*/} and pull ${sandbox##*/}"
    # shellcheck disable=SC2034  # read by stack_generate and stack_deploy (stack.sh)
    REGISTRY_FACTS=(--worker-image "$worker" --sandbox-pull "$sandbox"
        --registry-version "$(sha256sum <"$(registry_dir)/client/config.json" | cut -c1-10)")
    # shellcheck disable=SC2034  # read by stack_deploy (stack.sh)
    REGISTRY_CLIENT=(--config "$(registry_dir)/client")
    # shellcheck disable=SC2034  # read by stack_deploy (stack.sh)
    REGISTRY_DEPLOY=(--with-registry-auth)
}

# registry_down: the registry container and its storage removed (`down`
# with placement; the CA and password stay with the other secrets).
registry_down() {
    docker rm -f "$REGISTRY_CONTAINER" >/dev/null 2>&1 || return 0
    docker volume rm "$REGISTRY_VOLUME" >/dev/null 2>&1 || true
    log "registry: removed"
}
