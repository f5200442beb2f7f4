#!/usr/bin/env bash
# Brings up, idempotently, the real engines of a development machine (Debian):
#   - for people: a Docker engine on its own socket and data root, and the podman API
#     service (podman's default store), which a daemon started from the README uses;
#     no test touches them (issue 36: a README daemon's card jobs and engine lock failed
#     a concurrent suite's tests),
#   - for the tests: a Docker engine and a podman service of the suite's own (their own
#     data root, store, locks and socket), where the engine tests and their daemons run,
#   - a second Docker engine that only the test suite uses, for the tests that act on
#     every container of the node (reap); a test that restarts or freezes an engine
#     starts one of its own (tests/support/throwaway.py, ThrowawayDocker),
#   - a third Docker engine whose data root is a small tmpfs, which a test fills up,
#   - a fourth Docker engine and a second podman service, each with its data root on a
#     small tmpfs of its own, for the image GC's tests (which remove any image there),
#   - the podman API service,
#   - a registry on 127.0.0.1:5000 holding the test images,
#   - a second registry on 127.0.0.1:5005 that requires a password (htpasswd), holding a
#     private test image; its "user:password" is in $DEV_ROOT/private-registry.auth.
# Run as root. Re-running it is cheap: what already answers is left alone.
# `engines.sh down` stops what it started (data is kept under $DEV_ROOT).
set -euo pipefail

DEV_ROOT=${TUNEPLANE_DEV_ROOT:-/var/lib/tuneplane-dev}
RUN_DIR=/run/tuneplane-dev
LOG_DIR=$DEV_ROOT/log
DOCKER_SOCK=$RUN_DIR/docker.sock
OWN_SOCK=$RUN_DIR/docker-own.sock
TESTS_SOCK=$RUN_DIR/docker-tests.sock
TESTS_PODMAN_ROOT=$DEV_ROOT/podman-tests
TESTS_PODMAN_SOCK=$RUN_DIR/podman-tests.sock
FULL_ROOT=$DEV_ROOT/docker-full
FULL_ROOT_SIZE=64m
PODMAN_SOCK=/run/podman/podman.sock
GC_DOCKER_ROOT=$DEV_ROOT/docker-gc
GC_PODMAN_ROOT=$DEV_ROOT/podman-gc
GC_PODMAN_SOCK=$RUN_DIR/podman-gc.sock
GC_ROOT_SIZE=192m
REGISTRY=127.0.0.1:5000
IMAGE=tuneplane-test/busybox:1
BIG_IMAGE=tuneplane-test/big:1
# 5005: inside the 5000-5009 range podman is told is insecure (configure_podman).
PRIVATE_REGISTRY=127.0.0.1:5005
PRIVATE_IMAGE=tuneplane-test/trainer:1
PRIVATE_USER=tuneplane-test
PRIVATE_AUTH=$DEV_ROOT/private-registry.auth # "user:password", read by the tests
export DOCKER_HOST=unix://$DOCKER_SOCK

log() { printf 'engines: %s\n' "$*" >&2; }

wait_for() { # wait_for SECONDS DESCRIPTION CMD...: poll until CMD succeeds
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "$what did not come up; see $LOG_DIR"
            return 1
        fi
        sleep 0.5
    done
}

install_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v podman >/dev/null || missing+=(podman)
    command -v docker-registry >/dev/null || missing+=(docker-registry)
    [[ -x /bin/busybox ]] || missing+=(busybox-static)
    command -v catatonit >/dev/null || missing+=(catatonit) # podman's init for every job
    command -v curl >/dev/null || missing+=(curl)
    command -v htpasswd >/dev/null || missing+=(apache2-utils) # the private registry's user
    command -v openssl >/dev/null || missing+=(openssl)
    command -v systemd-analyze >/dev/null || missing+=(systemd)     # verifies the unit
    command -v debootstrap >/dev/null || missing+=(debootstrap)     # the image test's base
    command -v promtool >/dev/null || missing+=(prometheus) # checks the /metrics exposition
    command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs) # a job's scratch space (ext4)
    command -v runsc >/dev/null || missing+=(runsc) # gVisor: sandboxed jobs (issue 37)
    command -v dbus-daemon >/dev/null || missing+=(dbus-daemon) # a fake logind's bus
    # The hostile-job tests build static binaries (a setuid one, a port binder) with gcc.
    command -v gcc >/dev/null || missing+=(gcc)
    dpkg -s libc6-dev >/dev/null 2>&1 || missing+=(libc6-dev)
    ((${#missing[@]} == 0)) && return
    log "installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}" uidmap
}

start_docker() { # start_docker NAME [no-live-restore]: the engine $RUN_DIR/NAME.sock, data in $DEV_ROOT/NAME
    local name=$1 sock=$RUN_DIR/$1.sock live_restore=--live-restore
    [[ ${2:-} == no-live-restore ]] && live_restore=
    if docker -H "unix://$sock" version >/dev/null 2>&1; then return; fi
    # Twice: one CI run saw a dockerd that never answered where every run before it had
    # (its log not kept); the first try's log tail says why, the second usually starts.
    local try
    for try in 1 2; do
        log "starting dockerd on $sock"
        # The sandboxes this runs in allow no iptables and no bridge; jobs use the host
        # network anyway. --live-restore keeps jobs running across an engine restart.
        # Each engine starts its own containerd under its exec root.
        setsid dockerd --iptables=false --ip6tables=false --bridge=none $live_restore \
            --data-root "$DEV_ROOT/$name" --exec-root "$RUN_DIR/$name-exec" \
            --pidfile "$RUN_DIR/$name.pid" -H "unix://$sock" \
            >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
        local pid=$!
        if wait_for 90 "dockerd $name" docker -H "unix://$sock" version; then return; fi
        log "dockerd $name, the end of its log:"
        tail -n 25 "$LOG_DIR/$name.log" >&2 || true
        stop_pid "$pid"
    done
    return 1
}

stop_pid() { # stop_pid PID: TERM, then KILL after 20 s; waits until it is gone
    kill "$1" 2>/dev/null || return 0
    local deadline=$((SECONDS + 20))
    while kill -0 "$1" 2>/dev/null; do
        ((SECONDS < deadline)) || kill -9 "$1" 2>/dev/null || true
        sleep 0.5
    done
}

write_subids() { # podman's userns=auto takes each job's ids from the containers ranges
    local file
    for file in /etc/subuid /etc/subgid; do
        grep -q '^containers:' "$file" 2>/dev/null || echo "containers:2147483647:2147483648" >>"$file"
    done
}

register_runsc() { # runsc in every docker engine's runtimes, read from /etc/docker/daemon.json
    # gVisor's own network stack refuses the engine's namespaces (even --network none):
    # --network=host is its host networking inside whatever namespace the container has;
    # ptrace, as this machine has no KVM for it (--platform=kvm hangs).
    mkdir -p /etc/docker
    if [[ -f /etc/docker/daemon.json ]]; then
        grep -q '"runsc"' /etc/docker/daemon.json || log "add runsc to the runtimes of /etc/docker/daemon.json by hand"
        return
    fi
    echo '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host", "--platform=ptrace"]}}}' \
        >/etc/docker/daemon.json
}

reload_docker() { # reload_docker NAME: a running engine reads its runtimes again (SIGHUP, no restart)
    local pid=$RUN_DIR/$1.pid
    [[ -f $pid ]] || return 0
    docker -H "unix://$RUN_DIR/$1.sock" info --format '{{json .Runtimes}}' 2>/dev/null | grep -q runsc && return
    kill -HUP "$(cat "$pid")" || true
}

configure_podman() {
    write_subids
    mkdir -p /etc/containers/registries.conf.d
    # podman's default rlimits exceed this sandbox's hard limits: stay under them.
    local nofile nproc
    nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
    [[ $nofile == unlimited || $nofile -gt 20000 ]] && nofile=20000
    [[ $nproc == unlimited || $nproc -gt 1000 ]] && nproc=1000
    cat >/etc/containers/containers.conf <<EOF
# written by tuneplane-node contrib/dev/engines.sh
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
# crun refuses this kernel's hybrid cgroup layout; runc (docker.io's) runs.
runtime = "runc"
EOF
    # The local registry and the tests' throttling proxies speak plain HTTP.
    {
        echo "# written by tuneplane-node contrib/dev/engines.sh"
        for port in $(seq 5000 5009); do
            printf '[[registry]]\nlocation = "127.0.0.1:%s"\ninsecure = true\n\n' "$port"
        done
    } >/etc/containers/registries.conf.d/50-tuneplane-dev.conf
}

start_podman() {
    configure_podman
    if curl -sf --unix-socket "$PODMAN_SOCK" http://d/_ping >/dev/null 2>&1; then return; fi
    log "starting the podman API service on $PODMAN_SOCK"
    mkdir -p "$(dirname "$PODMAN_SOCK")"
    rm -f "$PODMAN_SOCK"
    setsid podman system service --time=0 "unix://$PODMAN_SOCK" \
        >>"$LOG_DIR/podman.log" 2>&1 </dev/null &
    wait_for 60 podman curl -sf --unix-socket "$PODMAN_SOCK" http://d/_ping
}

start_registry() {
    if curl -sf "http://$REGISTRY/v2/" >/dev/null 2>&1; then return; fi
    log "starting the registry on $REGISTRY"
    cat >"$DEV_ROOT/registry.yml" <<EOF
version: 0.1
storage:
  filesystem:
    rootdirectory: $DEV_ROOT/registry
  delete:
    enabled: true
http:
  addr: $REGISTRY
EOF
    setsid docker-registry serve "$DEV_ROOT/registry.yml" \
        >>"$LOG_DIR/registry.log" 2>&1 </dev/null &
    wait_for 30 registry curl -sf "http://$REGISTRY/v2/"
}

private_registry_answers() { # 401 to a request without the password: it is up
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://$PRIVATE_REGISTRY/v2/") == 401 ]]
}

start_private_registry() {
    if [[ ! -s $PRIVATE_AUTH ]]; then
        printf '%s:%s\n' "$PRIVATE_USER" "$(openssl rand -hex 12)" >"$PRIVATE_AUTH"
        chmod 0644 "$PRIVATE_AUTH" # a test password: the suite may run as another user
    fi
    if private_registry_answers; then return; fi
    log "starting the password-protected registry on $PRIVATE_REGISTRY"
    local user password
    IFS=: read -r user password <"$PRIVATE_AUTH"
    htpasswd -Bbn "$user" "$password" >"$DEV_ROOT/private-registry.htpasswd"
    cat >"$DEV_ROOT/private-registry.yml" <<EOF
version: 0.1
storage:
  filesystem:
    rootdirectory: $DEV_ROOT/private-registry
  delete:
    enabled: true
http:
  addr: $PRIVATE_REGISTRY
auth:
  htpasswd:
    realm: tuneplane-dev
    path: $DEV_ROOT/private-registry.htpasswd
EOF
    setsid docker-registry serve "$DEV_ROOT/private-registry.yml" \
        >>"$LOG_DIR/private-registry.log" 2>&1 </dev/null &
    wait_for 30 "private registry" private_registry_answers
}

push_private_image() { # the busybox test image and a layer of its own (an image id of its own)
    local user password ref=$PRIVATE_REGISTRY/$PRIVATE_IMAGE config
    IFS=: read -r user password <"$PRIVATE_AUTH"
    if curl -sf -u "$user:$password" -o /dev/null \
        -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
        "http://$PRIVATE_REGISTRY/v2/${PRIVATE_IMAGE%:*}/manifests/${PRIVATE_IMAGE##*:}"; then
        return
    fi
    log "pushing $ref"
    # A config of its own: nothing is written to the engine's or root's credential store.
    config=$(mktemp -d)
    printf '{"auths": {"%s": {"auth": "%s"}}}\n' "$PRIVATE_REGISTRY" \
        "$(printf '%s:%s' "$user" "$password" | base64 -w0)" >"$config/config.json"
    printf 'FROM %s\nCOPY private /private\n' "$IMAGE" >"$config/Dockerfile"
    echo "a private test image" >"$config/private"
    docker build -q -t "$ref" "$config" >/dev/null
    docker --config "$config" push -q "$ref" >/dev/null
    docker rmi "$ref" >/dev/null # in the registry only: a launch must pull it
    rm -rf "$config"
}

build_rootfs() { # build_rootfs DIR: a busybox-static root filesystem
    local dir=$1
    mkdir -p "$dir/bin" "$dir/tmp" "$dir/etc" "$dir/work"
    cp /bin/busybox "$dir/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [[ -e $dir/bin/$applet ]] || ln -s busybox "$dir/bin/$applet"
    done
    echo 'root:x:0:0:root:/root:/bin/sh' >"$dir/etc/passwd"
    echo 'nobody:x:65534:65534:nobody:/:/bin/sh' >>"$dir/etc/passwd"
    echo 'root:x:0:' >"$dir/etc/group"
}

build_images() {
    if docker image inspect "$IMAGE" >/dev/null 2>&1 &&
        curl -sf "http://$REGISTRY/v2/${BIG_IMAGE%:*}/manifests/${BIG_IMAGE##*:}" -o /dev/null -H \
            'Accept: application/vnd.docker.distribution.manifest.v2+json' &&
        podman image exists "docker.io/$IMAGE"; then
        return
    fi
    log "building $IMAGE and $BIG_IMAGE from busybox-static"
    local work
    work=$(mktemp -d)
    build_rootfs "$work/rootfs"
    tar -C "$work/rootfs" -cf "$work/busybox.tar" .
    # The ENTRYPOINT is deliberately wrong for jobs: the runtime must replace it.
    local changes=(--change 'ENTRYPOINT ["/bin/echo", "image-entrypoint-was-not-replaced"]'
        --change 'CMD []' --change 'WORKDIR /')
    docker import "${changes[@]}" "$work/busybox.tar" "$IMAGE" >/dev/null
    # The big image adds incompressible bytes, so a throttled pull takes a while.
    head -c $((8 * 1024 * 1024)) /dev/urandom >"$work/rootfs/ballast"
    tar -C "$work/rootfs" -cf "$work/big.tar" .
    docker import "${changes[@]}" "$work/big.tar" "$BIG_IMAGE" >/dev/null
    for image in "$IMAGE" "$BIG_IMAGE"; do
        docker tag "$image" "$REGISTRY/$image"
        docker push -q "$REGISTRY/$image" >/dev/null
    done
    # The big image lives in the registry only: pulling it must really download.
    docker rmi "$BIG_IMAGE" "$REGISTRY/$BIG_IMAGE" >/dev/null
    # Fully qualified: the node hands podman canonical names only (docker.io/ for a
    # name without a registry), never a short name it would match against localhost/.
    podman import --change 'ENTRYPOINT ["/bin/echo", "image-entrypoint-was-not-replaced"]' \
        "$work/busybox.tar" "docker.io/$IMAGE" >/dev/null
    rm -rf "$work"
}

start_full_docker() { # an engine on a disk of its own, small enough to fill in a test
    mkdir -p "$FULL_ROOT"
    mountpoint -q "$FULL_ROOT" || mount -t tmpfs -o "size=$FULL_ROOT_SIZE,mode=0711" tuneplane-full "$FULL_ROOT"
    start_docker docker-full
}

tmpfs_at() { # tmpfs_at DIR NAME: a tmpfs of GC_ROOT_SIZE mounted there (once)
    mkdir -p "$1"
    mountpoint -q "$1" || mount -t tmpfs -o "size=$GC_ROOT_SIZE,mode=0711" "$2" "$1"
}

start_gc_docker() { # the image GC tests' docker: images on a tmpfs nobody else uses
    tmpfs_at "$GC_DOCKER_ROOT" tuneplane-docker-gc
    start_docker docker-gc
}

start_gc_podman() { # the image GC tests' podman: its own store, database, locks and socket
    tmpfs_at "$GC_PODMAN_ROOT" tuneplane-podman-gc
    start_own_podman podman-gc "$GC_PODMAN_ROOT" "$GC_PODMAN_SOCK"
}

start_own_podman() { # start_own_podman NAME ROOT SOCK: a podman service on a store of its own
    local name=$1 root=$2 sock=$3
    if curl -sf --unix-socket "$sock" http://d/_ping >/dev/null 2>&1; then return; fi
    log "starting a podman API service of its own on $sock"
    mkdir -p "$root" "$RUN_DIR/$name-run"
    # File locks, and its own static and tmp dirs: the shared service's shm locks and
    # database are not this one's.
    sed "s|^\[engine\]|[engine]\nlock_type = \"file\"\nstatic_dir = \"$root/libpod\"\ntmp_dir = \"$RUN_DIR/$name-run/libpod\"|" \
        /etc/containers/containers.conf >"$DEV_ROOT/$name-containers.conf"
    rm -f "$sock"
    CONTAINERS_CONF=$DEV_ROOT/$name-containers.conf setsid podman \
        --root "$root/storage" --runroot "$RUN_DIR/$name-run/storage" \
        system service --time=0 "unix://$sock" \
        >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
    wait_for 60 "$name" curl -sf --unix-socket "$sock" http://d/_ping
}

tests_podman() { # podman on the tests' own store (its CLI, as the service sees it)
    CONTAINERS_CONF=$DEV_ROOT/podman-tests-containers.conf podman \
        --root "$TESTS_PODMAN_ROOT/storage" --runroot "$RUN_DIR/podman-tests-run/storage" "$@"
}

copy_image_to_tests_podman() {
    if tests_podman image exists "docker.io/$IMAGE"; then return; fi
    log "copying docker.io/$IMAGE to the tests' own podman store"
    podman save "docker.io/$IMAGE" | tests_podman load -q >/dev/null
}

copy_image_to_own_engine() { # copy_image_to_own_engine SOCK: the test image there
    if docker -H "unix://$1" image inspect "$IMAGE" >/dev/null 2>&1; then return; fi
    log "copying $IMAGE to the tests' engine on $1"
    docker save "$IMAGE" | docker -H "unix://$1" load -q >/dev/null
}

up() {
    [[ $(id -u) == 0 ]] || { log "run me as root"; exit 1; }
    # The engines outlive this call: from /, so none keeps a checkout as its working
    # directory (podman's conmon fails on every job once that directory is deleted).
    cd /
    mkdir -p "$DEV_ROOT" "$RUN_DIR" "$LOG_DIR"
    install_packages
    register_runsc
    start_registry
    start_docker docker
    start_docker docker-own
    start_docker docker-tests
    start_full_docker
    start_gc_docker
    for name in docker docker-own docker-tests docker-full docker-gc; do reload_docker "$name"; done
    start_podman
    start_gc_podman
    start_own_podman podman-tests "$TESTS_PODMAN_ROOT" "$TESTS_PODMAN_SOCK"
    build_images
    start_private_registry
    push_private_image
    copy_image_to_own_engine "$OWN_SOCK"
    copy_image_to_own_engine "$TESTS_SOCK"
    copy_image_to_tests_podman
    cat <<EOF
For people (a daemon from the README; no test touches these):
docker:   TUNEPLANE_DOCKER_HOST=unix://$DOCKER_SOCK
podman:   TUNEPLANE_PODMAN_URL=unix://$PODMAN_SOCK
For the tests only (never point a daemon of yours at these):
docker:   unix://$TESTS_SOCK (the engine tests and their daemons)
podman:   unix://$TESTS_PODMAN_SOCK (the engine tests and their daemons; store $TESTS_PODMAN_ROOT)
own:      unix://$OWN_SOCK (the tests that reap every job of the node)
full:     unix://$RUN_DIR/docker-full.sock (data root: a $FULL_ROOT_SIZE tmpfs at $FULL_ROOT)
gc:       unix://$RUN_DIR/docker-gc.sock, unix://$GC_PODMAN_SOCK (image GC tests; $GC_ROOT_SIZE tmpfs each)
Shared by both:
registry: http://$REGISTRY (images: $REGISTRY/$IMAGE, $REGISTRY/$BIG_IMAGE)
private:  http://$PRIVATE_REGISTRY (image: $PRIVATE_REGISTRY/$PRIVATE_IMAGE; user:password in $PRIVATE_AUTH)
logs:     $LOG_DIR
EOF
}

down() {
    for name in docker docker-own docker-tests docker-full docker-gc; do
        [[ -f $RUN_DIR/$name.pid ]] && kill "$(cat "$RUN_DIR/$name.pid")" 2>/dev/null || true
    done
    pkill -f "podman system service --time=0 unix://$PODMAN_SOCK" || true
    pkill -f "system service --time=0 unix://$GC_PODMAN_SOCK" || true
    pkill -f "system service --time=0 unix://$TESTS_PODMAN_SOCK" || true
    pkill -f "docker-registry serve $DEV_ROOT/registry.yml" || true
    pkill -f "docker-registry serve $DEV_ROOT/private-registry.yml" || true
}

gc_engines() { # only the image GC tests' engines (the others left as they are)
    cd / # as up's: no engine keeps a checkout as its working directory
    mkdir -p "$DEV_ROOT" "$RUN_DIR" "$LOG_DIR"
    start_gc_docker
    start_gc_podman
}

case ${1:-up} in
up) up ;;
gc-engines) gc_engines ;;
down) down ;;
*) echo "usage: $0 [up|down|gc-engines]" >&2; exit 2 ;;
esac
