#!/usr/bin/env bash
# A real, single-machine Kubernetes cluster (v1.20.2 built by scripts/k8s_build.sh; Debian's
# etcd-server, containerd and runc) for the portal's Kubernetes connector tests: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and one real kubelet that runs real
# containers through its own containerd, with fake GPUs (nvidia.com/gpu) from a small device
# plugin (tests/kubernetes/fakegpu). Everything it owns lives under $K8S_DIR (its containerd
# has its own root, state and socket; the kubelet its own --root-dir), so it never touches
# /etc/kubernetes, /var/lib/kubelet or a system-wide containerd, and several clusters can
# coexist as long as their K8S_DIR and K8S_PORT_BASE differ.
#
#   bash scripts/k8s_up.sh start           # bring the cluster up; last stdout line: export KUBECONFIG=...
#       If a cluster with the same settings is already up (every daemon alive, the apiserver
#       ready, the node Ready with K8S_GPUS allocatable GPUs), it is reused as it is (<1 s).
#       Otherwise whatever is there is stopped and a fresh cluster starts (15-30 s on 2 cores,
#       once the binaries are built): new certificates, empty etcd, empty containerd (the two
#       images imported again), the default service account's token ready (pods can be made).
#   bash scripts/k8s_up.sh stop            # kill every process of this K8S_DIR, containers included,
#                                          # and unmount whatever they mounted
#   bash scripts/k8s_up.sh status          # daemons and nodes (exit 1 when the apiserver does not answer)
#   bash scripts/k8s_up.sh stop-apiserver  # stop only kube-apiserver; everything else keeps running
#   bash scripts/k8s_up.sh start-apiserver # start it again, wait until it is ready
#   bash scripts/k8s_up.sh stop-kubelet    # stop only the kubelet and its device plugin: containers keep
#                                          # running, the node goes NotReady (Ready=Unknown, taint
#                                          # node.kubernetes.io/unreachable) ~K8S_NODE_GRACE s later
#   bash scripts/k8s_up.sh start-kubelet   # start both again, wait until the node is Ready, untainted,
#                                          # with its GPUs (~8 s)
#
# Settings, from the environment (`start` only: the other commands need only K8S_DIR and use
# the settings the cluster was started with, saved in $K8S_DIR/settings):
#   K8S_DIR          /tmp/gpu-portal-k8s  certificates, kubeconfigs, etcd data, containerd and
#                                         kubelet state, pod logs, daemon logs (logs/), pid files
#   K8S_PORT_BASE    16443                kube-apiserver (HTTPS on 127.0.0.1); BASE+1 etcd clients,
#                                         +2 etcd peers, +3 controller-manager, +4 scheduler,
#                                         +5 kubelet, +6 kubelet healthz (all on 127.0.0.1)
#   K8S_NODE         kube1                the node's name
#   K8S_GPUS         8                    fake GPUs the node offers (resource nvidia.com/gpu);
#                                         0: no device plugin
#   K8S_GPU_PRODUCT  NVIDIA-H100-80GB-HBM3  node label nvidia.com/gpu.product (empty: no label)
#   K8S_KUBELET      1                    0: control plane only (no containerd, kubelet, plugin, node)
#   K8S_JOB_IMAGE    localhost/gpu-portal/busybox:test  image for test pods: busybox-static at
#                                         /bin/busybox with the applet links (sh, sleep, env, ...)
#   K8S_PAUSE_IMAGE  localhost/gpu-portal/pause:test    the pod sandbox image (same busybox layer,
#                                         a shell that waits for TERM); containerd's sandbox_image
#   K8S_NODE_GRACE   10                   controller-manager --node-monitor-grace-period, seconds
#   K8S_KUBELET_CLEANUP_PERIOD 2s         the kubelet's container GC and status resync periods
#                                         (stock: 1m and 10s; see k8s_build.sh): how soon a deleted
#                                         pod's object goes once its containers have exited
#   K8S_START_TIMEOUT 120                 seconds for the node to be Ready
#   K8S_CACHE        (k8s_build.sh's)     where the binaries are built and cached
#
# Clients: KUBECONFIG=$K8S_DIR/admin.kubeconfig (user gpu-portal-admin, group system:masters;
# certificates embedded, server https://127.0.0.1:$K8S_PORT_BASE). Use it for the tests, for
# the connector and for a simulated kubelet (it may create and update Nodes and pod status).
# $K8S_DIR/kubelet.kubeconfig is the real kubelet's own (system:node:$K8S_NODE, which the Node
# authorizer confines to that node and its pods). The CA is $K8S_DIR/pki/ca.crt.
#
# Test pods: hostNetwork: true (there is no pod network: no CNI), image K8S_JOB_IMAGE or the
# pause image (nothing can be pulled: a pull goes to a closed port on 127.0.0.1 and fails
# with ErrImagePull). A container that asks for nvidia.com/gpu gets CUDA_VISIBLE_DEVICES and
# NVIDIA_VISIBLE_DEVICES (e.g. "1,2") and FAKE_GPU_DEVICE_IDS. kubectl logs and exec work
# (the node's address is 127.0.0.1). The node's CPU and memory are this machine's, whatever
# the tests pretend. Pod log files are under $K8S_DIR/logs/pods.
#
# The kubelet is patched (see k8s_build.sh) so that it keeps to its K8S_DIR. The only things
# outside K8S_DIR: the binary cache; the sockets of containerd's shims, which containerd 1.6
# always puts in /run/containerd/s/ (names hashed from our socket path; `stop` removes them);
# the containers' cgroups, /sys/fs/cgroup/<controller>/k8s.io/<container id> (gone with them).
set -euo pipefail

K8S_DIR=${K8S_DIR:-/tmp/gpu-portal-k8s}
K8S_PORT_BASE=${K8S_PORT_BASE:-16443}
K8S_NODE=${K8S_NODE:-kube1}
K8S_GPUS=${K8S_GPUS:-8}
K8S_GPU_PRODUCT=${K8S_GPU_PRODUCT-NVIDIA-H100-80GB-HBM3}
K8S_KUBELET=${K8S_KUBELET:-1}
K8S_JOB_IMAGE=${K8S_JOB_IMAGE:-localhost/gpu-portal/busybox:test}
K8S_PAUSE_IMAGE=${K8S_PAUSE_IMAGE:-localhost/gpu-portal/pause:test}
K8S_NODE_GRACE=${K8S_NODE_GRACE:-10}
K8S_KUBELET_CLEANUP_PERIOD=${K8S_KUBELET_CLEANUP_PERIOD:-2s}
K8S_START_TIMEOUT=${K8S_START_TIMEOUT:-120}

# Relative paths would break as soon as a daemon chdir()s, and callers run us from anywhere.
case $K8S_DIR in /*) ;; *) K8S_DIR="$PWD/$K8S_DIR" ;; esac
K8S_DIR=${K8S_DIR%/}
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
REPO="$(dirname "$(dirname "$SELF")")"

derive_ports() {
  APISERVER_PORT=$K8S_PORT_BASE
  ETCD_PORT=$((K8S_PORT_BASE + 1))
  ETCD_PEER_PORT=$((K8S_PORT_BASE + 2))
  CM_PORT=$((K8S_PORT_BASE + 3))
  SCHED_PORT=$((K8S_PORT_BASE + 4))
  KUBELET_PORT=$((K8S_PORT_BASE + 5))
  KUBELET_HEALTHZ_PORT=$((K8S_PORT_BASE + 6))
  SERVER="https://127.0.0.1:$APISERVER_PORT"
}
derive_ports

PKI="$K8S_DIR/pki"
LOG_DIR="$K8S_DIR/logs"
RUN_DIR="$K8S_DIR/run"
ETCD_DATA="$K8S_DIR/etcd"
CTRD_DIR="$K8S_DIR/containerd"
CTRD_SOCK="$CTRD_DIR/containerd.sock"
KUBELET_DIR="$K8S_DIR/kubelet"
PLUGIN_DIR="$KUBELET_DIR/device-plugins"
IMAGE_DIR="$K8S_DIR/images"
ADMIN_KUBECONFIG="$K8S_DIR/admin.kubeconfig"
KUBELET_KUBECONFIG="$K8S_DIR/kubelet.kubeconfig"
# Written by a successful start: its settings, which the other commands use (not the
# environment's), and where the binaries are.
SETTINGS="$K8S_DIR/settings"
BIN=""
# Every process we start carries this variable, and so do the containerd shims (they inherit
# containerd's environment): that is how `stop` finds exactly this cluster's processes and no
# one else's (pid files can go stale). The containers' processes are the shims' descendants.
MARK="GPU_PORTAL_K8S_DIR=$K8S_DIR"
role_mark() { echo "GPU_PORTAL_K8S_ROLE=$1"; }
# For containerd and the kubelet: nothing here may reach beyond this machine. A pull of an
# image that is not there goes to a closed port instead of a registry (Go never proxies
# loopback addresses, so the apiserver and the sockets are unaffected), and the kubelet's
# built-in ECR credential provider does not ask the EC2 metadata service for credentials.
NO_NETWORK_ENV=(HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 http_proxy=http://127.0.0.1:9
  https_proxy=http://127.0.0.1:9 "NO_PROXY=127.0.0.1,localhost" "no_proxy=127.0.0.1,localhost" AWS_EC2_METADATA_DISABLED=true)
# Bump when the images' recipe below changes (it names the cached image archive).
IMAGE_RECIPE=1

# Set while `start` runs: a half-started cluster is torn down again rather than left behind
# (the logs stay, for the error message and for whoever looks afterwards).
STARTING=""

die() {
  echo "k8s_up: $*" >&2
  if [ -n "$STARTING" ]; then
    STARTING=""
    cmd_stop >/dev/null 2>&1 || true
  fi
  exit 1
}
say() { echo "k8s_up: $*" >&2; }

# Show why a daemon failed: the end of its log.
show_log() {
  local f
  for f in "$@"; do
    f="$LOG_DIR/$f.log"
    if [ -s "$f" ]; then
      echo "----- last lines of $f -----" >&2
      tail -n 25 "$f" >&2
    fi
  done
}

ensure_packages() {
  local missing=()
  command -v etcd >/dev/null || missing+=(etcd-server)
  if [ "$K8S_KUBELET" = 1 ]; then
    command -v containerd >/dev/null && command -v ctr >/dev/null || missing+=(containerd)
    command -v runc >/dev/null || missing+=(runc)
    [ -x /bin/busybox ] || missing+=(busybox-static)
  fi
  command -v openssl >/dev/null || missing+=(openssl)
  command -v curl >/dev/null || missing+=(curl)
  command -v flock >/dev/null || missing+=(util-linux)
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]} (apt-get)"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # The packages' postinst scripts may start system-wide etcd/containerd services (not without
  # systemd); we neither use nor disturb them: ours have their own directories and ports.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2 ||
    { $sudo apt-get update -q >&2 && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2; }
}

# Only busybox-static will do for the images: a dynamically linked busybox would need its
# libraries inside the image.
check_busybox() {
  [ "$K8S_KUBELET" = 1 ] || return 0
  # ldd fails ("not a dynamic executable") exactly for a static binary.
  if ldd /bin/busybox >/dev/null 2>&1; then
    die "/bin/busybox is not a static binary (install busybox-static)"
  fi
}

# --- processes --------------------------------------------------------------------------------

# A pid counts as ours only if it is alive and carries our marker (and the role's, if given):
# a pid file left by a crashed run may name a pid the kernel has since given to another process.
is_ours() {
  local pid=$1
  [ -n "$pid" ] || return 1
  grep -qzxF -- "$MARK" "/proc/$pid/environ" 2>/dev/null || return 1
  [ -z "${2:-}" ] || grep -qzxF -- "$(role_mark "$2")" "/proc/$pid/environ" 2>/dev/null
}

pid_from() { tr -dc '0-9' 2>/dev/null <"$1" || true; }

# Pids of the processes that carry our marker (and role $1, if given): no descendants.
marked_pids() {
  local f p
  # One grep over every process's environment (a loop over /proc would fork hundreds of times).
  while IFS= read -r f; do
    p=${f#/proc/}
    p=${p%/environ}
    [ "$p" = "$$" ] && continue
    [ -z "${1:-}" ] || grep -qzxF -- "$(role_mark "$1")" "$f" 2>/dev/null || continue
    echo "$p"
  done < <(grep -lzxF -- "$MARK" /proc/[0-9]*/environ 2>/dev/null)
  return 0
}

# The given pids and all their descendants.
with_descendants() {
  [ $# -eq 0 ] && return 0
  ps -e -o pid=,ppid= | awk -v roots="$*" '
    BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
    { parent[$1] = $2; pids[NR] = $1 }
    END {
      changed = 1
      while (changed) {
        changed = 0
        for (i in pids) { p = pids[i]; if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 } }
      }
      for (p in keep) print p
    }'
}

# Every process of this cluster: the marked ones and their descendants (the containers).
our_pids() {
  # shellcheck disable=SC2046
  with_descendants $(marked_pids)
}

comm_of() { cat "/proc/$1/comm" 2>/dev/null || true; }

# TERM (or $3), wait up to $2 seconds, then KILL whatever is left.
kill_and_wait() {
  local pids=$1 secs=${2:-10} sig=${3:-TERM} p alive i
  [ -z "${pids// /}" ] && return 0
  # shellcheck disable=SC2086
  kill -"$sig" $pids 2>/dev/null || true
  for ((i = 0; i < secs * 10; i++)); do
    alive=""
    for p in $pids; do [ -d "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && alive+="$p "; done
    [ -z "$alive" ] && return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $alive 2>/dev/null || true
  sleep 0.2
}

# A daemon is alive when the pid in its pid file is ours, with the right role.
alive() { is_ours "$(pid_from "$RUN_DIR/$1.pid")" "$1"; }

# Starts a daemon in the background, detached from our session (a Ctrl-C in the caller's
# terminal must not reach it) and from our stdout (a caller reading it to EOF, as
# $(k8s_up.sh start) does, would wait for ever), with our marker and its role in its environment.
# $1: role (also the pid and log file names); the rest: the command, which may start with VAR=value.
spawn() {
  local role=$1
  shift
  # (8>&-: not our lock; a daemon holding it would block every later start.)
  env "$MARK" "$(role_mark "$role")" setsid "$@" </dev/null >>"$LOG_DIR/$role.log" 2>&1 8>&- &
  local pid=$! i
  echo "$pid" >"$RUN_DIR/$role.pid"
  # Until env has exec'd, the child carries this shell's environment, not the marker: a check
  # of `alive` in that moment (longer on a loaded machine) took a starting daemon for a dead
  # one. Return once it carries the marker, or once it is gone.
  for ((i = 0; i < 100; i++)); do
    is_ours "$pid" "$role" && return 0
    { [ -d "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; } || return 0
    sleep 0.1
  done
}

# Waits up to $2 seconds for the command $3... to succeed while daemon $1 stays alive.
wait_for() {
  local role=$1 secs=$2 deadline
  shift 2
  deadline=$((SECONDS + secs))
  while [ $SECONDS -lt $deadline ]; do
    "$@" >/dev/null 2>&1 && return 0
    alive "$role" || { show_log "$role"; die "$role died"; }
    sleep 0.2
  done
  show_log "$role"
  die "$role did not come up in ${secs}s (log: $LOG_DIR/$role.log)"
}

# --- certificates and kubeconfigs -------------------------------------------------------------

# $1: name, $2: subject, $3: extensions (subjectAltName, extendedKeyUsage). EC P-256 keys:
# fast to make, and every component here takes them.
make_cert() {
  local name=$1 subj=$2 ext=$3
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n%s\n' "$ext" >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -CAserial "$PKI/ca.srl" -days 3650 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

make_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=gpu-portal-test-ca" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$PKI/ca.crt" 2>/dev/null
  make_cert apiserver "/CN=kube-apiserver" \
    "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
  make_cert admin "/O=system:masters/CN=gpu-portal-admin" "extendedKeyUsage=clientAuth"
  make_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
  make_cert kubelet "/O=system:nodes/CN=system:node:$K8S_NODE" "extendedKeyUsage=clientAuth"
  make_cert kubelet-serving "/CN=$K8S_NODE" "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:$K8S_NODE
extendedKeyUsage=serverAuth"
  # The service-account token signing key pair.
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
  openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  chmod 600 "$PKI"/*.key
}

# $1: file, $2: user name, $3: certificate name in PKI.
write_kubeconfig() {
  local out=$1 user=$2 cert=$3
  (
    umask 077
    cat >"$out.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gpu-portal-test
  cluster:
    server: $SERVER
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 <"$PKI/$cert.crt")
    client-key-data: $(base64 -w0 <"$PKI/$cert.key")
contexts:
- name: gpu-portal-test
  context:
    cluster: gpu-portal-test
    user: $user
current-context: gpu-portal-test
EOF
  )
  mv "$out.tmp" "$out"
}

kubectl() { timeout 20 "$BIN/kubectl" --kubeconfig="$ADMIN_KUBECONFIG" --request-timeout=15s "$@"; }

apiserver_ready() {
  [ "$(curl -sS --max-time 5 --cacert "$PKI/ca.crt" "$SERVER/readyz" 2>/dev/null)" = ok ]
}

# --- images -----------------------------------------------------------------------------------

# Builds (once: cached by content) a docker-archive tarball holding two images that share one
# layer, busybox-static with its applet links: K8S_JOB_IMAGE (command sh) and K8S_PAUSE_IMAGE
# (a sandbox: a shell that sleeps until TERM). Prints its path.
build_images() {
  local arch key tar work rootfs applet layer_sha job_cfg pause_cfg
  arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
  key=$(printf '%s\n' "$IMAGE_RECIPE" "$arch" "$K8S_JOB_IMAGE" "$K8S_PAUSE_IMAGE" "$(sha256sum </bin/busybox)" | sha256sum | cut -c1-16)
  tar="$IMAGE_DIR/images-$key.tar"
  if [ -s "$tar" ]; then
    echo "$tar"
    return 0
  fi
  mkdir -p "$IMAGE_DIR"
  work=$(mktemp -d "$IMAGE_DIR/build.XXXXXX")
  rootfs="$work/rootfs"
  mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,root,home,proc,sys,dev,tmp,var/tmp,run}
  chmod 1777 "$rootfs/tmp" "$rootfs/var/tmp"
  chmod 700 "$rootfs/root"
  cp /bin/busybox "$rootfs/bin/busybox"
  for applet in $(/bin/busybox --list-full); do
    [ -e "$rootfs/$applet" ] || [ -L "$rootfs/$applet" ] || ln -s /bin/busybox "$rootfs/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
  # A reproducible layer: sorted, no timestamps, root-owned, paths without a leading "./".
  (cd "$rootfs" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | LC_ALL=C sort |
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$work/layer.tar" -T -)
  layer_sha=$(sha256sum <"$work/layer.tar" | cut -d' ' -f1)
  mkdir -p "$work/archive/$layer_sha"
  mv "$work/layer.tar" "$work/archive/$layer_sha/layer.tar"
  image_config() {
    printf '{"architecture":"%s","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"gpu-portal scripts/k8s_up.sh: busybox-static"}]}' \
      "$arch" "$1" "$layer_sha"
  }
  image_config '"Cmd":["/bin/sh"]' >"$work/job.json"
  # PID 1 of its own pid namespace: without the trap, TERM would not end it.
  image_config '"Entrypoint":["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 86400 & wait $!; done"]' >"$work/pause.json"
  job_cfg=$(sha256sum <"$work/job.json" | cut -d' ' -f1)
  pause_cfg=$(sha256sum <"$work/pause.json" | cut -d' ' -f1)
  mv "$work/job.json" "$work/archive/$job_cfg.json"
  mv "$work/pause.json" "$work/archive/$pause_cfg.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]},{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
    "$job_cfg" "$K8S_JOB_IMAGE" "$layer_sha" "$pause_cfg" "$K8S_PAUSE_IMAGE" "$layer_sha" >"$work/archive/manifest.json"
  (cd "$work/archive" && tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$work/images.tar" -- *)
  mv "$work/images.tar" "$tar"
  rm -rf "$work"
  echo "$tar"
}

# --- configuration ----------------------------------------------------------------------------

# What a running cluster must have been started with to be reused.
settings() {
  cat <<EOF
K8S_PORT_BASE=$K8S_PORT_BASE
K8S_NODE=$K8S_NODE
K8S_GPUS=$K8S_GPUS
K8S_GPU_PRODUCT=$K8S_GPU_PRODUCT
K8S_KUBELET=$K8S_KUBELET
K8S_JOB_IMAGE=$K8S_JOB_IMAGE
K8S_PAUSE_IMAGE=$K8S_PAUSE_IMAGE
K8S_NODE_GRACE=$K8S_NODE_GRACE
K8S_KUBELET_CLEANUP_PERIOD=$K8S_KUBELET_CLEANUP_PERIOD
bin=$BIN
build=$(cat "$BIN/BUILD_INFO" 2>/dev/null || true)
plugin=$(cat "$BIN/fake-gpu-plugin.sha256" 2>/dev/null || true)
script=$(sha256sum <"$SELF" | cut -d' ' -f1)
EOF
}

write_containerd_config() {
  mkdir -p "$CTRD_DIR"/{root,state,opt,runc} "$K8S_DIR/cni/net.d" "$K8S_DIR/cni/bin"
  cat >"$CTRD_DIR/config.toml" <<EOF
# Generated by scripts/k8s_up.sh; rewritten on every start.
version = 2
root = "$CTRD_DIR/root"
state = "$CTRD_DIR/state"
# Neither the default /opt/containerd nor any snapshotter we do not use.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "$CTRD_SOCK"

[ttrpc]
  address = "$CTRD_SOCK.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$CTRD_DIR/opt"

  [plugins."io.containerd.grpc.v1.cri"]
    # Nothing can be pulled here: the sandbox image is one we import.
    sandbox_image = "$K8S_PAUSE_IMAGE"
    # Needed where containerd itself runs with a raised oom_score_adj floor (as here):
    # otherwise a container's lower oom_score_adj makes runc fail.
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_tls_streaming = false
    disable_apparmor = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      # Never used (only hostNetwork pods); the file there only makes the CRI report
      # NetworkReady, without which the kubelet keeps the node NotReady.
      bin_dir = "$K8S_DIR/cni/bin"
      conf_dir = "$K8S_DIR/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "runc"
          Root = "$CTRD_DIR/runc"
          SystemdCgroup = false
EOF
  cat >"$K8S_DIR/cni/net.d/10-hostnetwork-only.conflist" <<'EOF'
{
  "cniVersion": "0.4.0",
  "name": "hostnetwork-only",
  "plugins": [{"type": "gpu-portal-no-pod-network"}]
}
EOF
}

write_kubelet_config() {
  local resolv=/etc/resolv.conf
  [ -f "$resolv" ] || resolv=""
  cat >"$K8S_DIR/kubelet-config.yaml" <<EOF
# Generated by scripts/k8s_up.sh; rewritten on every start.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: AlwaysAllow
# No systemd, no QoS cgroup tree, no node allocatable enforcement.
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
resolvConf: "$resolv"
# A stopped kubelet must make its node NotReady fast (controller-manager: grace $K8S_NODE_GRACE s):
# the lease is renewed every nodeLeaseDurationSeconds/4 = 2 s, the status posted every 2 s.
nodeLeaseDurationSeconds: 8
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 10s
syncFrequency: 10s
# Never evict pods nor garbage-collect images (the imported ones cannot be pulled again).
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
kubeAPIQPS: 50
kubeAPIBurst: 100
eventRecordQPS: 50
eventBurst: 100
EOF
}

# --- starting ---------------------------------------------------------------------------------

start_etcd() {
  spawn etcd etcd --name=gpu-portal --data-dir="$ETCD_DATA" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="gpu-portal=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state=new \
    --logger=zap --log-outputs=stderr
}

etcd_healthy() { curl -sS --max-time 3 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; }

start_apiserver() {
  spawn kube-apiserver "$BIN/kube-apiserver" \
    --advertise-address=127.0.0.1 --bind-address=127.0.0.1 --secure-port="$APISERVER_PORT" --insecure-port=0 \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" --client-ca-file="$PKI/ca.crt" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 \
    --endpoint-reconciler-type=none \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname \
    --profiling=false
}

start_controller_manager() {
  spawn kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$ADMIN_KUBECONFIG" --authentication-kubeconfig="$ADMIN_KUBECONFIG" --authorization-kubeconfig="$ADMIN_KUBECONFIG" \
    --bind-address=127.0.0.1 --secure-port="$CM_PORT" --port=0 --leader-elect=false \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --node-monitor-period=2s --node-monitor-grace-period="${K8S_NODE_GRACE}s" \
    --flex-volume-plugin-dir="$K8S_DIR/volume-plugins" \
    --kube-api-qps=100 --kube-api-burst=200 --profiling=false
}

start_scheduler() {
  spawn kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$ADMIN_KUBECONFIG" --authentication-kubeconfig="$ADMIN_KUBECONFIG" --authorization-kubeconfig="$ADMIN_KUBECONFIG" \
    --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --port=0 --leader-elect=false --profiling=false
}

ctr_() { timeout 60 ctr --address "$CTRD_SOCK" --namespace k8s.io "$@"; }

start_containerd() {
  spawn containerd env "${NO_NETWORK_ENV[@]}" containerd --config "$CTRD_DIR/config.toml"
  wait_for containerd 30 ctr_ version
}

import_images() {
  local tar
  tar=$(build_images)
  ctr_ images import "$tar" >/dev/null 2>"$LOG_DIR/ctr-import.log" ||
    { show_log ctr-import; die "importing $tar into containerd failed"; }
}

start_kubelet() {
  local labels=()
  [ -n "$K8S_GPU_PRODUCT" ] && labels=(--node-labels="nvidia.com/gpu.product=$K8S_GPU_PRODUCT")
  mkdir -p "$KUBELET_DIR" "$LOG_DIR/pods" "$LOG_DIR/containers" "$K8S_DIR/volume-plugins"
  # KUBELET_*: see k8s_build.sh (the stock kubelet would use /var/log/pods and
  # /var/log/containers, and delete every other kubelet's pod logs there).
  spawn kubelet env "${NO_NETWORK_ENV[@]}" KUBELET_POD_LOGS_DIR="$LOG_DIR/pods" KUBELET_CONTAINER_LOGS_DIR="$LOG_DIR/containers" \
    KUBELET_CONTAINER_GC_PERIOD="$K8S_KUBELET_CLEANUP_PERIOD" KUBELET_STATUS_SYNC_PERIOD="$K8S_KUBELET_CLEANUP_PERIOD" \
    "$BIN/kubelet" --config="$K8S_DIR/kubelet-config.yaml" --kubeconfig="$KUBELET_KUBECONFIG" \
    --root-dir="$KUBELET_DIR" --cert-dir="$KUBELET_DIR/pki" --seccomp-profile-root="$KUBELET_DIR/seccomp" \
    --volume-plugin-dir="$K8S_DIR/volume-plugins" \
    --hostname-override="$K8S_NODE" --node-ip=127.0.0.1 "${labels[@]}" \
    --container-runtime=remote --container-runtime-endpoint="unix://$CTRD_SOCK" --containerd="$CTRD_SOCK" \
    --pod-infra-container-image="$K8S_PAUSE_IMAGE"
}

# The plugin waits for the kubelet's registration socket by itself, and registers again
# whenever the kubelet restarts.
start_plugin() {
  mkdir -p "$PLUGIN_DIR"
  spawn fake-gpu-plugin "$BIN/fake-gpu-plugin" -kubelet-dir "$PLUGIN_DIR" -count "$K8S_GPUS" \
    -resource nvidia.com/gpu -socket fake-gpu.sock
}

# The node's daemons: the kubelet, and its device plugin unless the node has no GPUs.
node_roles() {
  echo kubelet
  [ "$K8S_GPUS" -gt 0 ] && echo fake-gpu-plugin
  return 0
}

kubelet_healthy() { [ "$(curl -sS --max-time 3 "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz" 2>/dev/null)" = ok ]; }

# "Ready allocatable-gpus taints" of our node, e.g. "True 8 " when all is well.
node_state() {
  kubectl get node "$K8S_NODE" -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status}{end} {.status.allocatable.nvidia\.com/gpu} {range .spec.taints[*]}{.key}:{.effect},{end}' 2>/dev/null
}

node_ready() {
  local gpus=$K8S_GPUS
  [ "$gpus" -gt 0 ] || gpus=""
  [ "$(node_state)" = "True $gpus " ]
}

# The plugin has registered (again) since its log had $1 lines.
plugin_registered_since() {
  tail -n +"$(($1 + 1))" "$LOG_DIR/fake-gpu-plugin.log" 2>/dev/null | grep -q ' registered '
}

log_lines() { if [ -f "$LOG_DIR/$1.log" ]; then wc -l <"$LOG_DIR/$1.log"; else echo 0; fi; }

# Waits until the kubelet answers, the plugin has registered since log line $1, and the node is
# Ready, untainted, with all its GPUs allocatable.
wait_node_ready() {
  local plugin_lines=$1 deadline=$((SECONDS + K8S_START_TIMEOUT)) phase=kubelet role
  while [ $SECONDS -lt $deadline ]; do
    for role in $(node_roles); do
      alive "$role" || { show_log "$role"; die "$role died"; }
    done
    case $phase in
      kubelet) kubelet_healthy && phase=plugin && [ "$K8S_GPUS" -eq 0 ] && phase=node ;;
      plugin) plugin_registered_since "$plugin_lines" && phase=node ;;
      node) node_ready && return 0 ;;
    esac
    sleep 0.2
  done
  echo "----- node $K8S_NODE: Ready, allocatable GPUs, taints: $(node_state) -----" >&2
  show_log kubelet fake-gpu-plugin containerd
  die "node $K8S_NODE not ready after ${K8S_START_TIMEOUT}s (waiting for: $phase)"
}

# The token controller has given the default service account its token: pods can be created.
default_token_ready() {
  [ -n "$(kubectl get serviceaccount default -n default -o jsonpath='{.secrets[0].name}' 2>/dev/null)" ]
}

# Another cluster (or anything else) on our ports would make a daemon die with a terse
# "address already in use" in its log; say so plainly instead.
check_ports_free() {
  local port
  for ((port = K8S_PORT_BASE; port <= K8S_PORT_BASE + 6; port++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port is already in use (another cluster? choose another K8S_PORT_BASE)"
    fi
  done
}

all_daemons_alive() {
  local role roles="etcd kube-apiserver kube-controller-manager kube-scheduler"
  [ "$K8S_KUBELET" = 1 ] && roles+=" containerd $(node_roles | tr '\n' ' ')"
  for role in $roles; do alive "$role" || return 1; done
}

cluster_up() {
  all_daemons_alive && apiserver_ready || return 1
  [ "$K8S_KUBELET" = 1 ] || return 0
  node_ready
}

# For the commands other than start: the settings the cluster was started with.
load_settings() {
  [ -s "$SETTINGS" ] || die "no cluster started in $K8S_DIR (run start first)"
  local key value
  while IFS='=' read -r key value; do
    case $key in
      K8S_PORT_BASE | K8S_NODE | K8S_GPUS | K8S_GPU_PRODUCT | K8S_KUBELET | K8S_JOB_IMAGE | K8S_PAUSE_IMAGE | \
        K8S_NODE_GRACE | K8S_KUBELET_CLEANUP_PERIOD) printf -v "$key" '%s' "$value" ;;
      bin) BIN=$value ;;
    esac
  done <"$SETTINGS"
  derive_ports
}

cmd_start() {
  local t0=$SECONDS
  ensure_packages
  check_busybox
  BIN=$(bash "$REPO/scripts/k8s_build.sh" | tail -n 1)
  if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/fake-gpu-plugin" ]; then die "k8s_build.sh gave no binaries ($BIN)"; fi
  mkdir -p "$K8S_DIR"
  # One start or stop at a time per K8S_DIR (parallel test runs share a default cluster).
  exec 8>"$K8S_DIR/.lock"
  flock 8
  local want
  want=$(settings)
  # Reuse a running cluster only if it was started with the same settings.
  if [ "$want" = "$(cat "$SETTINGS" 2>/dev/null || true)" ] && cluster_up; then
    echo "export KUBECONFIG=$ADMIN_KUBECONFIG"
    return 0
  fi
  # Anything half-up or stale is thrown away: a fresh start is cheaper than working out what
  # survived, and old objects in etcd would confuse a portal that starts with an empty database.
  cmd_stop >/dev/null
  STARTING=1
  rm -rf "$PKI" "$LOG_DIR" "$RUN_DIR" "$ETCD_DATA" "$CTRD_DIR" "$KUBELET_DIR" "$K8S_DIR/cni" \
    "$K8S_DIR/volume-plugins" "$SETTINGS" "$ADMIN_KUBECONFIG" "$KUBELET_KUBECONFIG" ||
    die "cannot clear $K8S_DIR (something still mounted there?)"
  mkdir -p "$LOG_DIR" "$RUN_DIR"
  check_ports_free
  make_pki
  write_kubeconfig "$ADMIN_KUBECONFIG" gpu-portal-admin admin
  write_kubeconfig "$KUBELET_KUBECONFIG" "system:node:$K8S_NODE" kubelet
  start_etcd
  if [ "$K8S_KUBELET" = 1 ]; then
    # containerd and the images meanwhile: they need no apiserver.
    write_containerd_config
    write_kubelet_config
    start_containerd
    import_images
  fi
  wait_for etcd 30 etcd_healthy
  start_apiserver
  if [ "$K8S_KUBELET" = 1 ]; then
    # The kubelet spends its first ~5 s (cAdvisor) without the apiserver, which needs ~7 s
    # to be ready: start it at once, it keeps trying to register its node.
    start_kubelet
    [ "$K8S_GPUS" -gt 0 ] && start_plugin
  fi
  wait_for kube-apiserver 60 apiserver_ready
  # These two give up when the apiserver does not answer within seconds.
  start_controller_manager
  start_scheduler
  [ "$K8S_KUBELET" = 1 ] && wait_node_ready 0
  wait_for kube-controller-manager 60 default_token_ready
  alive kube-scheduler || { show_log kube-scheduler; die "kube-scheduler died"; }
  settings >"$SETTINGS"
  STARTING=""
  say "cluster up in $((SECONDS - t0)) s (logs: $LOG_DIR)"
  echo "export KUBECONFIG=$ADMIN_KUBECONFIG"
}

# --- stopping ---------------------------------------------------------------------------------

# The sockets containerd's shims make in /run/containerd/s/ (containerd 1.6 has no setting for
# that directory): sha256 of "<containerd socket>/<namespace>/<id>", per running shim.
shim_sockets() {
  local p args ns id
  for p in "$@"; do
    mapfile -t args < <(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null)
    ns="" id=""
    local i
    for ((i = 0; i < ${#args[@]}; i++)); do
      case ${args[i]} in
        -namespace) ns=${args[i + 1]:-} ;;
        -id) id=${args[i + 1]:-} ;;
      esac
    done
    [ -n "$ns" ] && [ -n "$id" ] && echo "/run/containerd/s/$(printf '%s' "$CTRD_SOCK/$ns/$id" | sha256sum | cut -d' ' -f1)"
  done
  return 0
}

# Everything mounted under K8S_DIR (container root filesystems, sandbox /dev/shm, the kubelet's
# secret volumes and its shared bind mount of its root dir), innermost first.
unmount_all() {
  local i mounts m
  for ((i = 0; i < 5; i++)); do
    mounts=$(awk -v d="$K8S_DIR/" 'substr($5, 1, length(d)) == d || $5 == substr(d, 1, length(d) - 1) { print $5 }' /proc/self/mountinfo | awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2-)
    [ -z "$mounts" ] && return 0
    while read -r m; do
      m=$(printf '%b' "$m") # mountinfo writes a space as \040
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done <<<"$mounts"
  done
}

cmd_stop() {
  local p shims="" containers="" sockets
  # The kubelet and its plugin first, so that nothing restarts containers; then the control
  # plane's controllers, the containers (a teardown: TERM, a second, KILL), containerd and its
  # shims, the apiserver, etcd last.
  kill_and_wait "$(marked_pids kubelet | tr '\n' ' ') $(marked_pids fake-gpu-plugin | tr '\n' ' ')" 10
  kill_and_wait "$(marked_pids kube-controller-manager | tr '\n' ' ') $(marked_pids kube-scheduler | tr '\n' ' ')" 10
  for p in $(marked_pids containerd); do
    case $(comm_of "$p") in containerd-shim*) shims+="$p " ;; esac
  done
  # shellcheck disable=SC2086
  sockets=$(shim_sockets $shims)
  # shellcheck disable=SC2086
  for p in $(with_descendants $shims); do
    case " $shims " in *" $p "*) ;; *) containers+="$p " ;; esac
  done
  kill_and_wait "$containers" 1
  kill_and_wait "$(marked_pids containerd | tr '\n' ' ')" 10
  kill_and_wait "$(marked_pids kube-apiserver | tr '\n' ' ')" 3
  kill_and_wait "$(marked_pids etcd | tr '\n' ' ')" 10
  # Whatever is left (helpers, stragglers).
  kill_and_wait "$(our_pids | tr '\n' ' ')" 5 KILL
  for p in $sockets; do rm -f "$p"; done
  unmount_all
  rm -f "$RUN_DIR"/*.pid 2>/dev/null || true
  echo "k8s_up: stopped cluster in $K8S_DIR"
}

cmd_stop_apiserver() {
  local pids
  pids=$(marked_pids kube-apiserver | tr '\n' ' ')
  [ -n "${pids// /}" ] || { say "kube-apiserver is not running"; return 0; }
  # It stops listening at once on TERM, but then waits for its open watches for a minute
  # (v1.20): KILL it after 3 s.
  kill_and_wait "$pids" 3
  rm -f "$RUN_DIR/kube-apiserver.pid"
  echo "k8s_up: kube-apiserver stopped"
}

cmd_start_apiserver() {
  load_settings
  alive etcd || die "etcd of $K8S_DIR is not running (run start)"
  alive kube-apiserver || start_apiserver
  wait_for kube-apiserver 60 apiserver_ready
  echo "export KUBECONFIG=$ADMIN_KUBECONFIG"
}

cmd_stop_kubelet() {
  local pids
  pids="$(marked_pids kubelet | tr '\n' ' ') $(marked_pids fake-gpu-plugin | tr '\n' ' ')"
  [ -n "${pids// /}" ] || { say "the kubelet is not running"; return 0; }
  kill_and_wait "$pids" 10
  rm -f "$RUN_DIR/kubelet.pid" "$RUN_DIR/fake-gpu-plugin.pid"
  echo "k8s_up: kubelet of $K8S_NODE stopped (its containers keep running)"
}

cmd_start_kubelet() {
  load_settings
  [ "$K8S_KUBELET" = 1 ] || die "the cluster in $K8S_DIR has no kubelet (K8S_KUBELET=0)"
  alive containerd || die "containerd of $K8S_DIR is not running (run start)"
  apiserver_ready || die "the apiserver of $K8S_DIR does not answer"
  local lines
  lines=$(log_lines fake-gpu-plugin)
  if alive kubelet && { [ "$K8S_GPUS" -eq 0 ] || alive fake-gpu-plugin; }; then
    lines=0 # nothing to start: the plugin registered long ago
  else
    # A plugin that kept running registers again with the new kubelet by itself.
    alive kubelet || start_kubelet
    [ "$K8S_GPUS" -eq 0 ] || alive fake-gpu-plugin || start_plugin
  fi
  wait_node_ready "$lines"
  echo "k8s_up: node $K8S_NODE is Ready"
}

cmd_status() {
  load_settings
  local role state roles="etcd kube-apiserver kube-controller-manager kube-scheduler"
  [ "$K8S_KUBELET" = 0 ] || roles+=" containerd $(node_roles | tr '\n' ' ')"
  for role in $roles; do
    if alive "$role"; then state="running (pid $(pid_from "$RUN_DIR/$role.pid"))"; else state="not running"; fi
    printf '%-24s %s\n' "$role" "$state"
  done
  apiserver_ready || die "the apiserver at $SERVER does not answer"
  kubectl get nodes -o wide -L nvidia.com/gpu.product
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  stop-apiserver) cmd_stop_apiserver ;;
  start-apiserver) cmd_start_apiserver ;;
  stop-kubelet) cmd_stop_kubelet ;;
  start-kubelet) cmd_start_kubelet ;;
  *)
    echo "usage: $0 start|stop|status|stop-apiserver|start-apiserver|stop-kubelet|start-kubelet  (settings via env, see the header)" >&2
    exit 2
    ;;
esac
