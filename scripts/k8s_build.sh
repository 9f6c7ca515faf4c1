#!/usr/bin/env bash
# Builds the Kubernetes binaries the tests need (kube-apiserver, kube-scheduler,
# kube-controller-manager, kubelet, kubectl) from Debian's `kubernetes` source package, once,
# into a cache directory outside the checkout. Debian ships no Kubernetes binaries; its source
# package vendors every dependency, so it builds offline with Debian's golang-go.
# It also builds the tests' fake GPU device plugin (tests/kubernetes/fakegpu/main.go) into
# bin/fake-gpu-plugin, against the device plugin API and gRPC packages vendored in that tree.
#
# Its vendored github.com/modern-go/reflect2 is replaced by Debian's 1.0.2 (the one that works
# with Go 1.18 and later; see fetch_source). The kubelet is patched (patch_kubelet below;
# bin/BUILD_INFO names the patches), so that
# several test clusters on one machine keep out of each other's way and off the network:
#   - it accepts a loopback --node-ip (127.0.0.1): the apiserver reaches it for logs/exec on
#     loopback, where it listens, instead of on the machine's external address;
#   - its device plugin registration socket is <--root-dir>/device-plugins/kubelet.sock, not
#     the hard-coded /var/lib/kubelet/device-plugins/kubelet.sock (whose directory it empties
#     at every start, the other kubelets' sockets included);
#   - KUBELET_POD_LOGS_DIR / KUBELET_CONTAINER_LOGS_DIR (environment) replace the hard-coded
#     /var/log/pods and /var/log/containers: a kubelet's log GC deletes every pod log
#     directory there that it does not know, i.e. those of any other kubelet on the machine;
#   - KUBELET_CONTAINER_GC_PERIOD and KUBELET_STATUS_SYNC_PERIOD (environment, Go durations)
#     replace two hard-coded periods, 1 min and 10 s: a deleted pod's object goes only once
#     container GC has removed its sandbox and the status manager has noticed, so stock
#     values leave a gracefully deleted pod Terminating for up to 70 s after its containers
#     exited.
#
#   bash scripts/k8s_build.sh          # build when absent; last stdout line: the bin directory
#
# Settings, from the environment:
#   K8S_CACHE   /var/cache/gpu-portal/kubernetes   where the binaries (bin/) and the build live
#
# About 14 minutes and 1.4 GB on 2 cores the first time; a cache that holds every binary is
# reused as it is. The build tree is removed once the binaries are in place; the few vendored
# packages the plugin needs are kept (fakegpu/gopath, 15 MB, and its Go build cache, 60 MB),
# so that a change to the plugin's source (bin/fake-gpu-plugin.sha256 holds the sha256 of the
# source it was built from) only rebuilds the plugin, in seconds. Concurrent runs wait for
# each other (flock). A cache whose bin/BUILD_INFO differs from BUILD_INFO below is rebuilt.
set -euo pipefail

K8S_CACHE=${K8S_CACHE:-/var/cache/gpu-portal/kubernetes}
BINARIES="kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl"
BIN="$K8S_CACHE/bin"
# What bin/BUILD_INFO must say for the binaries there to count; change it with the recipe.
BUILD_INFO="v1.20.2 reflect2-1.0.2 kubelet-patches: loopback-node-ip device-plugins-under-root-dir env: log-dirs gc-period status-sync-period"
PLUGIN_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/kubernetes/fakegpu/main.go"
# A GOPATH holding only the vendored packages the plugin imports, plus the plugin (as `fakegpu`).
PLUGIN_GOPATH="$K8S_CACHE/fakegpu/gopath"
WORK="$K8S_CACHE/build"

have_all() {
  [ "$(cat "$BIN/BUILD_INFO" 2>/dev/null)" = "$BUILD_INFO" ] || return 1
  for b in $BINARIES; do [ -x "$BIN/$b" ] || return 1; done
}
plugin_sha() { sha256sum "$PLUGIN_SRC" | cut -d' ' -f1; }
plugin_current() {
  [ -x "$BIN/fake-gpu-plugin" ] && [ "$(cat "$BIN/fake-gpu-plugin.sha256" 2>/dev/null)" = "$(plugin_sha)" ]
}

if have_all && plugin_current; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$K8S_CACHE"
exec 9>"$K8S_CACHE/.build.lock"
flock 9
# Someone else may have built while we waited for the lock.
if have_all && plugin_current; then
  echo "$BIN"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
need=""
command -v go >/dev/null || need="$need golang-go"
command -v dpkg-source >/dev/null || need="$need dpkg-dev"
if [ -n "$need" ]; then
  # shellcheck disable=SC2086
  apt-get install -y -q $need >&2
fi

# Downloads and unpacks the source package into $WORK/src, visible as k8s.io/kubernetes in the
# GOPATH $WORK/.go.
fetch_source() {
  # The source package comes from Debian's deb-src index, which a fresh machine may not list.
  if ! apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes'; then
    cat > /etc/apt/sources.list.d/gpu-portal-debian-src.sources <<'SOURCES'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    apt-get update -q >&2
  fi
  rm -rf "$WORK"
  mkdir -p "$WORK"
  cd "$WORK"
  apt-get source --download-only kubernetes >&2
  dpkg-source -x --no-check kubernetes_*.dsc src >&2
  # The tree vendors github.com/modern-go/reflect2 1.0.1, which is broken under Go 1.18 and
  # later (Debian's Go is 1.19): its map iteration corrupts memory, and kube-apiserver panics,
  # now and then, decoding a JSON request. 1.0.2 is the fix; Debian packages it.
  apt-get download golang-github-modern-go-reflect2-dev >&2
  dpkg -x golang-github-modern-go-reflect2-dev_*.deb reflect2 >&2
  rm -rf src/vendor/github.com/modern-go/reflect2
  cp -r reflect2/usr/share/gocode/src/github.com/modern-go/reflect2 src/vendor/github.com/modern-go/
  rm -f src/vendor/github.com/modern-go/reflect2/go.mod
  mkdir -p "$WORK/.go/src/k8s.io"
  ln -s "$WORK/src" "$WORK/.go/src/k8s.io/kubernetes"
}

# Applies the kubelet patches described in the header to the unpacked source; fails loudly if
# the source no longer looks as expected.
patch_kubelet() {
  local k=pkg/kubelet
  # 1. A loopback node IP is fine on a single-machine test cluster.
  sed -i 's/^\tif nodeIP.IsLoopback() {$/\tif nodeIP.IsLoopback() \&\& false {/' "$k/kubelet_node_status.go"
  grep -q 'nodeIP.IsLoopback() && false {' "$k/kubelet_node_status.go" ||
    { echo "k8s_build: cannot patch $k/kubelet_node_status.go (source changed?)" >&2; exit 1; }
  # 2. The device plugin socket under the root dir.
  sed -i 's/devicemanager\.NewManagerImpl(machineInfo\.Topology, /devicemanager.NewManagerImplUnderRootDir(nodeConfig.KubeletRootDir, machineInfo.Topology, /' \
    "$k/cm/container_manager_linux.go"
  grep -q 'NewManagerImplUnderRootDir(nodeConfig.KubeletRootDir' "$k/cm/container_manager_linux.go" ||
    { echo "k8s_build: cannot patch $k/cm/container_manager_linux.go (source changed?)" >&2; exit 1; }
  cat >"$k/cm/devicemanager/gpu_portal_root_dir.go" <<'GO'
package devicemanager

import (
	"path/filepath"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// NewManagerImplUnderRootDir is NewManagerImpl with the registration socket in the kubelet's
// root directory. Patched in by gpu-portal's scripts/k8s_build.sh.
func NewManagerImplUnderRootDir(rootDir string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*ManagerImpl, error) {
	return newManagerImpl(filepath.Join(rootDir, "device-plugins", "kubelet.sock"), topology, topologyAffinityStore)
}
GO
  # 3. Constants that become variables set from the environment (unset: the stock values).
  sed -i '/^\tpodLogsRootDirectory = "\/var\/log\/pods"$/d' "$k/kuberuntime/kuberuntime_manager.go"
  sed -i '/^\tlegacyContainerLogsDir = "\/var\/log\/containers"$/d' "$k/kuberuntime/legacy.go"
  sed -i '/^\tContainerLogsDir = "\/var\/log\/containers"$/d' "$k/kubelet.go"
  sed -i '/^\tContainerGCPeriod = time\.Minute$/d' "$k/kubelet.go"
  sed -i '/^const syncPeriod = 10 \* time\.Second$/d' "$k/status/status_manager.go"
  if grep -q '^\s*\(podLogsRootDirectory\|legacyContainerLogsDir\|ContainerLogsDir\|ContainerGCPeriod\|const syncPeriod\) = ' \
    "$k/kuberuntime/kuberuntime_manager.go" "$k/kuberuntime/legacy.go" "$k/kubelet.go" "$k/status/status_manager.go"; then
    echo "k8s_build: cannot patch the kubelet's constants (source changed?)" >&2
    exit 1
  fi
  cat >"$k/kuberuntime/gpu_portal_env.go" <<'GO'
package kuberuntime

import "os"

// Patched in by gpu-portal's scripts/k8s_build.sh (these were constants).
var (
	podLogsRootDirectory   = gpuPortalEnvOr("KUBELET_POD_LOGS_DIR", "/var/log/pods")
	legacyContainerLogsDir = gpuPortalEnvOr("KUBELET_CONTAINER_LOGS_DIR", "/var/log/containers")
)

func gpuPortalEnvOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
GO
  cat >"$k/gpu_portal_env.go" <<'GO'
package kubelet

import (
	"os"
	"time"
)

// Patched in by gpu-portal's scripts/k8s_build.sh (these were constants).
var (
	// ContainerLogsDir is the location of container logs; must agree with kuberuntime's.
	ContainerLogsDir = func() string {
		if v := os.Getenv("KUBELET_CONTAINER_LOGS_DIR"); v != "" {
			return v
		}
		return "/var/log/containers"
	}()
	// ContainerGCPeriod is the period for performing container garbage collection.
	ContainerGCPeriod = func() time.Duration {
		if d, err := time.ParseDuration(os.Getenv("KUBELET_CONTAINER_GC_PERIOD")); err == nil && d > 0 {
			return d
		}
		return time.Minute
	}()
)
GO
  cat >"$k/status/gpu_portal_env.go" <<'GO'
package status

import (
	"os"
	"time"
)

// syncPeriod: how often the status manager resyncs every pod's status (and finishes the
// deletion of those whose resources are reclaimed). Patched in by gpu-portal's
// scripts/k8s_build.sh (it was a constant).
var syncPeriod = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KUBELET_STATUS_SYNC_PERIOD")); err == nil && d > 0 {
		return d
	}
	return 10 * time.Second
}()
GO
}

# Copies the vendored packages the plugin imports out of the source tree into PLUGIN_GOPATH.
# Asks `go list` for them with the plugin placed inside the tree, where vendor/ applies.
extract_plugin_deps() {
  local tree="$WORK/.go/src/k8s.io/kubernetes" tmp="$PLUGIN_GOPATH.tmp" path dir
  mkdir -p "$tree/cmd/fake-gpu-plugin"
  cp "$PLUGIN_SRC" "$tree/cmd/fake-gpu-plugin/main.go"
  rm -rf "$tmp"
  mkdir -p "$tmp/src"
  (cd "$tree" && go list -deps -f '{{if not .Standard}}{{.ImportPath}} {{.Dir}}{{end}}' ./cmd/fake-gpu-plugin) |
    while read -r path dir; do
      case $path in k8s.io/kubernetes/vendor/*) ;; *) continue ;; esac
      path=${path#k8s.io/kubernetes/vendor/}
      mkdir -p "$tmp/src/$path"
      find -L "$dir" -maxdepth 1 -type f ! -name '*_test.go' -exec cp -L {} "$tmp/src/$path/" \;
    done
  rm -rf "$tree/cmd/fake-gpu-plugin" "$PLUGIN_GOPATH"
  mv "$tmp" "$PLUGIN_GOPATH"
}

build_plugin() {
  local sha
  sha=$(plugin_sha)
  mkdir -p "$PLUGIN_GOPATH/src/fakegpu" "$BIN"
  cp "$PLUGIN_SRC" "$PLUGIN_GOPATH/src/fakegpu/main.go"
  (cd "$PLUGIN_GOPATH/src/fakegpu" &&
    GOPATH="$PLUGIN_GOPATH" GO111MODULE=off CGO_ENABLED=0 GOCACHE="$K8S_CACHE/fakegpu/cache" HOME="$K8S_CACHE/fakegpu" \
      go build -ldflags "-s -w" -o "$BIN/fake-gpu-plugin.tmp" . >&2)
  mv "$BIN/fake-gpu-plugin.tmp" "$BIN/fake-gpu-plugin"
  echo "$sha" >"$BIN/fake-gpu-plugin.sha256"
}

if ! have_all; then
  fetch_source
  # GOPATH mode, as Debian's own rules build it: the vendored tree, no module downloads.
  export GOPATH="$WORK/.go" GO111MODULE=off CGO_ENABLED=0 GOCACHE="$WORK/.cache"
  cd "$GOPATH/src/k8s.io/kubernetes"
  export HOME="$WORK/home"
  mkdir -p "$HOME" "$BIN"
  rm -f "$BIN/BUILD_INFO"
  patch_kubelet
  make generated_files >&2
  # The version the binaries report (kubectl version, the Node's kubeletVersion), as a release
  # build stamps it; without it they say v0.0.0-master.
  version=k8s.io/kubernetes/vendor/k8s.io/component-base/version
  ldflags="-s -w -X $version.gitVersion=v1.20.2 -X $version.gitMajor=1 -X $version.gitMinor=20"
  ldflags="$ldflags -X $version.gitTreeState=clean"
  for b in $BINARIES; do
    go build -ldflags "$ldflags" -o "$BIN/$b.tmp" "./cmd/$b" >&2
    mv "$BIN/$b.tmp" "$BIN/$b"
  done
  echo "$BUILD_INFO" >"$BIN/BUILD_INFO"
  extract_plugin_deps
  unset GOPATH GOCACHE
elif [ ! -d "$PLUGIN_GOPATH/src/google.golang.org/grpc" ]; then
  # Binaries from an older version of this script, which kept no packages for the plugin:
  # unpack the source again (a minute), but build nothing from it but the plugin.
  fetch_source
  (export GOPATH="$WORK/.go" GO111MODULE=off GOCACHE="$WORK/.cache" HOME="$WORK/home" && mkdir -p "$HOME" && extract_plugin_deps)
fi
cd /
rm -rf "$WORK"
build_plugin
have_all && plugin_current
echo "$BIN"
